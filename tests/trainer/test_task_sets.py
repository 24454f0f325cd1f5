"""The three-way split of synthetic training bugs (``tasks.rl_bugs_percent``) and its held-out
sets: RL never draws a bug that has demonstrations, demonstrations never show an RL bug, and
each held-out set holds exactly its side's bugs under names no training task uses."""

import pytest

from experiments.configs import demo
from legorl_jax import errors
from legorl_jax.taskgen.synthetic.generator import bug_key
from legorl_jax.trainer import task_sets


def _cfg(percent=50):
  c = demo.get_config()
  c.tasks.num_train, c.tasks.num_val = 400, 16
  c.tasks.rl_bugs_percent = percent
  c.tasks.held_out = "names_rl"
  c.sft.num_demos, c.sft.check_demos = 64, 8
  return c


def test_split_keeps_rl_bugs_and_demo_bugs_apart():
  cfg = _cfg()
  loader, val, demo_tasks = task_sets.load_tasks(cfg)
  rl_tasks = loader.source
  rl_bugs, demo_bugs = {bug_key(t) for t in rl_tasks}, {bug_key(t) for t in demo_tasks}
  assert rl_bugs and demo_bugs and not rl_bugs & demo_bugs
  assert len(rl_tasks) + len(demo_tasks) == 400
  names_demo = task_sets.held_out_tasks(cfg, "names_demo")
  train_ids = {t.id for t in rl_tasks} | {t.id for t in demo_tasks}
  train_variants = {t.metadata.extra["variant"] for t in rl_tasks + demo_tasks}
  for held, side, other in ((val, rl_bugs, demo_bugs), (names_demo, demo_bugs, rl_bugs)):
    assert len(held) == 16
    for t in held:
      # A renamed variant (package, module, variable names) no training task uses.
      assert t.id not in train_ids and t.metadata.extra["variant"] not in train_variants
      # Every held-out bug is its side's (drawn from the whole bug space, not only those
      # that made it into num_train), never the other side's.
      assert task_sets.is_rl_bug(t, 50) == (side is rl_bugs)
      assert bug_key(t) not in other
  assert [t.id for t in task_sets.held_out_tasks(cfg, "names_rl")] == [t.id for t in val]


def test_without_the_split_rl_and_demos_share_the_training_tasks():
  cfg = _cfg(percent=0)
  cfg.tasks.held_out = "names"
  loader, _, demo_tasks = task_sets.load_tasks(cfg)
  assert [t.id for t in loader.source] == [t.id for t in demo_tasks]


@pytest.mark.parametrize("mode", ["names_rl", "names_demo"])
def test_split_sets_need_the_percent(mode):
  cfg = _cfg(percent=0)
  with pytest.raises(errors.ConfigError, match="rl_bugs_percent"):
    task_sets.held_out_tasks(cfg, mode)


def test_too_few_demonstration_tasks_is_a_clear_error():
  cfg = _cfg(percent=95)
  cfg.tasks.held_out = "names"
  cfg.sft.num_demos = 300
  with pytest.raises(errors.ConfigError, match="num_train"):
    task_sets.load_tasks(cfg)


def test_percent_out_of_range():
  with pytest.raises(errors.ConfigError, match="0 .*99"):
    task_sets.rl_bugs_percent(_cfg(percent=100))
