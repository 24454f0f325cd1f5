"""Dynamic sampling and the difficulty filter of ``rl_loop.RolloutSource``, and the KL probe.

The trials themselves are replaced by a stand-in for ``multihost.run_shared_trials`` whose
outcome is a fixed function of the task (some tasks always solved, some never, some mixed), so
the draw logic is checked against hand-counted expectations: how many rounds a step takes, that
every trial of every round is returned with distinct group ids and seeds, that the loader and
the filter state resume exactly, and that uniform tasks are passed over the next time.
"""

import collections

import numpy as np
import pytest

from experiments.configs import demo_tiny
from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.rewards import status as st
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.tasks.loader import TaskLoader
from legorl_jax.trainer import multihost, rl_loop, task_filter
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers


class _Task:
  """A task whose kind decides every trial: "solved", "failed" or "mixed" (every other sample)."""

  def __init__(self, i, kind):
    self.id, self.kind = f"t{i:03d}-{kind}", kind
    self.metadata = type("M", (), {"source": "test", "extra": {}})()


def _tasks(n=60):
  kinds = ("solved", "failed", "mixed")
  return [_Task(i, kinds[i % 3]) for i in range(n)]


def _fake_run(calls):
  def run(tasks, adapters, samples, proxy, trial_cfg, out_dir, *, concurrency, max_retries,
          on_result=None, seed_of=None, group_offset=0):
    calls.append({"tasks": [t.id for t in tasks], "out_dir": out_dir, "offset": group_offset})
    out = []
    for g, task in enumerate(tasks):
      for s in range(samples):
        solved = task.kind == "solved" or (task.kind == "mixed" and s % 2 == 0)
        out.append(TrialResult(trial_id=f"{task.id}.{s}", task_id=task.id, harness="x",
                               status=st.SOLVED if solved else st.FAILED, reward=float(solved),
                               group=group_offset + g))
        out[-1].seed = seed_of(group_offset + g, s)
    return out
  return run


def _cfg(rounds=1, draw=0, filt=False):
  c = demo_tiny.get_config()
  c.rollout.tasks_per_step, c.rollout.samples_per_task = 4, 4
  c.rollout.max_draw_rounds, c.rollout.draw_tasks = rounds, draw
  c.rollout.difficulty_filter = filt
  return c


def _source(cfg, tmp_path, tasks=None, seed=0):
  loader = TaskLoader(tasks or _tasks(), seed=seed)
  return rl_loop.RolloutSource(loader, lambda task, rng=None: "builtin", None, None, cfg,
                               str(tmp_path / "rollouts"))


def test_one_round_without_dynamic_sampling(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  got = _source(_cfg(), tmp_path).collect()
  assert len(calls) == 1 and len(calls[0]["tasks"]) == 4
  assert len(got.results) == 16 and got.metrics["draw_rounds"] == 1


def test_refill_rounds_until_enough_mixed_groups(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  src = _source(_cfg(rounds=6, draw=4), tmp_path)
  got = src.collect()
  order = [t.id for t in TaskLoader(_tasks(), seed=0).next_batch(40)]
  drawn = [t for c in calls for t in c["tasks"]]
  assert drawn == order[:len(drawn)]  # the loader's order, nothing skipped or repeated
  mixed_drawn = sum(t.endswith("mixed") for t in drawn)
  assert mixed_drawn >= 4 and sum(t.endswith("mixed") for t in drawn[:-len(calls[-1]["tasks"])]) < 4
  assert got.metrics["groups_mixed"] == mixed_drawn
  assert got.metrics["draw_rounds"] == len(calls) > 1
  assert got.metrics["tasks_drawn"] == len(drawn)
  # Every trial of every round comes back, with group ids that continue across rounds...
  assert len(got.results) == 4 * len(drawn)
  assert sorted({r.group for r in got.results}) == list(range(len(drawn)))
  assert [c["offset"] for c in calls] == list(np.cumsum([0] + [len(c["tasks"]) for c in calls])[:-1])
  # ... and seeds that differ between groups and samples.
  assert len({r.seed for r in got.results}) == len(got.results)
  assert calls[0]["out_dir"].endswith("step_00001") and calls[1]["out_dir"].endswith("round_1")
  # Zero-variance groups are then left out of the update by the existing filter.
  groups = collections.defaultdict(set)
  for r in got.results:
    groups[r.group].add(r.reward)
  assert sum(len(v) > 1 for v in groups.values()) == mixed_drawn


def test_rounds_stop_at_the_limit(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  only_uniform = [_Task(i, "solved" if i % 2 else "failed") for i in range(40)]
  got = _source(_cfg(rounds=3, draw=4), tmp_path, tasks=only_uniform).collect()
  assert len(calls) == 3 and got.metrics["groups_mixed"] == 0


def test_difficulty_filter_passes_over_uniform_tasks_and_resumes(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  tasks = _tasks(6)  # two of each kind: each is drawn again every 6 tasks
  cfg = _cfg(filt=True)
  cfg.rollout.tasks_per_step = 3
  src = _source(cfg, tmp_path, tasks=tasks)
  for _ in range(2):
    first = src.collect()  # one epoch of the loader: everything is new, nothing passed over
  assert first.metrics["tasks_passed_always_solved"] == first.metrics["tasks_passed_never_solved"] == 0
  saved = first.position
  third = src.collect()
  kinds = [t.split("-")[1] for t in calls[-1]["tasks"]]
  # Known uniform tasks are passed over while a mixed one is there to take.
  assert kinds.count("mixed") >= 2
  assert third.metrics["tasks_passed_always_solved"] + third.metrics["tasks_passed_never_solved"] > 0
  # A source restored from the saved position draws exactly what this one drew.
  calls2 = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls2))
  again = _source(cfg, tmp_path / "again", tasks=tasks)
  again.load_state_dict(saved)
  again.next_step = 3
  again.collect()
  assert calls2[0]["tasks"] == calls[-1]["tasks"]


def test_filter_probes_again_after_max_skips():
  f = task_filter.DifficultyFilter(window=2, max_skips=2)
  t = _Task(0, "solved")
  assert f.verdict(t) == "keep"
  f.record(t, [1, 1, 1])
  assert f.verdict(t) == "always_solved"
  f.passed_over(t)
  assert f.verdict(t) == "always_solved"
  f.passed_over(t)
  assert f.verdict(t) == "keep"  # probed again after two passes
  f.record(t, [1, 0, 0])
  assert f.verdict(t) == "keep"  # window mean 0.67
  g = task_filter.DifficultyFilter()
  g.load_state_dict(f.state_dict())
  assert g.rates == f.rates and g.skips == f.skips


def test_dynamic_sampling_refuses_multi_host(tmp_path, monkeypatch):
  monkeypatch.setattr(multihost, "multi_process", lambda: True)
  with pytest.raises(errors.ConfigError, match="single-process"):
    _source(_cfg(rounds=2), tmp_path)


def test_interrupted_step_with_refill_rounds_keeps_every_trial(tmp_path):
  step = tmp_path / "step_00002"
  (step / "round_1" / "t001-x.abc").mkdir(parents=True)
  (step / "t000-x.def").mkdir()
  (step / "trials.jsonl").write_text('{"trial_id": "t000-x.def", "status": "failed"}\n')
  recs = rl_loop.interrupted_records(str(step), [])
  by_id = {r["trial_id"]: r for r in recs}
  assert set(by_id) == {"t000-x.def", "t001-x.abc"}
  assert by_id["t000-x.def"]["status"] == "failed"
  assert by_id["t001-x.abc"]["status"] == st.HARNESS_ERROR
  assert by_id["t001-x.abc"]["dir"].endswith("step_00002.interrupted/round_1")
  assert all(r["interrupted"] for r in recs)


def test_kl_probe_is_zero_at_the_start_and_grows(tmp_path):
  cfg = helpers.make_cfg(loss="grpo")
  cfg.trainer.trainable = "all"
  learner = Learner(create_model(helpers.CFG, seed=0), cfg)
  batch = helpers.make_batch(b=4, seed=1)
  probe = rl_loop.KLProbe(str(tmp_path / "probe.npz"))
  probe.ensure(learner, [batch])
  kl0 = probe.measure(learner)
  assert abs(kl0["kl_to_start_k1"]) < 1e-6 and abs(kl0["kl_to_start_k3"]) < 1e-9
  for _ in range(3):
    learner.update([batch])
  kl = probe.measure(learner)
  # Against a naive recomputation from the saved start logprobs.
  mask = batch["loss_mask"] > 0
  d = (learner.logprobs(batch)[0] - probe.start_logp)[mask].astype(np.float64)
  assert kl["kl_to_start_k3"] == pytest.approx(np.mean(np.exp(d) - 1 - d), rel=1e-9)
  assert kl["kl_to_start_k3"] > 1e-6
  reloaded = rl_loop.KLProbe(str(tmp_path / "probe.npz"))  # a resumed run measures the same
  assert reloaded.measure(learner) == kl
