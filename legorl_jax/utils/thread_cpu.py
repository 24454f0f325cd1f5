"""Where a phase's CPU went: this process thread by thread, its reaped children, everyone else.

``cpu_time.process_tree_cpu_s`` says how much of the host a phase used; this says who used it.
``CpuSnapshot.take()`` reads every thread's user + system time from ``/proc/self/task`` and
names it: a Python thread by its ``threading`` name (the OS calls every Python thread after the
interpreter), any other thread (XLA's Eigen pool, LLVM's compile workers) by its OS name, with
trailing numbers dropped so a pool is one entry. It also takes the reaped children's time (a
trial's sandbox, harness and verifier processes, with everything they waited for) and the
machine's busy time from ``/proc/stat``. ``breakdown(a, b)`` is what happened between two
snapshots: per thread class, ``exited_threads`` (threads that ended in between, e.g. the HTTP
server's per-connection threads), ``children``, and ``other_processes`` (the rest of the
machine: dockerd, another job).

Linux only: elsewhere (no ``/proc``) a snapshot holds the process and children totals alone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time

from legorl_jax.utils import cpu_time, procfs

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_NUMBERS = re.compile(r"[-_ ]?\d+")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def thread_class(name: str) -> str:
  """A thread's name without its numbers, in characters a metric key can hold:
  ``legorl-trial_12`` -> ``legorl-trial``, ``Thread-7 (process_request_thread)`` ->
  ``Thread_process_request_thread``."""
  return _UNSAFE.sub("_", _NUMBERS.sub("", name)).strip("_") or "unnamed"


def _thread_cpu_s(tid: int) -> float | None:
  """User + system seconds of thread ``tid`` of this process (None once it has exited)."""
  fields = procfs.stat_fields(f"/proc/self/task/{tid}/stat")
  if fields is None:
    return None
  # utime and stime are proc(5)'s fields 14 and 15.
  return (int(fields[11]) + int(fields[12])) * _TICK_S


def _os_name(tid: int) -> str:
  try:
    with open(f"/proc/self/task/{tid}/comm") as f:
      return f.read().strip()
  except OSError:
    return "?"


def _machine_busy_s() -> float | None:
  """Seconds all cores spent not idle (user, nice, system, irq, softirq, steal) since boot."""
  try:
    with open("/proc/stat") as f:
      cpu = f.readline().split()
  except OSError:
    return None
  ticks = [int(x) for x in cpu[1:9]]  # user nice system idle iowait irq softirq steal
  return (sum(ticks) - ticks[3] - ticks[4]) * _TICK_S


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
  """CPU seconds at one instant: per live thread ``{tid: (class, seconds)}``, the process total,
  the reaped children's total, the machine's busy total (None without ``/proc``) and the wall
  clock."""

  threads: dict
  process_s: float
  children_s: float
  machine_s: float | None
  wall: float

  @classmethod
  def take(cls) -> "CpuSnapshot":
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    threads = {}
    try:
      tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
      tids = []
    for tid in tids:
      s = _thread_cpu_s(tid)
      if s is not None:
        threads[tid] = (thread_class(names.get(tid) or _os_name(tid)), s)
    own, kids = cpu_time.own_and_children_cpu_s()
    return cls(threads, own, kids, _machine_busy_s(), time.perf_counter())


def breakdown(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, float]:
  """CPU seconds between snapshots ``a`` and ``b``, by who used them, plus ``wall_s`` and
  ``cores_busy`` (this process and its children over the wall time). Thread classes are keyed
  ``thread/<class>``; a thread born in between counts from zero."""
  out: dict[str, float] = {}
  seen = 0.0
  for tid, (name, s) in b.threads.items():
    before = a.threads.get(tid)
    d = s - (before[1] if before is not None and before[0] == name else 0.0)
    if d > 0:
      out[f"thread/{name}"] = out.get(f"thread/{name}", 0.0) + d
      seen += d
  process = b.process_s - a.process_s
  # /proc's ticks and getrusage's microseconds round differently: a small negative is zero.
  out["exited_threads"] = max(0.0, process - seen)
  out["children"] = b.children_s - a.children_s
  wall = max(b.wall - a.wall, 1e-9)
  if a.machine_s is not None and b.machine_s is not None:
    out["other_processes"] = max(0.0, (b.machine_s - a.machine_s) - process - out["children"])
  out["wall_s"] = wall
  out["cores_busy"] = (process + out["children"]) / wall
  return out


def top(parts: dict[str, float], n: int = 6) -> str:
  """The ``n`` largest CPU entries of a ``breakdown`` as ``name seconds`` (for a log line)."""
  items = sorted(((k, v) for k, v in parts.items() if k not in ("wall_s", "cores_busy")),
                 key=lambda kv: -kv[1])[:n]
  return ", ".join(f"{k.removeprefix('thread/')} {v:.1f}" for k, v in items)
