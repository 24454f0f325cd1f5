"""``host_death.die_with_host_argv``: a command started behind it dies with its host process,
whether the host dies while the command runs or before the command has started; with a live host
it runs as if started directly (same pid, same exit status). Real processes and signals; the
control (no prefix) shows that such a command otherwise outlives a SIGKILLed host."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from legorl_jax.sandbox import host_death
from tests.reliability.faultkit import _alive  # zombie-aware: an orphan may not be reaped at once

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("setpriv") is None,
                                reason="setpriv (util-linux) not installed")

# A host process: starts `sleep 60` in a session of its own (as the local sandbox starts its
# commands), prints the sleep's pid, then waits to be killed.
_HOST = textwrap.dedent("""
    import subprocess, sys, time
    from legorl_jax.sandbox import host_death
    prefix = host_death.die_with_host_argv() if sys.argv[1] == "prefix" else []
    p = subprocess.Popen(prefix + ["sleep", "60"], start_new_session=True)
    print(p.pid, flush=True)
    time.sleep(120)
""")


def _sleep_after_host_killed(mode: str) -> tuple[int, bool]:
  """(pid of the host's `sleep`, whether it is still alive 3 s after the host's SIGKILL)."""
  host = subprocess.Popen([sys.executable, "-c", _HOST, mode], stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  pid = int(host.stdout.readline())
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline:  # the prefix has exec'd into sleep
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      if f.read().split(b"\0")[0] == b"sleep":
        break
    time.sleep(0.02)
  host.kill()
  host.wait()
  deadline = time.monotonic() + 3
  while _alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  return pid, _alive(pid)


def test_command_dies_with_its_killed_host():
  pid, alive = _sleep_after_host_killed("prefix")
  assert not alive, f"sleep {pid} outlived its SIGKILLed host"


def test_without_the_prefix_the_command_outlives_its_host():
  pid, alive = _sleep_after_host_killed("none")
  try:
    assert alive  # what the prefix prevents
  finally:
    os.kill(pid, signal.SIGKILL)


def test_host_gone_before_the_command_starts(tmp_path):
  """The window bwrap's --die-with-parent leaves open: here the expected host is not the parent
  (as when the host died before the child ran), so the command never runs."""
  marker = tmp_path / "ran"
  gone = subprocess.Popen(["true"])
  gone.wait()
  r = subprocess.run(host_death.die_with_host_argv(gone.pid) + ["touch", str(marker)])
  assert r.returncode == 137 and not marker.exists()


def test_live_host_runs_the_command_unchanged():
  p = subprocess.Popen(host_death.die_with_host_argv() + ["sh", "-c", "echo $$; exit 7"],
                       stdout=subprocess.PIPE, text=True, start_new_session=True)
  out, _ = p.communicate(timeout=30)
  assert p.returncode == 7 and int(out) == p.pid  # exec'd all the way: one pid, its own status
