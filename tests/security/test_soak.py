"""A short soak (the full one is experiments/benchmarks/soak.py): many concurrent trials of
the built-in harness in the local sandbox, then nothing lost and nothing left behind: no
process, no sandbox directory, no file descriptor."""

import json
import os
import time

import pytest

from legorl_jax.harnesses.builtin import BuiltinAdapter
from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sandbox import SandboxConfig, local
from tests.security.conftest import descendants, open_fds


@pytest.mark.slow
@pytest.mark.skipif(local.bwrap_path() is None, reason="bubblewrap not installed")
def test_many_trials_leave_nothing_behind(tmp_path, scripted_uds_proxy, easy_tasks):
  base_dir = str(tmp_path / "sandboxes")
  cfg = TrialConfig(harness_timeout_s=180, max_turns=6, keep_trajectory_files=False,
                    sandbox=SandboxConfig(base_dir=base_dir))
  jobs = [TrialJob(easy_tasks[i % len(easy_tasks)], BuiltinAdapter(), group=i) for i in range(24)]
  out = str(tmp_path / "out")
  run_trials(jobs[:8], scripted_uds_proxy, cfg, out, concurrency=8, max_retries=0)  # warm-up
  time.sleep(0.5)
  fds, procs = open_fds(), descendants(os.getpid())
  res = run_trials(jobs[8:], scripted_uds_proxy, cfg, out, concurrency=8, max_retries=0)
  assert [r.status for r in res] == [st.SOLVED] * 16, [(r.status, r.error[:200]) for r in res]
  lines = [json.loads(x) for x in open(os.path.join(out, "trials.jsonl"))]
  assert len(lines) == 24 and all(x["final"] for x in lines)
  for _ in range(50):  # PID namespaces are torn down asynchronously
    if not descendants(os.getpid()) and not local.own_sandbox_processes():
      break
    time.sleep(0.1)
  assert descendants(os.getpid()) == procs == []
  assert local.own_sandbox_processes() == []
  assert open_fds() == fds
  assert os.listdir(base_dir) == []
