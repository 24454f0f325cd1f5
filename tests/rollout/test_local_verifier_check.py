"""A pytest-graded task on the local backend is refused before its first trial when the
sandbox's python3 cannot import pytest; the message names the fix. Real interpreters: a fresh
virtualenv (no pytest) and this test process's own one (which has it)."""

import dataclasses
import os
import subprocess
import sys

import pytest

from legorl_jax import errors
from legorl_jax.rollout.runner import TrialJob, check_local_verifiers, run_trials
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sandbox import SandboxConfig
from legorl_jax.taskgen.synthetic import generate_tasks
from tests.rollout.conftest import ShellAdapter


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
  venv = tmp_path_factory.mktemp("bare") / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  return str(venv / "bin")


def _pytest_task():
  task = generate_tasks(1, seed=0)[0]
  return dataclasses.replace(task, verifier=dataclasses.replace(task.verifier, kind="pytest"))


def test_refused_before_any_trial_with_the_fix(bare_python, tmp_path):
  cfg = SandboxConfig(env={"PATH": f"{bare_python}:/bin"})
  task = _pytest_task()
  with pytest.raises(errors.ConfigError) as e:
    run_trials([TrialJob(task, ShellAdapter("sh", "true"))], None, TrialConfig(sandbox=cfg),
               str(tmp_path / "out"))
  msg = str(e.value)
  assert task.id in msg and "cannot import pytest" in msg
  assert "python3-pytest" in msg and "--config.sandbox.backend=docker" in msg
  assert not os.path.exists(tmp_path / "out" / "trials.jsonl")  # no trial ran


def test_accepted_where_the_interpreter_has_pytest_or_not_needed(bare_python):
  have = SandboxConfig(env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"})
  check_local_verifiers([_pytest_task()], have)
  bare = SandboxConfig(env={"PATH": f"{bare_python}:/bin"})
  check_local_verifiers(generate_tasks(2, seed=0), bare)  # pyrunner tasks need no pytest
  check_local_verifiers([_pytest_task()], dataclasses.replace(bare, backend="docker"))
