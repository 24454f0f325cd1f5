"""Pass-rate sampling over the RL pool (``trainer.pass_rate_sampler``) in the real
``rl_loop.RolloutSource``, on a toy pool whose bugs have known solve rates.

Trials are replaced by a stand-in for ``multihost.run_shared_trials`` whose outcome is a seeded
Bernoulli draw at the bug's true rate (0, 1, or in between), so the sampler sees what a run
would: noisy groups. Over a 40-step run of 8 tasks per step (as ``demo.py``) every bug RL can
move (0 < p < 1) must be visited at least 10 times, and visits must concentrate on them (more
than twice the others' mean); the shuffled loader, on the same pool, visits every bug alike.
"""

import collections
import json

import numpy as np
import pytest

from experiments.configs import demo_tiny
from legorl_jax import errors
from legorl_jax.rewards import status as st
from legorl_jax.rollout.trajectory import Segment, Trajectory
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.tasks.loader import TaskLoader
from legorl_jax.trainer import multihost, pass_rate_sampler, rl_loop
from legorl_jax.trainer.task_filter import task_key

MIXED_RATES = (0.15, 0.25, 0.35, 0.5, 0.5, 0.65, 0.75, 0.85)


class _Task:
  """A synthetic-looking task: bug ``b`` under renamed variant ``v`` (one bug key)."""

  def __init__(self, b, v, p):
    self.id, self.p = f"bug{b:02d}-v{v}", p
    self.metadata = type("M", (), {"source": "synthetic", "extra": {
        "template": f"tpl{b}", "function": "f", "family": "fam", "bug_line": b}})()


def _pool():
  rates = [0.0] * 8 + [1.0] * 8 + list(MIXED_RATES)
  return [_Task(b, v, p) for b, p in enumerate(rates) for v in range(2)]


def _fake_run(calls, sizes=None):
  sizes = [] if sizes is None else sizes

  def run(tasks, adapters, samples, proxy, trial_cfg, out_dir, *, concurrency, max_retries,
          on_result=None, seed_of=None, group_offset=0):
    calls.append([t.id for t in tasks])
    sizes.append(samples)
    out = []
    for g, task in enumerate(tasks):
      for s in range(samples if isinstance(samples, int) else samples[g]):
        solved = np.random.default_rng(seed_of(group_offset + g, s)).random() < task.p
        out.append(TrialResult(trial_id=f"{task.id}.{s}", task_id=task.id, harness="x",
                               status=st.SOLVED if solved else st.FAILED, reward=float(solved),
                               group=group_offset + g))
    return out
  return run


def _cfg(sampler="pass_rate"):
  c = demo_tiny.get_config()
  c.rollout.tasks_per_step, c.rollout.samples_per_task = 8, 8  # as demo.py
  c.rollout.sampler = sampler
  return c


def _source(cfg, tmp_path, tasks):
  return rl_loop.RolloutSource(TaskLoader(tasks, seed=0), lambda task, rng=None: "builtin", None,
                               None, cfg, str(tmp_path / "rollouts"))


def _visits(calls, tasks):
  bug_of = {t.id: task_key(t) for t in tasks}
  return collections.Counter(bug_of[i] for c in calls for i in c)


def test_visits_concentrate_on_bugs_rl_can_move(tmp_path, monkeypatch):
  tasks = _pool()
  movable = {task_key(t) for t in tasks if 0 < t.p < 1}
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  src = _source(_cfg(), tmp_path, tasks)
  for _ in range(40):
    got = src.collect()
  visits = _visits(calls, tasks)
  assert sum(visits.values()) == 320
  assert min(visits[k] for k in movable) >= 10, visits
  uniform = [visits[k] for k in {task_key(t) for t in tasks} - movable]
  assert np.mean([visits[k] for k in movable]) > 2 * np.mean(uniform)  # the loader: 1x
  # The per-step log: every bug's visits and rate; the metrics agree with the calls.
  lines = [json.loads(l) for l in open(tmp_path / "rollouts" / "pass_rate.jsonl")]
  assert [l["step"] for l in lines] == list(range(1, 41))
  assert {k: v["visits"] for k, v in lines[-1]["bugs"].items()} == {k: visits[k] for k in lines[-1]["bugs"]}
  assert got.metrics["pool_bugs"] == 24 and got.metrics["pool_visits_min"] == min(
      visits.get(k, 0) for k in lines[-1]["bugs"])
  # The estimates order the bugs as their true rates do (never-solved low, always-solved high).
  rates = {k: v["rate"] for k, v in lines[-1]["bugs"].items()}
  by_p = {task_key(t): t.p for t in tasks}
  assert max(r for k, r in rates.items() if by_p[k] == 0) < 0.1
  assert min(r for k, r in rates.items() if by_p[k] == 1) > 0.9


def test_the_shuffled_loader_spreads_visits_thin(tmp_path, monkeypatch):
  """The control: the same 40 steps drawn by the loader visit every bug alike (~320/24)."""
  tasks = _pool()
  movable = {task_key(t) for t in tasks if 0 < t.p < 1}
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  src = _source(_cfg("loader"), tmp_path, tasks)
  for _ in range(40):
    src.collect()
  visits = _visits(calls, tasks)
  uniform = [visits[k] for k in {task_key(t) for t in tasks} - movable]
  assert np.mean([visits[k] for k in movable]) < 1.5 * np.mean(uniform)


def test_resumed_sampler_draws_what_the_original_draws(tmp_path, monkeypatch):
  tasks = _pool()
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  src = _source(_cfg(), tmp_path, tasks)
  for _ in range(3):
    saved = src.collect().position
  src.collect()
  calls2 = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls2))
  again = _source(_cfg(), tmp_path / "again", tasks)
  again.load_state_dict(json.loads(json.dumps(saved)))  # through JSON, as the checkpoint
  again.next_step = 4
  again.collect()
  assert calls2[0] == calls[-1]


def _naive_estimate(prior, prior_groups, ema, rates):
  """The estimate as a weighted mean: the prior counts prior_groups groups, and every group's
  weight shrinks by (1 - ema) with each later group."""
  k = len(rates)
  w = [prior_groups * (1 - ema) ** k] + [(1 - ema) ** (k - 1 - i) for i in range(k)]
  return float(np.dot(w, [prior] + list(rates)) / np.sum(w))


def test_weights_and_estimates_by_hand():
  tasks = [_Task(b, 0, 0.5) for b in range(3)]
  keys = [task_key(t) for t in tasks]
  s = pass_rate_sampler.PassRateSampler(tasks, prior=0.5, ema=0.25, epsilon=0.01,
                                        weight="variance", priors={keys[0]: 0.0, keys[2]: 1.0})
  np.testing.assert_allclose(s.weights(), [0.01, 0.26, 0.01])
  for outcomes in ([1, 1, 1, 0], [1, 0], [0, 0, 0, 0]):
    s.record(tasks[1], outcomes)
  assert s.rate[keys[1]] == pytest.approx(_naive_estimate(0.5, 1.0, 0.25, [0.75, 0.5, 0.0]))
  s.record(tasks[0], [1, 0])
  assert s.rate[keys[0]] == pytest.approx(_naive_estimate(0.0, 1.0, 0.25, [0.5]))
  # "mixed": the chance that a group of n = 4 is mixed, 1 - p^4 - (1 - p)^4, + epsilon.
  m = pass_rate_sampler.PassRateSampler(tasks, epsilon=0.01, weight="mixed", group_size=4,
                                        priors={keys[0]: 0.0, keys[1]: 0.25, keys[2]: 1.0})
  np.testing.assert_allclose(m.weights(), [0.01, 1 - 0.25 ** 4 - 0.75 ** 4 + 0.01, 0.01])
  drawn = s.draw(3, step=1)
  assert sorted(t.id for t in drawn) == sorted(t.id for t in tasks)  # distinct bugs first
  assert all(v == 1 for v in s.visits.values())


def test_filter_and_sampler_together_is_refused(tmp_path):
  cfg = _cfg()
  cfg.rollout.difficulty_filter = True
  with pytest.raises(errors.ConfigError, match="difficulty_filter"):
    _source(cfg, tmp_path, _pool())
  cfg = _cfg("epochs")
  with pytest.raises(errors.ConfigError, match="rollout.sampler"):
    _source(cfg, tmp_path, _pool())


def test_priors_from_a_screen_json(tmp_path):
  path = tmp_path / "screen.json"
  path.write_text(json.dumps({"rows": [
      {"checkpoint": "a", "temperature": 0.6, "rank": 2, "bug_rates": {"x": 0.1}},
      {"checkpoint": "b", "temperature": 0.8, "rank": 1, "bug_rates": {"x": 0.4}}]}))
  assert pass_rate_sampler.priors_from_screen(str(path), "a", 0.6) == {"x": 0.1}
  assert pass_rate_sampler.priors_from_screen(str(path), "c", 0.6) == {"x": 0.4}  # top-ranked
  with pytest.raises(errors.ConfigError, match="screen"):
    pass_rate_sampler.priors_from_screen(str(tmp_path / "missing.json"))


def test_bugs_near_zero_get_bigger_groups_and_a_fair_baseline(tmp_path, monkeypatch):
  """rollout.pass_rate.near_zero: a bug estimated below it is run with near_zero_samples trials;
  the update takes its group whole (16 trials, none missing), the others at 8, each with its
  own GRPO baseline."""
  from legorl_jax.rl import advantages as adv_lib
  from legorl_jax.rollout import filters
  tasks = _pool()
  cfg = _cfg()
  cfg.rollout.tasks_per_step = 24  # every bug, so the low ones are surely drawn
  cfg.rollout.pass_rate.near_zero, cfg.rollout.pass_rate.near_zero_samples = 0.2, 16
  calls, sizes = [], []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls, sizes))
  src = _source(cfg, tmp_path, tasks)
  low = {task_key(t) for t in tasks if t.p == 0.15}
  for k in low:
    src.sampler.rate[k] = 0.05
  got = src.collect()
  drawn = [next(t for t in tasks if t.id == i) for i in calls[0]]
  assert sizes[0] == [16 if task_key(t) in low else 8 for t in drawn]
  assert got.metrics["groups_boosted"] == len(low) == 1
  assert sorted(set(got.group_sizes.values())) == [8, 16]
  for r in got.results:  # what the update needs of a trial: a recorded segment
    r.trajectory = Trajectory(segments=[Segment(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0, 0])])
  grouped = filters.prepare_groups(got.results, 16, cfg.rollout, sizes=got.group_sizes)
  assert grouped.dropped["missing"] == 0
  assert grouped.valid.sum() == len(got.results)
  # Against the unpadded groups: each group's advantages are those of its own trials alone.
  adv, mask = adv_lib.compute_advantages("grpo", grouped.rewards, grouped.valid,
                                         mask_broken_groups=False)
  for gi, group in enumerate(grouped.trials):
    real = [r for r in group if r is not None]
    ref, _ = adv_lib.compute_advantages("grpo", np.array([[r.reward for r in real]], np.float32))
    np.testing.assert_allclose(np.asarray(adv)[gi, :len(real)], np.asarray(ref)[0], atol=1e-6)
    assert np.all(np.asarray(mask)[gi, len(real):] == 0)
  _, bm = rl_loop.build_batches(got.results, cfg, 0, group_sizes=got.group_sizes)
  assert bm["trials_valid"] == len(got.results) and "dropped_missing" not in bm
  # Without the option every group is run with samples_per_task (an int, as before).
  cfg.rollout.pass_rate.near_zero = 0.0
  src2 = _source(cfg, tmp_path / "off", tasks)
  assert src2.collect().group_sizes is None and sizes[-1] == 8


def test_refill_rounds_draw_other_bugs(tmp_path, monkeypatch):
  """With dynamic sampling a step's later rounds draw bugs its earlier rounds did not."""
  tasks = _pool()
  cfg = _cfg()
  cfg.rollout.tasks_per_step, cfg.rollout.draw_tasks, cfg.rollout.max_draw_rounds = 8, 4, 3
  calls = []
  monkeypatch.setattr(multihost, "run_shared_trials", _fake_run(calls))
  src = _source(cfg, tmp_path, tasks)
  for k in src.sampler.keys:  # nothing looks mixed: every round runs
    src.sampler.rate[k] = 0.0
  got = src.collect()
  assert got.metrics["draw_rounds"] == 3 and len(calls) == 3
  bugs = [task_key(next(t for t in tasks if t.id == i)) for c in calls for i in c]
  assert len(bugs) == len(set(bugs)) == 12
