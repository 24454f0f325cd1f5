"""The run report's tables, from hand-written metrics and trial records whose figures are worked
out by hand here (the pipeline's own figures are compared in ``test_pipeline.py``)."""

import json

import pytest

from legorl_jax.trainer import run_report


def _trial(phase, step, task, status, temperature=0.6):
  return {"phase": phase, "step": step, "task_id": task, "status": status,
          "temperature": temperature}


def _write(tmp_path, metrics, trials, samples=4):
  (tmp_path / "config.json").write_text(json.dumps({"eval": {"samples": samples},
                                                     "tasks": {"held_out": "names_rl"}}))
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
  (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))


def _evaluation(phase, step, solved_a, solved_b, greedy_a):
  """Task a solved in ``solved_a`` of 4 samples, task b in ``solved_b``; greedy solves a or not."""
  out = [_trial(phase, step, "a", "solved" if i < solved_a else "failed") for i in range(4)]
  out += [_trial(phase, step, "b", "solved" if i < solved_b else "failed") for i in range(4)]
  out += [_trial(phase, step, "a", "solved" if greedy_a else "failed", 0.0),
          _trial(phase, step, "b", "failed", 0.0)]
  return out


def test_evaluations_are_paired_against_before_and_a_redone_one_counts_once(tmp_path):
  templates_after = _evaluation("eval_after_rl_templates", 20, 2, 1, False)
  # An infrastructure failure says nothing about the policy: left out.
  templates_after[7]["status"] = "sandbox_error"  # task b's fourth sample
  trials = (_evaluation("eval_before_rl", 0, 1, 0, False)
            + _evaluation("eval_before_rl_templates", 0, 2, 2, True)
            + [_trial("rl", 1, "x", "solved")]
            + _evaluation("eval", 10, 2, 1, True)
            # The after-RL evaluation was cut (two records) and redone whole after a resume.
            + _evaluation("eval_after_rl", 20, 0, 0, False)[:2]
            + _evaluation("eval_after_rl", 20, 3, 1, True)
            + templates_after)
  _write(tmp_path, [], trials)
  rows = run_report.evaluation_rows(run_report.evaluations(trials, 4), 4)
  got = {(r["set"], r["step"]): r for r in rows}
  assert list(got) == [("main", 0), ("main", 10), ("main", 20), ("templates", 0), ("templates", 20)]
  before, mid, after = got["main", 0], got["main", 10], got["main", 20]
  assert before["solve_rate"] == 1 / 8 and before["greedy_solve_rate"] == 0.0
  assert before["n_tasks_mixed"] == 1 and "delta" not in before
  # pass@4 of task a with 1 of 4 solved is 1; of b, 0.
  assert before["pass@4"] == 0.5
  assert mid["solve_rate"] == 3 / 8 and mid["greedy_solve_rate"] == 0.5
  # Per-task differences at step 20: a 3/4 - 1/4 = 0.5, b 1/4 - 0 = 0.25; SE = std([.5, .25]) / sqrt 2.
  assert after["n_trials"] == 8 and after["delta"] == pytest.approx(0.375)
  assert after["delta_se"] == pytest.approx(0.125)
  assert after["z"] == pytest.approx(3.0)
  # Templates after: a 2/4, b 1/3 (its fourth trial was an infrastructure failure, excluded).
  tmpl = got["templates", 20]
  assert tmpl["n_trials"] == 7 and tmpl["solve_rate"] == pytest.approx(3 / 7)
  table = run_report.report(str(tmp_path))
  # Sampled after: per-task rates 3/4 and 1/4, task-clustered SE = std([.75, .25]) / sqrt 2 = .25.
  assert "| names_rl (main) | 20 | 8 | 50.0% (25.0) | +37.5 (12.5, z 3.00) | 50.0% | 100.0% | 2 |" in table


def test_step_table_keeps_the_last_record_of_a_redone_step(tmp_path):
  base = {"phase": "train", "trials": 64, "draw_rounds": 2, "tasks_drawn": 16, "groups_mixed": 4,
          "tasks_passed_never_solved": 3, "tasks_passed_always_solved": 1,
          "kl_to_start_k3": 0.0081, "entropy": 0.0234, "clip_low_frac": 0.0,
          "clip_high_frac": 0.01, "rollout_wall_s": 201.4, "learner_time_s": 70.2}
  metrics = [dict(base, step=1, solve_rate=0.25), dict(base, step=2, solve_rate=0.5),
             {"phase": "eval", "step": 2, "solve_rate": 0.9},
             dict(base, step=2, solve_rate=0.375)]  # step 2 again, after a resume
  _write(tmp_path, metrics, [])
  rows = run_report.step_rows(metrics)
  assert [(r["step"], r["solve_rate"]) for r in rows] == [(1, 0.25), (2, 0.375)]
  table = run_report.step_table(rows)
  assert "| 2 | 37.5% | 64 | 2 | 16 | 4 | 3 / 1 | 0.0081 | 0.023 | 0.000 / 0.010 | 201 | 70 |" in table
  # A metric a run did not log shows as "-", not as a made-up figure.
  assert run_report.step_table([{"step": 3, "solve_rate": 0.5}]).count(" - ") == len(
      run_report.STEP_COLUMNS) - 1


def test_reach_rows_count_bugs_solved_per_family_at_the_first_and_last_evaluation(tmp_path):
  def ev(phase, step, solved_by_bug):
    out = []
    for bug, k in solved_by_bug.items():
      for i in range(4):
        t = _trial(phase, step, f"{bug}/name", "solved" if i < k else "failed")
        out.append(dict(t, cluster=bug))
    return out
  # Two bugs of family "wrong_return" (never solved), two of "off_by_one" (one in reach), and a
  # task outside the synthetic bugs (no four-part key: "other").
  before = {"t:f:wrong_return:3": 0, "t:g:wrong_return:9": 0, "t:f:off_by_one:4": 1,
            "t:h:off_by_one:7": 0, "swe/1": 2}
  mid = dict(before, **{"t:h:off_by_one:7": 4})  # step 10: neither first nor last, not shown
  after = dict(before, **{"t:f:off_by_one:4": 3, "t:h:off_by_one:7": 1})
  trials = ev("eval_before_rl", 0, before) + ev("eval", 10, mid) + ev("eval_after_rl", 20, after)
  trials[0]["status"] = "sandbox_error"  # an infrastructure failure: not a trial of the policy
  rows = run_report.reach_rows(run_report.evaluations(trials, 4))
  got = {(r["step"], r["family"]): (r["bugs_solved"], r["bugs"], r["solved"], r["trials"])
         for r in rows}
  assert got == {(0, "off_by_one"): (1, 2, 1, 8), (0, "other"): (1, 1, 2, 4),
                 (0, "wrong_return"): (0, 2, 0, 7),
                 (20, "off_by_one"): (2, 2, 4, 8), (20, "other"): (1, 1, 2, 4),
                 (20, "wrong_return"): (0, 2, 0, 8)}
  _write(tmp_path, [], trials)
  assert "| names_rl (main) | 20 | off_by_one | 2 of 2 | 4 / 8 |" in run_report.report(str(tmp_path))
