"""Reading Linux ``/proc/.../stat`` files, whose second field (the command name, in parentheses)
may itself hold spaces and ``)``: the fields a caller wants are those after the last ``)``."""

from __future__ import annotations


def stat_fields(path: str) -> list[str] | None:
  """The fields of the stat file at ``path`` after the command name: index 0 is the state
  (``R``, ``S``, ``Z``...), i.e. ``proc(5)``'s field 3, so ``proc(5)``'s field n is index
  n - 3. None when the file cannot be read (no procfs, or the process or thread is gone)."""
  try:
    with open(path) as f:
      stat = f.read()
  except OSError:
    return None
  return stat[stat.rfind(")") + 1:].split()
