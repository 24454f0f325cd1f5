"""Unprivileged uids for local sandboxes, reserved host-wide.

Run as root, every local sandbox runs as a uid of its own in ``[UID_BASE, UID_BASE + UID_SPAN)``:
its process limit is its own, its files are unwritable to other sandboxes, and killing the
sandbox kills every process of its uid. That is only safe if no two sandboxes on the host share
a uid, including sandboxes of *other* processes (two training runs, two pytest workers): a uid
picked by one process while another's sandbox was about to start under it would let either
sandbox's teardown kill the other's processes.

So a uid is reserved with a POSIX record lock on byte ``uid - UID_BASE`` of one host-wide file
(``LOCK_PATH``) for as long as the sandbox lives. The kernel drops a process's record locks
when it exits, so a crashed process never holds a uid. The lock file is fixed (not under
``$TMPDIR``, which a run may point elsewhere) so that every process on the host sees it.
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import threading
import time

from legorl_jax.errors import SandboxError

UID_BASE, UID_SPAN = 200000, 60000
LOCK_PATH = "/tmp/.legorl_jax_sandbox_uids.lock"

_lock = threading.Lock()
_fd: int | None = None  # LOCK_PATH, open for the process's lifetime (closing it drops every lock)
_in_use: set[int] = set()  # uids this process's live sandboxes hold
_ever: set[int] = set()  # every uid this process gave a sandbox (leak checks)


def _lock_fd() -> int:
  global _fd
  if _fd is None:
    _fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
  return _fd


def _try_lock(uid: int) -> bool:
  try:
    fcntl.lockf(_lock_fd(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, uid - UID_BASE)
    return True
  except OSError:  # another process holds it
    return False


def _unlock(uid: int):
  fcntl.lockf(_lock_fd(), fcntl.LOCK_UN, 1, uid - UID_BASE)


def allocate() -> int:
  """A uid no sandbox on the host holds (reserved until ``release``) and no process runs as."""
  with _lock:
    for _ in range(200):
      uid = UID_BASE + random.randrange(UID_SPAN)
      if uid in _in_use or not _try_lock(uid):
        continue
      if processes_of_uid(uid):  # a leftover of a crashed run: leave that uid alone
        _unlock(uid)
        continue
      _in_use.add(uid)
      _ever.add(uid)
      return uid
  raise SandboxError(f"no free sandbox uid after 200 tries in [{UID_BASE}, {UID_BASE + UID_SPAN}): "
                     f"are thousands of sandboxes running? Stop some runs, or kill the processes "
                     f"left running as those uids (`ps -eo uid,pid,cmd`).")


def release(uid: int):
  """Gives ``uid`` back once its sandbox's processes are gone."""
  with _lock:
    if uid in _in_use:
      _in_use.discard(uid)
      _unlock(uid)


def own_processes() -> list[int]:
  """Pids still running as a uid this process gave a sandbox (none, once its sandboxes are
  destroyed). A uid another process holds now is its sandbox's, not a leak of ours, and is
  skipped."""
  with _lock:
    live, mine = set(_in_use), set(_ever)
    free = set()
    for uid in mine - live:
      if _try_lock(uid):
        free.add(uid)
        _unlock(uid)
  uids = live | free
  return [pid for pid in sandbox_processes() if uid_of(pid) in uids]


def uid_of(pid: int) -> int | None:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("Uid:"):
          return int(line.split()[1])
  except (OSError, ValueError):
    pass
  return None


def sandbox_processes(lo: int = UID_BASE, hi: int = UID_BASE + UID_SPAN) -> list[int]:
  """Pids whose real uid is in [lo, hi): by default, any local sandbox's."""
  out = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      uid = uid_of(int(pid))
      if uid is not None and lo <= uid < hi:
        out.append(int(pid))
  return out


def processes_of_uid(uid: int) -> list[int]:
  return sandbox_processes(uid, uid + 1)


def kill_uid(uid: int) -> int:
  """SIGKILLs every process whose real uid is ``uid`` (until none is left, at most 5 rounds);
  returns how many were signalled."""
  n = 0
  for _ in range(5):
    found = 0
    for pid in processes_of_uid(uid):
      try:
        os.kill(pid, signal.SIGKILL)
        found += 1
      except OSError:
        pass
    n += found
    if not found:
      break
    time.sleep(0.05)
  return n
