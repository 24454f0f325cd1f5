"""Warnings about the whole process, logged once per process rather than once per object.

Some conditions hold for every object a run creates: bubblewrap missing on this host makes
every local sandbox run in the weaker mode. Logged where each object is made, such a warning
repeats hundreds of times (a demo creates a sandbox per trial) and buries everything else.
"""

from __future__ import annotations

import logging
import threading

_lock = threading.Lock()
_seen: set[str] = set()


def warning(logger: logging.Logger, key: str, msg: str, *args) -> bool:
  """Logs ``msg % args`` at WARNING the first time ``key`` is seen in this process; True then."""
  with _lock:
    if key in _seen:
      return False
    _seen.add(key)
  logger.warning(msg, *args)
  return True


def forget(key: str):
  """Lets ``key`` warn again (tests; a condition that was fixed and may return)."""
  with _lock:
    _seen.discard(key)
