"""The Docker sandbox waits for its keeper process instead of reading init's children once.

CI once read ``/proc/1/task/1/children`` before the container's init had forked ``sleep`` and
crashed with an IndexError. These run the wait's shell against a file that fills late, as
``/proc`` does, with no Docker engine needed.
"""

import subprocess
import threading
import time

import pytest

from legorl_jax.errors import SandboxError
from legorl_jax.sandbox.docker_sandbox import keeper_pid, wait_for_child_script


def _run(script: str) -> str:
  return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True,
                        timeout=30).stdout


def test_wait_returns_the_child_once_init_has_forked_it(tmp_path):
  children = tmp_path / "children"
  children.write_text("")
  writer = threading.Timer(0.4, lambda: children.write_text("57 "))
  writer.start()
  t0 = time.monotonic()
  out = _run(wait_for_child_script(str(children), tries=200, pause_s=0.05))
  writer.join()
  assert keeper_pid(out, "sb1") == 57
  assert time.monotonic() - t0 >= 0.35  # it waited for the write, not returned the empty read


def test_wait_gives_up_and_the_error_says_why(tmp_path):
  children = tmp_path / "children"
  children.write_text("")
  out = _run(wait_for_child_script(str(children), tries=3, pause_s=0.01))
  with pytest.raises(SandboxError, match=r"sandbox sb2: the container's init started no keeper"):
    keeper_pid(out, "sb2")


def test_a_missing_file_is_waited_for_like_an_empty_one(tmp_path):
  out = _run(wait_for_child_script(str(tmp_path / "absent"), tries=2, pause_s=0.01))
  assert out.strip() == ""
  with pytest.raises(SandboxError, match="keeper"):
    keeper_pid(out, "sb3")


def test_first_child_is_the_keeper():
  assert keeper_pid("12 40 41\n", "sb4") == 12
