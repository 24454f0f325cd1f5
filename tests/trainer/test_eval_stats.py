"""Evaluation uncertainty: task-clustered standard errors and the paired before/after gain,
against naive recomputations."""

import numpy as np
import pytest

from legorl_jax.rollout.trial import TrialResult
from legorl_jax.trainer import eval_stats


def _results(table):
  """{task: [solved...]} -> TrialResults (one infrastructure failure added, to be ignored)."""
  out = [TrialResult(f"{t}.{i}", t, "x", "solved" if s else "failed", float(s))
         for t, row in table.items() for i, s in enumerate(row)]
  return out + [TrialResult("z.0", "t0", "x", "harness_error", 0.0)]


def test_solve_stats_against_naive():
  table = {"t0": [1, 1, 0, 0], "t1": [0, 0, 0, 0], "t2": [1, 1, 1, 1], "t3": [1, 0, 0, 0]}
  s = eval_stats.solve_stats(_results(table), k_values=(1, 4))
  rates = [np.mean(v) for v in table.values()]
  assert s["solve_rate"] == pytest.approx(7 / 16)
  assert s["solve_rate_se"] == pytest.approx(np.std(rates, ddof=1) / 2)
  assert s["n_tasks_mixed"] == 2 and s["n_trials"] == 16
  assert s["pass@4"] == pytest.approx(3 / 4)


def test_paired_difference_against_naive():
  before = {"a": [0, 0], "b": [1, 0], "c": [1, 1], "d": [0, 0]}
  after = {"a": [1, 0], "b": [1, 1], "c": [1, 1], "d": [0, 0], "e": [1, 1]}
  p = eval_stats.paired_difference(before, after)
  diffs = np.array([0.5, 0.5, 0.0, 0.0])
  assert p["n_tasks"] == 4  # "e" was not evaluated before
  assert p["delta"] == pytest.approx(diffs.mean())
  assert p["delta_se"] == pytest.approx(diffs.std(ddof=1) / 2)
  assert p["z"] == pytest.approx(diffs.mean() / (diffs.std(ddof=1) / 2))
  assert eval_stats.paired_difference({}, after)["delta"] is None
  assert eval_stats.paired_difference(before, before)["z"] is None  # SE 0: no z


def test_summary_fields_key_pattern():
  before = {"solve_rate": 0.25, "templates/solve_rate": 0.1,
            "outcomes": {"": {"a": [0, 1]}, "templates": {"b": [0, 0]}}}
  after = {"solve_rate": 0.75, "templates/solve_rate": 0.1,
           "outcomes": {"": {"a": [1, 1]}, "templates": {"b": [0, 0]}}}
  f = eval_stats.summary_fields(before, after, ("templates",), 2)
  assert f["val_solve_rate_before_rl"] == 0.25 and f["val_templates_solve_rate_after_rl"] == 0.1
  assert f["val_solve_rate_delta_rl"] == pytest.approx(0.5)
  assert f["val_templates_solve_rate_delta_rl"] == 0.0
  assert "val_pass@2_before_rl" in f and "val_templates_n_tasks_mixed_after_rl" in f
