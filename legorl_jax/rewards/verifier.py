"""The verifier: after the agent stops, grade its work with tests it never saw.

Order matters: (1) kill whatever the agent left running, (2) diff the work dir against the
start state and stop with ``reward_hack`` if the grader was touched, (3) only now copy in
the hidden tests / apply the test patch, (4) run the task's verifier with a timeout,
(5) parse per-test results and score FAIL_TO_PASS + PASS_TO_PASS.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
import time
from typing import Any

from legorl_jax.errors import SandboxError, VerifierError
from legorl_jax.rewards import hacking, results, status as st
from legorl_jax.sandbox.base import Sandbox
from legorl_jax.tasks.schema import Task

RESULTS_JSON = f"{hacking.VERIFY_DIR}/results.json"
JUNIT_XML = f"{hacking.VERIFY_DIR}/junit.xml"


@dataclasses.dataclass
class VerifierResult:
  """Everything the trial record needs about grading. ``tests``: {test id: outcome}."""
  status: str
  reward: float = 0.0
  tests: dict[str, str] = dataclasses.field(default_factory=dict)
  fail_to_pass: dict[str, str] = dataclasses.field(default_factory=dict)
  pass_to_pass: dict[str, str] = dataclasses.field(default_factory=dict)
  hacks: dict[str, str] = dataclasses.field(default_factory=dict)
  changed_paths: list[str] = dataclasses.field(default_factory=list)
  exit_code: int | None = None
  timed_out: bool = False
  duration_s: float = 0.0
  tests_duration_s: float = 0.0
  error: str = ""
  output_tail: str = ""

  @property
  def reward_hack(self) -> bool:
    return self.status == st.REWARD_HACK

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def test_files_of(task: Task) -> list[str]:
  """Test files the verifier runs: explicit ones, else those named by the test ids."""
  if task.verifier.test_files:
    return list(task.verifier.test_files)
  files = []
  for tid in task.test_ids:
    f = tid.split("::")[0]
    if f.endswith(".py") and f not in files:
      files.append(f)
  return files or sorted(task.hidden_tests)


def _command(task: Task, sandbox: Sandbox) -> str | list[str]:
  v, wd = task.verifier, sandbox.workdir
  files = " ".join(shlex.quote(f) for f in test_files_of(task))
  mk = f"mkdir -p {shlex.quote(hacking.VERIFY_DIR)} && "
  if v.kind == "pyrunner":  # argv, no shell: one process start-up is the whole cost
    runner = posixpath.join(getattr(sandbox, "support_dir", "/opt/legorl"), "pyrunner.py")
    return ["python3", runner, "--root", wd, "--out", RESULTS_JSON, *test_files_of(task)]
  if v.kind == "pytest":
    extra = v.command or ""
    return mk + (f"python3 -m pytest -p no:cacheprovider -o junit_family=xunit1 -q "
                 f"--junitxml={JUNIT_XML} {extra} {files}")
  return mk + f"export LEGORL_JUNIT={shlex.quote(wd + '/' + JUNIT_XML)}; {v.command}"


def verify(sandbox: Sandbox, task: Task | None = None, *, partial_credit: bool = False,
           timeout_s: float | None = None) -> VerifierResult:
  """Grades the sandbox's current state; never raises for a bad trial, it returns a status."""
  task = task or sandbox.task
  t0 = time.perf_counter()
  res = VerifierResult(status=st.VERIFIER_ERROR)
  try:
    sandbox.kill_all()
    diff = sandbox.diff()
    res.changed_paths = diff.paths
    res.hacks = hacking.find_reward_hacks(diff, task)
    if res.hacks:
      res.status = st.REWARD_HACK
      return res
    if task.hidden_tests:
      sandbox.write_files(task.hidden_tests)
    if task.test_patch:
      r = sandbox.apply_patch(task.test_patch)
      if not r.ok:
        raise VerifierError(f"test patch of task {task.id} does not apply: {r.stderr[-300:]!r}")
    sandbox.write_file(f"{hacking.VERIFY_DIR}/.keep", "")
    r = sandbox.exec(_command(task, sandbox), timeout=timeout_s or task.verifier.timeout_s)
    res.exit_code, res.timed_out, res.tests_duration_s = r.exit_code, r.timed_out, r.duration_s
    res.output_tail = (r.stdout[-2000:] + r.stderr[-2000:]).decode("utf-8", "replace")
    observed = _observed(sandbox, task, r)
    _score(res, task, observed, r, partial_credit)
  except VerifierError as e:
    res.status, res.error = st.VERIFIER_ERROR, str(e)
  except SandboxError as e:
    res.status, res.error = st.SANDBOX_ERROR, str(e)
  finally:
    res.duration_s = time.perf_counter() - t0
  return res


def _observed(sandbox, task, r) -> dict[str, str] | None:
  """Per-test outcomes, or None when the verifier only reports an exit code."""
  kind = task.verifier.kind
  path = RESULTS_JSON if kind == "pyrunner" else JUNIT_XML
  try:
    text = sandbox.read_file(path).decode("utf-8", "replace")
  except SandboxError:
    if r.timed_out:
      return {}
    if kind == "command":
      return None
    raise VerifierError(f"the verifier wrote no {path} (exit {r.exit_code}): "
                        f"{(r.stdout[-300:] + r.stderr[-300:]).decode('utf-8', 'replace')}") from None
  return results.parse_pyrunner_json(text) if kind == "pyrunner" else results.parse_junit_xml(text)


def _score(res, task, observed, r, partial_credit):
  if observed is None:  # exit-code verifier
    res.reward = 1.0 if r.ok else 0.0
  elif task.test_ids:
    res.tests = dict(observed)
    res.fail_to_pass = results.match_results(observed, task.fail_to_pass)
    res.pass_to_pass = results.match_results(observed, task.pass_to_pass)
    res.reward = results.score({**res.fail_to_pass, **res.pass_to_pass}, task.fail_to_pass,
                               task.pass_to_pass, partial_credit=partial_credit)
  else:
    res.tests = dict(observed)
    res.reward = 1.0 if observed and all(v == results.PASSED for v in observed.values()) else 0.0
  res.status = st.SOLVED if res.reward == 1.0 else st.FAILED
  if r.timed_out:
    res.error = f"verifier timed out after {task.verifier.timeout_s}s"
