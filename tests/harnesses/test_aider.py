"""aider end to end: SEARCH/REPLACE answers from the scripted policy, and the tiny policy."""

import os
import shlex
import subprocess

import pytest

from legorl_jax.harnesses import install
from legorl_jax.harnesses.aider import NAME, AiderAdapter, instruction_files
from legorl_jax.harnesses.base import Endpoint
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_scripted_trajectory,
                                      check_token_faithful, describe, require_installed)


def test_instruction_files():
  text = ("The function `f` in `pkg/mod.py` is wrong: f(1.5) returns 2.0. See setup.cfg and "
          "https://example.com/x.html; fix pkg/mod.py.")
  assert instruction_files(text) == ["pkg/mod.py", "setup.cfg"]


def test_launch_spec_private_home():
  spec = AiderAdapter().launch("Fix `a/b.py`.", Endpoint("http://127.0.0.1:8080/sess/s1", "tok"),
                               home="/home/agent", workdir="/workspace", max_turns=4)
  script = spec.argv[-1]
  assert spec.argv[:2] == ["/bin/sh", "-c"] and "--edit-format diff" in script
  assert "--openai-api-base=http://127.0.0.1:8080/sess/s1/v1" in script
  for flag in ("--no-auto-commits", "--no-gitignore", "--no-check-update", "--analytics-disable",
               "--yes-always"):
    assert flag in script
  assert "for f in a/b.py;" in script
  assert all(p.startswith("/home/agent/") for p in list(spec.files) + spec.log_files)


def test_token_with_leading_dash_parses():
  """A session token is URL-safe base64 and may start with "-": aider's own argument parser
  must still read it as the key, not as an unknown flag."""
  require_installed(AiderAdapter())
  spec = AiderAdapter().launch("Fix `a/b.py`.", Endpoint("http://127.0.0.1:8080/sess/s1", "-Xy_z"),
                               home="/home/agent", workdir="/workspace", max_turns=4)
  argv = shlex.split(spec.argv[-1].split("exec ", 1)[1])
  key_flags = [a for a in argv if a.startswith("--openai-api")]
  aider = str(install.executable_path(NAME))
  # --version comes last, so argparse has parsed the key flags before it exits
  p = subprocess.run([aider, *key_flags, "--version"], capture_output=True, text=True,
                     timeout=120, env={**os.environ, **spec.env, "HOME": "/tmp"})
  assert p.returncode == 0, p.stderr[-2000:]
  assert "--openai-api-key=-Xy_z" in key_flags


@pytest.fixture(scope="module")
def proxy(scripted_proxy, easy_tasks):
  return scripted_proxy(easy_tasks)


@pytest.mark.slow
def test_scripted_local(run_harness_trials, proxy, easy_tasks, tokenizer):
  tasks = easy_tasks[:2]
  results = run_harness_trials(AiderAdapter(), proxy, tasks)
  check_accounted(results, tasks)
  for res in results:
    traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
    # one answer with the SEARCH/REPLACE blocks; aider applies it and exits
    assert res.turns == 1, describe(res)
    text = proxy.replies[0]
    assert "<<<<<<< SEARCH" in text and ">>>>>>> REPLACE" in text
    assert not traj.side_segments


@pytest.mark.slow
def test_tiny_policy(run_harness_trials, tiny_engine_proxy, easy_tasks):
  tasks = easy_tasks[:2]
  results = run_harness_trials(AiderAdapter(context_tokens=tiny_engine_proxy.max_len),
                               tiny_engine_proxy.proxy, tasks)
  check_accounted(results, tasks)
  checked = 0
  for r in results:
    assert r.status in (st.FAILED, st.OVERLONG, st.SOLVED), describe(r)
    checked += check_token_faithful(tiny_engine_proxy.model, r.trajectory)
  assert checked > 0
