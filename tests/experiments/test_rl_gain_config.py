"""``experiments/configs/rl_gain.py`` (issue 44) is a valid config whose held-out sets are what
its docstring says: a 32-bug main set of RL-pool bugs, and the two sets beside it."""

from experiments.configs import rl_gain
from legorl_jax.taskgen.synthetic.generator import bug_key
from legorl_jax.trainer import config_check, screen, task_sets


def test_rl_gain_config():
  cfg = rl_gain.get_config()
  config_check.validate(cfg)
  assert screen.save_at_steps(cfg) == {20, 40, 80, 160}
  loader, val, _ = task_sets.load_tasks(cfg)
  assert len(val) == 32 and len({bug_key(t) for t in val}) == 32
  assert {bug_key(t) for t in val} <= {bug_key(t) for t in loader.source}
  extra = task_sets.extra_held_out_sets(cfg)
  assert set(extra) == {"names_demo", "templates"}
  assert len({bug_key(t) for t in extra["names_demo"]}) == 32
