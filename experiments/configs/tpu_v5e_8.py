"""Cloud TPU v5e-8 (``v5litepod-8``): one host, 8 chips x 16 GiB HBM. Qwen3-1.7B, FSDP over 8.

  bash experiments/tpu/launch.sh v5e-8 --workdir=gs://BUCKET/runs/v5e8
  # on the VM itself:
  python -m experiments.train --config=experiments/configs/tpu_v5e_8.py --workdir=gs://BUCKET/runs/v5e8

One host drives every chip, so there is a single JAX process; its 224 vCPUs run the sandboxes.
"""

from experiments.tpu import slices


def get_config():
  c = slices.tpu_config("v5e-8")
  c.model.preset = "qwen3-1.7b"
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 8, 1
  c.rollout.tasks_per_step = 16
  c.rollout.samples_per_task = 8       # 128 trials a step
  c.rollout.concurrency = 64           # sandboxes in flight on the host
  c.trainer.rows_per_batch = 32        # rows per update (all hosts together)
  c.trainer.micro_batches = 4          # 8 rows (1 per chip) of up to 8k tokens per micro-batch
  c.engine.max_batch = 64
  return c
