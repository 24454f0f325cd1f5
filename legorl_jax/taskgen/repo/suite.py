"""Running a project's test suite in a sandbox and reading per-test outcomes.

The command is the verifier's pytest command (``rewards.verifier``) with the same options, so
the test ids recorded here are exactly the ids the verifier reports for the tasks later.
"""

from __future__ import annotations

import dataclasses
import shlex

from legorl_jax.errors import SandboxError, VerifierError
from legorl_jax.rewards import results
from legorl_jax.sandbox.base import Sandbox
from legorl_jax.taskgen.repo.env_spec import EnvSpec

SUITE_DIR = ".legorl_suite"
JUNIT = f"{SUITE_DIR}/junit.xml"
# pytest exit codes: 0 all passed, 1 some failed, 2 interrupted (collection errors),
# 3 internal error, 4 usage error, 5 no tests collected.
PYTEST_OK_CODES = (0, 1)


@dataclasses.dataclass
class SuiteRun:
  """One run of the suite. ``outcomes``: {test id: passed|failed|error|skipped};
  ``messages``: {test id: failure message} for the tests that did not pass."""
  outcomes: dict[str, str]
  messages: dict[str, str]
  exit_code: int
  timed_out: bool
  duration_s: float
  output_tail: str
  junit_found: bool = True

  @property
  def completed(self) -> bool:
    """The suite ran to the end: no timeout, no collection or usage error."""
    return not self.timed_out and self.exit_code in PYTEST_OK_CODES and bool(self.outcomes)

  def passed(self) -> set[str]:
    return {t for t, o in self.outcomes.items() if o == results.PASSED}


def suite_command(spec: EnvSpec, paths: tuple[str, ...] | None = None) -> str:
  files = " ".join(shlex.quote(p) for p in (paths or spec.test_paths))
  extra = " ".join(shlex.quote(a) for a in spec.pytest_args)
  return (f"rm -rf {SUITE_DIR} && mkdir -p {SUITE_DIR} && python3 -m pytest -p no:cacheprovider "
          f"-o junit_family=xunit1 -q --junitxml={JUNIT} {extra} {files}")


def run_suite(sandbox: Sandbox, spec: EnvSpec, *, timeout_s: float,
              paths: tuple[str, ...] | None = None) -> SuiteRun:
  """Runs the suite once; a missing or unreadable JUnit file gives empty outcomes (the
  output tail says why), never an exception."""
  r = sandbox.exec(suite_command(spec, paths), timeout=timeout_s)
  tail = (r.stdout[-3000:] + r.stderr[-2000:]).decode("utf-8", "replace")
  outcomes, messages, found = {}, {}, True
  try:
    text = sandbox.read_file(JUNIT).decode("utf-8", "replace")
    outcomes = results.parse_junit_xml(text)
    messages = results.junit_failure_messages(text)
  except (SandboxError, VerifierError) as e:
    found = False
    tail += f"\n[no test results: {e}]"
  sandbox.exec(f"rm -rf {SUITE_DIR}", timeout=30)
  return SuiteRun(outcomes=outcomes, messages=messages, exit_code=r.exit_code,
                  timed_out=r.timed_out, duration_s=r.duration_s, output_tail=tail, junit_found=found)
