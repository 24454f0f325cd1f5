"""Launches a worker module as two ``jax.distributed`` CPU processes on this machine."""

import os
import socket
import subprocess
import sys

from legorl_jax.sharding import distributed
from tests.xla_flags import subprocess_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run(module: str, out_dir, *, timeout: float, devices_per_process: int = 4) -> list[str]:
  """Runs ``python -m module RANK 2 PORT OUT_DIR`` for ranks 0 and 1; returns their logs and
  fails (with the log) if either exits non-zero."""
  port = free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=subprocess_xla_flags(devices_per_process))
  for k in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
    env.pop(k, None)
  procs = [subprocess.Popen([sys.executable, "-m", module, str(i), "2", str(port), str(out_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=timeout)
      logs.append(out)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"process {i} failed:\n{log[-4000:]}"
  return logs
