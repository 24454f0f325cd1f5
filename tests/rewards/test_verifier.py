"""The verifier on real synthetic tasks in the local sandbox (Docker parity: tests/sandbox)."""

import dataclasses

import pytest

from legorl_jax.rewards import status as st
from legorl_jax.rewards.verifier import verify
from legorl_jax.sandbox import SandboxConfig, create_sandbox
from legorl_jax.sandbox.local import bwrap_path
from legorl_jax.tasks.schema import Task
from legorl_jax.taskgen.synthetic import generate_tasks

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap not installed (.ci/setup_system.sh)")


@pytest.fixture(scope="module")
def tasks():
  return generate_tasks(3, seed=11)


def _run(task, action, **kw):
  with create_sandbox(task, SandboxConfig()) as sb:
    action(sb)
    return verify(sb, **kw)


def test_gold_none_and_hacks(tasks):
  for task in tasks:
    gold = _run(task, lambda sb: sb.apply_patch(task.gold_patch))
    assert (gold.status, gold.reward) == (st.SOLVED, 1.0), gold
    assert set(gold.fail_to_pass.values()) == {"passed"} and gold.changed_paths
    none = _run(task, lambda sb: None)
    assert (none.status, none.reward) == (st.FAILED, 0.0)
    assert set(none.fail_to_pass.values()) <= {"failed", "error"} and set(none.pass_to_pass.values()) == {"passed"}
    visible = [p for p in task.verifier.test_files if p not in task.hidden_tests]
    for hack in (lambda sb: sb.exec(f"rm {visible[0]}"),
                 lambda sb: sb.write_file("conftest.py", "collect_ignore_glob = ['*']\n"),
                 lambda sb: (sb.apply_patch(task.gold_patch), sb.write_file(next(iter(task.hidden_tests)), "\n"))):
      res = _run(task, hack)
      assert (res.status, res.reward) == (st.REWARD_HACK, 0.0) and res.hacks, res


def test_verifier_timing_partial_credit_and_timeouts(tasks):
  task = tasks[0]
  res = _run(task, lambda sb: sb.apply_patch(task.gold_patch))
  assert res.tests_duration_s < 5.0  # one short process (tens of ms when the machine is idle)
  partial = _run(task, lambda sb: None, partial_credit=True)
  n = len(task.test_ids)
  assert partial.reward == 0.0  # no FAIL_TO_PASS test passes: no credit
  module = task.metadata.extra["module"]
  pkg = task.gold_patch.split("a/", 1)[1].split("/", 1)[0]
  hang = _run(task, lambda sb: sb.write_file(f"{pkg}/{module}.py", "while True:\n    pass\n"), timeout_s=1.5)
  assert hang.status == st.FAILED and hang.timed_out and hang.reward == 0.0
  assert n > 1


def test_infrastructure_failures_have_their_own_status(tasks):
  # pytest refuses an unknown option before it runs a test: no JUnit report is written.
  broken = dataclasses.replace(tasks[0], verifier=dataclasses.replace(
      tasks[0].verifier, kind="pytest", command="--no-such-option"))
  res = _run(broken, lambda sb: sb.exec("true"))
  assert res.status == st.VERIFIER_ERROR and "junit" in res.error
  assert st.is_infrastructure(res.status) and not st.is_infrastructure(st.REWARD_HACK)


def test_one_bad_task_does_not_stop_a_run(tasks, tmp_path):
  bad = Task.from_dict({"id": "bad", "repo": {"type": "dir", "path": str(tmp_path / "missing")},
                        "instruction": "i", "hidden_tests": {"t.py": ""}})
  statuses = []
  for task in [bad, tasks[1]]:
    try:
      with create_sandbox(task, SandboxConfig()) as sb:
        sb.apply_patch(task.gold_patch)
        statuses.append(verify(sb).status)
    except Exception as e:  # noqa: BLE001 - what a trial runner does per trial
      statuses.append(type(e).__name__)
  assert statuses == ["TaskError", st.SOLVED]
