"""One trial, every way it can end: the status, reward and record are right each time."""

import json
import os

import pytest

from legorl_jax.rewards import status as st
from legorl_jax.rollout.trial import TrialConfig, run_trial
from legorl_jax.sandbox import SandboxConfig
from tests.rollout.conftest import ShellAdapter

CALL_PROXY = r"""python3 - <<'EOF'
import json, os, urllib.request
body = {"model": "policy", "messages": [{"role": "user", "content": open(os.environ["TASK_FILE"]).read()}]}
req = urllib.request.Request(os.environ["BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["TOKEN"]})
print(json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"][:80])
EOF
git apply "$FIX"
"""


def _run(task, adapter, proxy, tmp_path, **cfg):
  sandbox = cfg.pop("sandbox", SandboxConfig(backend="local"))
  return run_trial(task, adapter, proxy, TrialConfig(sandbox=sandbox, **cfg), str(tmp_path))


@pytest.mark.parametrize("script,want,reward", [
    ('git apply "$FIX"', st.SOLVED, 1.0),
    ("true", st.FAILED, 0.0),
    ("echo boom >&2; exit 3", st.HARNESS_ERROR, 0.0),
    ("echo '{\"error\": {\"code\": \"context_length_exceeded\"}}'; exit 1", st.OVERLONG, 0.0),
])
def test_status_from_harness_outcome(rollout_tasks, rollout_proxy, gold, tmp_path, script, want,
                                     reward):
  task = rollout_tasks[0]
  res = _run(task, ShellAdapter("sh", script, gold), rollout_proxy, tmp_path, harness_timeout_s=60)
  assert (res.status, res.reward) == (want, reward), res.error
  assert res.task_id == task.id and res.harness == "sh"
  if want == st.HARNESS_ERROR:
    assert res.exit_code == 3 and "boom" in res.error and res.infrastructure_failure
  else:
    assert not res.infrastructure_failure
  # every trial has a record and logs, and the verifier ran whenever the sandbox existed
  assert res.verifier and {"sandbox_s", "harness_s", "verify_s", "total_s"} <= set(res.durations)
  with open(res.log_paths["task.md"]) as f:
    assert f.read() == task.instruction


def test_timeout(rollout_tasks, rollout_proxy, gold, tmp_path):
  res = _run(rollout_tasks[0], ShellAdapter("sh", "sleep 60", gold), rollout_proxy, tmp_path,
             harness_timeout_s=1.5)
  assert res.status == st.TIMEOUT and res.reward == 0.0
  assert res.harness_status == "timeout" and res.durations["harness_s"] < 30


def test_sandbox_error(rollout_tasks, rollout_proxy, tmp_path):
  res = _run(rollout_tasks[0], ShellAdapter("sh", "true"), rollout_proxy, tmp_path,
             sandbox=SandboxConfig(backend="no-such-backend"))
  assert res.status == st.SANDBOX_ERROR and "no-such-backend" in res.error
  assert res.infrastructure_failure


def test_recording_and_record(rollout_tasks, rollout_proxy, gold, tmp_path):
  task = rollout_tasks[1]
  res = _run(task, ShellAdapter("sh", CALL_PROXY, gold), rollout_proxy, tmp_path)
  assert res.status == st.SOLVED, res.error
  traj = res.trajectory
  assert len(traj.calls) == 1 == res.turns
  assert res.prompt_tokens == len(traj.calls[0].prompt_ids) > 0
  assert res.sampled_tokens == len(traj.calls[0].token_ids) > 0
  assert res.params_versions == [0]
  # the session is gone from the proxy; the trajectory is on disk, as the typed one's JSON
  assert traj.session_id not in rollout_proxy.sessions
  with open(res.trajectory_path) as f:
    assert json.load(f) == traj.to_json()
  line = res.record()
  assert "trajectory" not in line and json.loads(json.dumps(line)) == line
  assert os.path.isfile(line["log_paths"]["stdout"])
