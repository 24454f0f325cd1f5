"""The CPU demo: SFT warm start on scripted demonstrations, then GRPO, in the built-in harness.

  python -m experiments.train --config=experiments/configs/demo.py --workdir=/tmp/legorl_demo
"""

from experiments.configs import common


def get_config():
  c = common.base_config()
  c.model.preset = "tiny"
  c.tasks.difficulty = "hinted"
  c.harness.name = "builtin"
  c.sandbox.backend = "local"
  return c
