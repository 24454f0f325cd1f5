"""The tiny policy without the SFT warm start: RL from a random or given checkpoint (fast smoke runs)."""

from experiments.configs import common


def get_config():
  c = common.base_config()
  c.model.preset = "tiny"
  c.sft.steps = 0
  c.trainer.steps = 4
  c.rollout.tasks_per_step = 4
  c.rollout.samples_per_task = 4
  c.tasks.num_val = 16
  c.eval.samples = 2
  return c
