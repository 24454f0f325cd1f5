"""The CPU demo at toy scale: the 1.8M-parameter ``tiny`` preset trained from scratch.

  python -m experiments.train --config=experiments/configs/demo_tiny.py --workdir=/tmp/legorl_tiny

The pipeline's fast configuration (the tests drive it with smaller counts): SFT warm start on
scripted demonstrations, then GRPO, in the built-in harness, in 11-17 minutes on 2 cores. It
exercises every phase but does not learn the held-out tasks (0.0 before and after RL in every
recorded run, BENCHMARKS.md): a policy trained from scratch never learns to copy names from its
prompt. ``demo.py`` is the demo that starts from a pretrained model.

Training tasks are renamed variants of the synthetic templates (``tasks.variants``), so the
policy cannot memorise file paths and lines and has to copy names from the instruction.
Held-out tasks are repositories under names no training task uses (``tasks.held_out =
"names"``). RL rows are packed two to three trajectories per 1024-token row, one update per step.
"""

from experiments.configs import common


def get_config():
  c = common.base_config()
  c.model.preset = "tiny"
  c.tasks.difficulty = "hinted"
  c.tasks.variants = 8
  c.tasks.num_train = 1000
  c.tasks.num_val = 48
  c.tasks.held_out = "names"
  c.harness.name = "builtin"
  c.sandbox.backend = "local"
  c.sft.num_demos = 320
  c.sft.steps = 300
  c.sft.check_demos = 32
  c.sft.check_every = 50
  c.sft.buckets = (512, 640)
  # Each SFT row: the ~280-token system prompt once, then eight demonstrations behind it
  # (two rows = 16 demonstrations per step); leftovers go to plain rows of sft.buckets.
  c.sft.share_prompt = (288, 272, 8, 2)
  c.sft.rows_per_batch = 2
  c.sft.micro_batches = 2
  c.trainer.pack = True
  c.trainer.buckets = (1024,)
  c.trainer.rows_per_batch = 40
  c.trainer.micro_batches = 2
  c.rollout.tasks_per_step = 8
  c.rollout.samples_per_task = 8
  c.trainer.steps = 10
  c.optim.learning_rate = 1e-3
  return c


# Command-line overrides that shrink this config to a run of a minute or two (a few SFT steps,
# 8 training tasks, groups of 2, short completions): the pipeline tests' run and the benchmarks
# that compare two such runs (``experiments/benchmarks/ray_train_parity.py``).
SMALL_RUN = ["--config.sft.steps=3", "--config.sft.num_demos=4", "--config.sft.rows_per_batch=4",
             "--config.sft.check_demos=2", "--config.sft.check_every=2",
             "--config.tasks.num_train=8", "--config.tasks.num_val=2", "--config.eval.samples=2",
             "--config.rollout.tasks_per_step=2", "--config.rollout.samples_per_task=2",
             "--config.rollout.concurrency=4", "--config.trainer.rows_per_batch=4",
             "--config.trainer.micro_batches=2", "--config.sampling.max_tokens=48",
             "--config.harness.max_turns=2", "--config.engine.max_batch=4"]
