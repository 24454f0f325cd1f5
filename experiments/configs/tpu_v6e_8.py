"""Cloud TPU v6e-8 (Trillium): one host, 8 chips x 32 GiB HBM. Qwen3-1.7B, FSDP 4 x tensor 2.

  bash experiments/tpu/launch.sh v6e-8 --workdir=gs://BUCKET/runs/v6e8

Twice the HBM of v5e lets the sampler keep a larger KV cache (more concurrent trials).
"""

from experiments.tpu import slices


def get_config():
  c = slices.tpu_config("v6e-8")
  c.model.preset = "qwen3-1.7b"
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 4, 2
  c.rollout.tasks_per_step = 16
  c.rollout.samples_per_task = 8       # 128 trials a step
  c.rollout.concurrency = 96
  c.trainer.rows_per_batch = 32
  c.trainer.micro_batches = 4
  c.engine.max_batch = 96
  return c
