"""One process of the two-process RL test (``tests/sharding/test_multihost_rl.py``).

  python -m tests.sharding.multihost_rl_worker PROCESS_ID NUM_PROCESSES PORT WORKDIR

Run with ``JAX_PLATFORMS=cpu`` and ``XLA_FLAGS=--xla_force_host_platform_device_count=4``:
the processes join one ``jax.distributed`` group and run ``pipeline.run`` on the same
config and workdir: evaluation before RL and one RL step, each host running its share of the
trials (built-in harness, local sandbox, the tiny policy), one update over the global batch.
"""

import sys

from legorl_jax.sharding import distributed


def config():
  from experiments.configs import common
  c = common.base_config()
  c.model.preset = "tiny"
  c.tasks.difficulty = "hinted"
  c.tasks.num_train, c.tasks.num_val = 4, 2
  c.harness.name, c.harness.max_turns = "builtin", 2
  c.sandbox.backend = "local"
  c.sampling.max_tokens = 24
  c.engine.max_batch = 4
  c.rollout.tasks_per_step, c.rollout.samples_per_task, c.rollout.concurrency = 2, 2, 2
  c.trainer.steps, c.trainer.rows_per_batch, c.trainer.micro_batches = 1, 8, 2
  c.loss.entropy_coef = 0.01     # a gradient even when every trial fails (zero advantages)
  c.optim.learning_rate, c.optim.eps = 1e-3, 1e-3
  # Hosts on the data axis (each host's 4 devices: fsdp). With fsdp spanning the two
  # processes, XLA:CPU's gloo collectives inside the step can run in different orders on the
  # two processes and abort; TPU slices do not use gloo.
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 4, 1
  c.sft.steps = 0
  c.eval.samples, c.eval.greedy = 1, False
  c.checkpoint.every = 1
  return c


def main(process_id: int, num_processes: int, port: int, workdir: str):
  assert distributed.maybe_initialize(f"127.0.0.1:{port}", num_processes, process_id,
                                      initialization_timeout=120)
  import jax
  from legorl_jax.trainer import pipeline

  assert jax.process_count() == num_processes
  pipeline.run(config(), workdir)
  print(f"process {process_id}: ok", flush=True)


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
