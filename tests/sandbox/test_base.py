"""``base.pid_alive``, which the reapers of both sandbox backends ask before removing what a
sandbox left behind: real processes, one running, one exited and reaped, one exited and not yet
waited for (a zombie, as an owner is whose parent does not reap)."""

import os
import subprocess
import sys
import time

from legorl_jax.sandbox import base


def _wait_state(pid: int, state: str, timeout: float = 10.0) -> None:
  deadline = time.monotonic() + timeout
  while base._proc_state(pid) != state:
    assert time.monotonic() < deadline, f"pid {pid} never reached state {state}"
    time.sleep(0.01)


def test_running_process_is_alive_and_this_one_too():
  assert base.pid_alive(os.getpid())
  p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
  try:
    assert base.pid_alive(p.pid)
  finally:
    p.kill()
    p.wait()


def test_zombie_counts_as_gone_and_a_reaped_process_too():
  p = subprocess.Popen([sys.executable, "-c", "pass"])
  _wait_state(p.pid, "Z")  # exited; not waited for yet, so its pid still exists
  os.kill(p.pid, 0)  # the pid is there: kill(pid, 0) alone would call it alive
  assert not base.pid_alive(p.pid)
  p.wait()
  assert not base.pid_alive(p.pid)


def test_proc_state_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
  # The name in /proc/PID/stat is the executable's, up to 15 bytes, in parentheses.
  exe = tmp_path / "a) b"
  exe.symlink_to(sys.executable)
  p = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
  try:
    _wait_state(p.pid, "S")
    with open(f"/proc/{p.pid}/stat") as f:
      assert "(a) b)" in f.read()
  finally:
    p.kill()
    p.wait()
