"""Sandbox uids are reserved host-wide: a uid another live process holds is never handed out
here, and comes free when that process exits (the kernel drops its record locks), even by
SIGKILL. The other process is a real one (``python -c``), holding its reservation."""

import subprocess
import sys

import pytest

from legorl_jax.errors import SandboxError
from legorl_jax.sandbox import uids

_HOLDER = ("import sys; from legorl_jax.sandbox import uids; u = uids.allocate(); "
           "print(u, flush=True); sys.stdin.read()")


@pytest.fixture
def other_process():
  p = subprocess.Popen([sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True)
  uid = int(p.stdout.readline())
  yield p, uid
  p.kill()
  p.wait()


def _draws(monkeypatch, *uid_list):
  """``random.randrange`` in ``uids`` returns these uids' offsets, in order."""
  it = iter([u - uids.UID_BASE for u in uid_list])
  monkeypatch.setattr(uids.random, "randrange", lambda n: next(it))


def test_a_uid_held_by_another_process_is_skipped_until_it_exits(other_process, monkeypatch):
  p, theirs = other_process
  spare = uids.UID_BASE + (theirs - uids.UID_BASE + 1) % uids.UID_SPAN
  _draws(monkeypatch, theirs, spare)
  mine = uids.allocate()
  assert mine == spare  # their uid was drawn first and passed over
  uids.release(mine)
  p.kill()  # no clean-up of its own: the kernel drops its lock
  p.wait()
  _draws(monkeypatch, theirs)
  assert uids.allocate() == theirs
  uids.release(theirs)


def test_own_processes_leaves_other_processes_sandboxes_out(other_process, monkeypatch):
  p, theirs = other_process
  uids._ever.add(theirs)  # as if this process had used it before the other took it  # noqa: SLF001
  try:
    seen = []
    monkeypatch.setattr(uids, "sandbox_processes", lambda *a: seen.append(1) or [4242])
    monkeypatch.setattr(uids, "uid_of", lambda pid: theirs)
    assert uids.own_processes() == [] and seen  # its processes are not our leak
    p.kill()
    p.wait()
    assert uids.own_processes() == [4242]  # nobody holds it now: a process of it is ours, leaked
  finally:
    uids._ever.discard(theirs)  # noqa: SLF001


def test_no_free_uid_is_a_clear_error(other_process, monkeypatch):
  _, theirs = other_process
  monkeypatch.setattr(uids.random, "randrange", lambda n: theirs - uids.UID_BASE)
  with pytest.raises(SandboxError, match="no free sandbox uid"):
    uids.allocate()
