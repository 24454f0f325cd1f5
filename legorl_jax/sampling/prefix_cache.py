"""Cross-session prefix cache of the sampling engine: host-side bookkeeping only.

Why results do not depend on the cache: the engine prefills in chunks of one fixed length
``C`` aligned to absolute positions (position ``p`` always sits in column ``p % C`` of a call
for chunk ``p // C``, whose attention window is a function of the chunk index alone). So the
K/V of a prompt position is computed by the same program from the same inputs whether a
request prefills it itself or copies it from another row: a cached prefix is bit-identical to
a fresh one (fp32 on CPU, checked by the tests). K/V written by decode steps (sampled tokens)
are a different program; only an engine built with ``reuse_sampled_kv`` reuses those.

Where cached prefixes live: every cache row holds the K/V of the prompt it last served (busy
rows the part prefilled so far), and ``PrefixStore`` keeps extra rows, past the engine's
``max_batch``, for prefixes whose row was handed to another request: its size is the memory
budget (``Engine(prefix_cache_gb=...)``), evicting the least recently used prefix. A request
starts from the longest prefix any of them holds (``best_source``); requests admitted together
that share a prefix prefill it once (``split_leaders``): one computes each shared chunk, the
others wait and copy it.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

import numpy as np


def match_len(a: np.ndarray, b: np.ndarray, limit: int) -> int:
  """Length of the common prefix of ``a`` and ``b`` (int arrays), at most ``limit``."""
  n = min(len(a), len(b), limit)
  if n <= 0:
    return 0
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


def best_source(prompt: np.ndarray, limit: int,
                candidates: Iterable[tuple[int, np.ndarray]]) -> tuple[int, int]:
  """The ``(row, length)`` of the candidate ``(row, tokens)`` sharing the longest prefix with
  ``prompt`` (capped at ``limit``); ``(-1, 0)`` if none shares any."""
  best, best_len = -1, 0
  for row, tokens in candidates:
    m = match_len(prompt, tokens, limit)
    if m > best_len:
      best, best_len = row, m
  return best, best_len


def row_bytes(config, max_len: int, dtype, routes: bool = False) -> int:
  """Bytes of one cache row (every layer's K and V, scratch slots included; with ``routes``
  also the route cache of a mixture-of-experts model, ``L_moe * k`` ids per slot)."""
  from legorl_jax.sampling.cache import SCRATCH
  dt = np.dtype(dtype or config.compute_dtype)
  per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dt.itemsize
  if routes:
    per_slot += (len(config.moe_layers) * config.num_experts_per_tok
                 * np.dtype(config.route_dtype).itemsize)
  return per_slot * (SCRATCH + max_len)


def row_prefixes(slots, live, exclude: int) -> list[tuple[int, np.ndarray]]:
  """``(row, token ids)`` of every engine row holding reusable K/V but row ``exclude``: busy
  rows (``live[row]``: the prompt prefilled so far) and idle rows (``slots[row].cached``: what
  they last held)."""
  out = []
  for slot in slots:
    if slot.index == exclude:
      continue
    req = live.get(slot.index)
    if req is not None:
      if req.next_prefill > 0:
        out.append((slot.index, req.prompt_np[:req.next_prefill]))
    elif slot.cached:
      out.append((slot.index, np.asarray(slot.cached, np.int64)))
  return out


class PrefixStore:
  """Extra cache rows ``[first_row, first_row + num_rows)`` holding prefixes, LRU-evicted.

  Owned by the engine's device thread (not thread-safe). Each row remembers the token ids
  whose K/V it holds (positions ``0..len-1``)."""

  def __init__(self, first_row: int, num_rows: int):
    self.first_row, self.num_rows = first_row, num_rows
    self.tokens: list[np.ndarray | None] = [None] * num_rows
    self.last_used = [0] * num_rows
    self._clock = itertools.count(1)
    self.evictions = 0
    self.hits = 0

  def candidates(self) -> list[tuple[int, np.ndarray]]:
    return [(self.first_row + i, t) for i, t in enumerate(self.tokens) if t is not None]

  def touch(self, row: int):
    self.last_used[row - self.first_row] = next(self._clock)
    self.hits += 1

  def place(self, tokens: np.ndarray) -> int | None:
    """The store row to copy a prefix of ``tokens`` into (None: not worth keeping).

    A prefix already held (equal to or inside a stored one) is not stored twice; a stored
    prefix of ``tokens`` is replaced by it; otherwise the least recently used row is evicted.
    The caller copies the K/V in right away."""
    if not self.num_rows or not len(tokens):
      return None
    slot = None
    for i, t in enumerate(self.tokens):
      if t is None:
        continue
      m = match_len(t, tokens, len(tokens))
      if m == len(tokens):  # already held
        self.last_used[i] = next(self._clock)
        return None
      if m == len(t):  # a prefix of the new one: replace it
        slot = i
    if slot is None:
      empty = [i for i, t in enumerate(self.tokens) if t is None]
      if empty:
        slot = empty[0]
      else:
        slot = min(range(self.num_rows), key=lambda i: self.last_used[i])
        self.evictions += 1
    self.tokens[slot] = np.array(tokens, copy=True)
    self.last_used[slot] = next(self._clock)
    return self.first_row + slot

  def place_evicted(self, tokens: np.ndarray, rows: Sequence[tuple[int, np.ndarray]]):
    """``place`` for a prefix leaving an engine row, unless another row (``rows``) holds it."""
    if any(match_len(tokens, t, len(tokens)) == len(tokens) for _, t in rows):
      return None
    return self.place(tokens)

  def invalidate(self):
    """Forgets every stored prefix (new parameters make old K/V stale)."""
    self.tokens = [None] * self.num_rows


def split_leaders(pending: Sequence, chunk: int):
  """Splits requests awaiting prefill into leaders (prefill their next chunk now) and followers
  (wait: a leader's chunk covers their next position with the same token ids, and they copy it
  afterwards). ``pending`` holds objects with ``prompt_np``, ``next_prefill`` and
  ``prefill_end``, in admission order; the first is always a leader, so every call makes
  progress."""
  leaders, followers = [], []
  for r in pending:
    k = r.next_prefill // chunk
    shared = False
    for q in leaders:
      if q.next_prefill // chunk == k and q.next_prefill <= r.next_prefill:
        m = match_len(q.prompt_np, r.prompt_np, min(q.prefill_end, r.prefill_end))
        if m > r.next_prefill:
          shared = True
          break
    (followers if shared else leaders).append(r)
  return leaders, followers
