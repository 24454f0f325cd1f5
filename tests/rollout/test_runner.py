"""The concurrent runner: infrastructure failures are retried, policy failures are not, and
trials.jsonl / summary.json account for every attempt."""

import json
import os
import threading

from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials, summarize
from legorl_jax.rollout.trial import TrialConfig, TrialResult
from legorl_jax.sandbox import SandboxConfig
from tests.rollout.conftest import ShellAdapter

def _lines(out_dir):
  with open(os.path.join(out_dir, "trials.jsonl")) as f:
    return [json.loads(l) for l in f]


def test_retries_only_infrastructure_failures(rollout_tasks, rollout_proxy, gold, tmp_path):
  fixer = ShellAdapter("fixer", 'git apply "$FIX"', gold)
  idle = ShellAdapter("idle", "true", gold)
  crasher = ShellAdapter("crasher", "exit 9", gold)
  jobs = [TrialJob(rollout_tasks[0], fixer, group=0), TrialJob(rollout_tasks[1], idle, group=1),
          TrialJob(rollout_tasks[2], crasher, group=2), TrialJob(rollout_tasks[0], idle, group=0)]
  seen, lock = [], threading.Lock()

  def on_result(r):
    with lock:
      seen.append(r.trial_id)

  cfg = TrialConfig(harness_timeout_s=60, sandbox=SandboxConfig(backend="local"))
  out = str(tmp_path / "run")
  results = run_trials(jobs, rollout_proxy, cfg, out, concurrency=3, max_retries=2,
                       on_result=on_result)
  assert [r.status for r in results] == [st.SOLVED, st.FAILED, st.HARNESS_ERROR, st.FAILED]
  assert [r.group for r in results] == [0, 1, 2, 0]
  assert [r.attempt for r in results] == [0, 0, 2, 0]  # only the crasher was retried (twice)
  assert sorted(seen) == sorted(r.trial_id for r in results)

  lines = _lines(out)
  assert len(lines) == 6  # 3 single attempts + 3 crasher attempts
  finals = [l for l in lines if l["final"]]
  assert sorted(l["trial_id"] for l in finals) == sorted(r.trial_id for r in results)
  crash = [l for l in lines if l["harness"] == "crasher"]
  assert [l["attempt"] for l in crash] == [0, 1, 2] and [l["final"] for l in crash] == [0, 0, 1]
  assert all(l["exit_code"] == 9 for l in crash)

  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  assert summary["n_trials"] == 4 and summary["n_solved"] == 1
  assert summary["solve_rate"] == 0.25 and abs(summary["solve_rate_valid"] - 1 / 3) < 1e-12
  assert summary["status_counts"] == {"failed": 2, "harness_error": 1, "solved": 1}
  assert summary["by_harness"]["idle"] == {"n_trials": 2, "solved": 0}
  assert summary["retries"] == 2


def test_summarize_by_hand():
  def r(status, harness="h", reward=0.0, attempt=0, turns=2):
    return TrialResult(trial_id=status, task_id="t", harness=harness, status=status,
                       reward=reward, attempt=attempt, turns=turns, sampled_tokens=10)
  rs = [r(st.SOLVED, reward=1.0), r(st.SOLVED, "g", reward=1.0), r(st.TIMEOUT),
        r(st.SANDBOX_ERROR, attempt=1)]
  s = summarize(rs)
  assert s["solve_rate"] == 0.5 and s["solve_rate_valid"] == 2 / 3
  assert s["mean_reward"] == 0.5 and s["retries"] == 1 and s["sampled_tokens"] == 40
  assert s["by_harness"] == {"h": {"n_trials": 3, "solved": 1}, "g": {"n_trials": 1, "solved": 1}}
  assert summarize([])["solve_rate"] == 0.0
