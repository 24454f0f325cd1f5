"""Host bookkeeping of KV-cache rows: which row serves which request, and what it holds.

Each row remembers the token ids whose K/V it holds (positions ``0..len-1``). A row is *busy*
while a request uses it, otherwise *idle*; an idle row may be *bound* to a session so that the
session's next request (which resends the whole history) only prefills what is new. Rows are
handed out in this order: the session's own idle row; else the unbound idle row sharing the
longest prefix with the prompt (lowest index on ties, which keeps live rows packed at the
front of the cache); else the least recently used bound row, evicting its session.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Hashable, Sequence

import numpy as np


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
  """Length of the longest common prefix of two id sequences."""
  n = min(len(a), len(b))
  if n == 0:
    return 0
  x, y = np.asarray(a[:n]), np.asarray(b[:n])
  diff = np.flatnonzero(x != y)
  return int(diff[0]) if diff.size else n


@dataclasses.dataclass
class Slot:
  index: int
  cached: list[int] = dataclasses.field(default_factory=list)
  busy: bool = False
  session: Hashable | None = None
  last_used: int = 0


class SlotTable:
  """Assigns cache rows to requests; owned by the engine's device thread (not thread-safe)."""

  def __init__(self, num_slots: int, reuse: bool = True):
    self.reuse = reuse
    self.slots = [Slot(i) for i in range(num_slots)]
    self.sessions: dict[Hashable, int] = {}
    self._clock = itertools.count(1)
    self.evictions = 0

  def num_free(self) -> int:
    return sum(not s.busy for s in self.slots)

  def acquire(self, prompt: Sequence[int], session: Hashable | None = None):
    """Takes a row for ``prompt``; returns ``(slot_index, reusable_prefix_len)`` or None.

    The reusable prefix stops one token short of the prompt: the last prompt token is always
    fed by the decode step that samples the first new token.
    """
    slot = None
    if session is not None and session in self.sessions:
      own = self.slots[self.sessions[session]]
      if not own.busy:
        slot = own
    if slot is None:
      free = [s for s in self.slots if not s.busy and s.session is None]
      if free:
        slot = max(free, key=lambda s: (common_prefix_len(s.cached, prompt), -s.index))
    if slot is None:
      bound = [s for s in self.slots if not s.busy]
      if not bound:
        return None
      slot = min(bound, key=lambda s: s.last_used)
      self._unbind(slot)
      slot.cached = []
      self.evictions += 1
    reuse = min(common_prefix_len(slot.cached, prompt), len(prompt) - 1) if self.reuse else 0
    slot.busy = True
    slot.cached = list(prompt[:reuse])
    slot.last_used = next(self._clock)
    return slot.index, reuse

  def release(self, index: int, cached: Sequence[int], session: Hashable | None = None):
    """Frees a row that now holds K/V for ``cached``; binds it to ``session`` if given."""
    slot = self.slots[index]
    slot.busy = False
    slot.cached = list(cached)
    slot.last_used = next(self._clock)
    if session is not None:
      old = self.sessions.get(session)
      if old is not None and old != index:
        self.slots[old].session = None
      self._unbind(slot)
      slot.session = session
      self.sessions[session] = index

  def swap(self, i: int, j: int):
    """Exchanges what rows ``i`` and ``j`` hold (the engine moved their K/V the same way)."""
    a, b = self.slots[i], self.slots[j]
    for field in ("cached", "busy", "session", "last_used"):
      x, y = getattr(a, field), getattr(b, field)
      setattr(a, field, y)
      setattr(b, field, x)
    for slot in (a, b):
      if slot.session is not None:
        self.sessions[slot.session] = slot.index

  def invalidate(self):
    """Forgets every cached prefix (new parameters make old K/V stale); keeps session rows."""
    for s in self.slots:
      if not s.busy:
        s.cached = []

  def _unbind(self, slot: Slot):
    if slot.session is not None and self.sessions.get(slot.session) == slot.index:
      del self.sessions[slot.session]
    slot.session = None
