"""Issue 44's evaluation: standard errors clustered by bug (against a hand computation), the
paired gain along the run, and the 32-bug main held-out set (one task per RL-pool bug, under
names no training task uses)."""

import math

import pytest

from experiments.configs import rl_long
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.taskgen.synthetic.generator import bug_key
from legorl_jax.trainer import eval_stats, pipeline, task_sets


def _results(table):
  return [TrialResult(f"{t}.{i}", t, "x", "solved" if s else "failed", float(s))
          for t, row in table.items() for i, s in enumerate(row)]


# t1 and t2 are one bug under two names (cluster A); t3 (B) and t4 (C) are bugs of their own.
CLUSTERS = {"t1": "A", "t2": "A", "t3": "B", "t4": "C"}


def test_clustered_se_by_hand():
  """Rates x = (1/2, 1/4, 1, 0) over w = (4, 4, 2, 2) trials: mean 5/12. Cluster residuals
  sum_i w_i (x_i - 5/12): A = 4 (1/12) + 4 (-2/12) = -1/3, B = 2 (7/12) = 7/6, C = 2 (-5/12)
  = -5/6; their squares add to 13/6; var = 3/2 * (13/6) / 12^2 = 13/576, SE = sqrt(13)/24."""
  table = {"t1": [1, 1, 0, 0], "t2": [1, 0, 0, 0], "t3": [1, 1], "t4": [0, 0]}
  s = eval_stats.solve_stats(_results(table), cluster_of=CLUSTERS)
  assert s["solve_rate"] == pytest.approx(5 / 12)
  assert s["solve_rate_se"] == pytest.approx(math.sqrt(13) / 24, rel=1e-12)
  assert s["n_clusters"] == 3
  # Without clusters every task is its own: with equal trial counts that is the old
  # std(per-task rates, ddof=1) / sqrt(tasks).
  even = {"t1": [1, 1, 0, 0], "t2": [1, 0, 0, 0], "t3": [1, 1, 1, 1], "t4": [0, 0, 0, 0]}
  rates = [0.5, 0.25, 1.0, 0.0]
  m = sum(rates) / 4
  by_task = math.sqrt(sum((r - m) ** 2 for r in rates) / 3) / 2
  assert eval_stats.solve_stats(_results(even))["solve_rate_se"] == pytest.approx(by_task, rel=1e-12)


def test_paired_gain_clustered_by_hand():
  """Per-task differences D = (1/2, 0, 1, -1/2), w = (4, 4, 2, 2): delta = 3/12 = 1/4.
  Residuals: A = 4 (1/4) + 4 (-1/4) = 0, B = 2 (3/4) = 3/2, C = 2 (-3/4) = -3/2; squares add to
  9/2; var = 3/2 * (9/2) / 144 = 3/64, SE = sqrt(3)/8, z = 2/sqrt(3)."""
  before = {"t1": [0, 0, 0, 0], "t2": [1, 0, 0, 0], "t3": [0, 0], "t4": [1, 0]}
  after = {"t1": [1, 1, 0, 0], "t2": [1, 0, 0, 0], "t3": [1, 1], "t4": [0, 0]}
  p = eval_stats.paired_difference(before, after, CLUSTERS)
  assert p["delta"] == pytest.approx(0.25)
  assert p["delta_se"] == pytest.approx(math.sqrt(3) / 8, rel=1e-12)
  assert p["z"] == pytest.approx(2 / math.sqrt(3))
  assert p["n_tasks"] == 4 and p["n_clusters"] == 3
  # The evaluations along the run report the same figures, per set.
  ev0 = {"outcomes": {"": before, "templates": before}, "clusters": {"": CLUSTERS}}
  ev = {"outcomes": {"": after, "templates": after}}
  f = eval_stats.paired_figures(ev0, ev, ("", "templates"))
  assert f["solve_rate_delta_se"] == pytest.approx(math.sqrt(3) / 8)
  assert f["templates/solve_rate_delta"] == pytest.approx(0.25)
  assert f["templates/solve_rate_delta_se"] != f["solve_rate_delta_se"]  # by task there
  assert "clusters" not in pipeline.scalars({"clusters": {}, "outcomes": {}, "solve_rate": 0.5})


def test_one_cluster_has_no_se():
  assert eval_stats.clustered_se([0.1, 0.9], [1, 1], ["a", "a"]) == 0.0


def test_the_32_bug_main_set():
  cfg = rl_long.get_config()
  cfg.tasks.num_val, cfg.tasks.held_out_distinct_bugs = 32, True
  val = task_sets.held_out_tasks(cfg)
  loader, _, demo_tasks = task_sets.load_tasks(cfg)
  rl_bugs = {bug_key(t) for t in loader.source}
  assert len(val) == 32 and len({bug_key(t) for t in val}) == 32
  assert {bug_key(t) for t in val} <= rl_bugs  # RL-pool bugs...
  train_ids = {t.id for t in loader.source} | {t.id for t in demo_tasks}
  assert not {t.id for t in val} & train_ids  # ... under names no training task uses
  # The option off: the set is what it was (the first tasks of the same seeded draw).
  cfg.tasks.held_out_distinct_bugs = False
  assert len(task_sets.held_out_tasks(cfg)) == 32


def test_the_report_clusters_as_the_pipeline_does():
  """``experiments.report`` rebuilds the clustered figures from the records' ``cluster`` field,
  and reads the other sets' evaluations along the run (``eval_MODE`` with eval.every_all_sets)."""
  from legorl_jax.trainer import run_report

  def records(phase, step, table):
    return [{"phase": phase, "step": step, "task_id": t, "status": "solved" if s else "failed",
             "temperature": 0.6, "cluster": CLUSTERS[t]} for t, row in table.items() for s in row]

  before = {"t1": [0, 0, 0, 0], "t2": [1, 0, 0, 0], "t3": [0, 0], "t4": [1, 0]}
  after = {"t1": [1, 1, 0, 0], "t2": [1, 0, 0, 0], "t3": [1, 1], "t4": [0, 0]}
  trials = (records("eval_before_rl", 0, before) + records("eval", 10, after)
            + records("eval_before_rl_templates", 0, before) + records("eval_templates", 10, after))
  rows = run_report.evaluation_rows(run_report.evaluations(trials, 4), 4)
  got = {(r["set"], r["step"]): r for r in rows}
  assert sorted(got) == [("main", 0), ("main", 10), ("templates", 0), ("templates", 10)]
  for name in ("main", "templates"):
    assert got[(name, 10)]["delta_se"] == pytest.approx(math.sqrt(3) / 8)
    assert got[(name, 10)]["solve_rate_se"] == pytest.approx(math.sqrt(13) / 24)


def test_the_gain_is_said_plainly():
  s = {"val_solve_rate_delta_rl": 0.16, "val_solve_rate_delta_se_rl": 0.05,
       "val_solve_rate_delta_z_rl": 3.2, "val_tasks": 32,
       "val_names_demo_solve_rate_delta_rl": -0.02, "val_names_demo_solve_rate_delta_se_rl": 0.04,
       "val_names_demo_solve_rate_delta_z_rl": -0.5}
  assert eval_stats.gain_sentence(s) == ("main held-out set: paired gain +16.0 points (SE 5.0, "
                                         "z 3.20) over 32 tasks: significant at z >= 2.")
  assert "NOT significant" in eval_stats.gain_sentence(s, "names_demo")
  assert eval_stats.gain_sentence({"val_solve_rate_delta_rl": None}) is None


def test_the_names_demo_guard_and_the_pool_table():
  from legorl_jax.trainer import run_report
  assert "within" in eval_stats.guard_sentence({"val_names_demo_solve_rate_delta_rl": -0.05})
  assert "BEYOND" in eval_stats.guard_sentence({"val_names_demo_solve_rate_delta_rl": -0.0625})
  assert eval_stats.guard_sentence({}) is None
  recs = [{"step": 1, "bugs": {}},
          {"step": 40, "bugs": {"a": {"visits": 12, "rate": 0.4}, "b": {"visits": 9, "rate": 0.6},
                                "c": {"visits": 3, "rate": 0.0}, "d": {"visits": 0, "rate": 0.5}}}]
  lines = run_report.pool_table(recs).splitlines()
  assert lines[0] == ("After step 40: 3 of 4 bugs visited; 1 of the 3 in reach (estimate "
                      "0.05-0.95) visited >= 10 times.")
  assert [l.split("|")[1].strip() for l in lines[4:]] == ["a", "b", "c", "d"]
