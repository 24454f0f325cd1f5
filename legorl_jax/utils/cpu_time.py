"""CPU seconds used by this process and the child processes it has reaped.

A phase's share of the machine (CPU seconds over wall seconds times cores) says how much idle
CPU there was for another phase to overlap with: on a host whose cores one phase already keeps
busy, running rollouts and updates concurrently cannot make the pair much faster.
"""

from __future__ import annotations

import os
import resource


def own_and_children_cpu_s() -> tuple[float, float]:
  """User + system CPU seconds of this process, and of every child it has waited for (a trial's
  harness, sandbox and verifier processes count once they have exited and been reaped)."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def process_tree_cpu_s() -> float:
  """``own_and_children_cpu_s`` summed: this process and its reaped children."""
  return sum(own_and_children_cpu_s())


def usable_cores() -> int:
  """Cores this process may run on (its CPU affinity where the OS reports one)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1
