"""Cloud TPU v5p-32: 4 hosts x 4 chips (16 chips, 95 GiB HBM each). Qwen3-8B, FSDP 8 x tensor 2.

  bash experiments/tpu/launch.sh v5p-32 --workdir=gs://BUCKET/runs/v5p32

Four JAX processes (one per host) join with ``jax.distributed.initialize()`` (arguments come
from the slice's metadata). Each host runs its share of the trial groups on its own CPUs and
feeds its rows of every global batch; checkpoints go to the ``gs://`` workdir.
"""

from experiments.tpu import slices


def get_config():
  c = slices.tpu_config("v5p-32")
  c.model.preset = "qwen3-8b"
  c.model.remat = True
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 8, 2
  c.rollout.tasks_per_step = 32        # 8 groups per host
  c.rollout.samples_per_task = 8       # 256 trials a step, 64 per host
  c.rollout.concurrency = 64           # per host
  c.trainer.rows_per_batch = 64        # global rows per update: 16 per host, 8 per batch shard
  c.trainer.micro_batches = 8
  c.engine.max_batch = 64
  c.optim.learning_rate = 1e-6
  return c
