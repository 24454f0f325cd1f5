"""Frozen-trunk cache: the input of the lowest trained block, computed once per sequence.

With ``trainer.trainable = "top:K"`` the blocks below the lowest trained one never change, so
the hidden state entering it is a fixed function of a token's prefix (attention is causal and
stays within a sequence; RoPE positions are the token's index in its sequence in every row
layout: plain, packed or a shared prompt and its branches). SFT draws the same demonstrations
epoch after epoch: ``TrunkCache`` runs the frozen blocks over each distinct demonstration
sequence once (``fill``, in the training batches' own layout and shapes) and keeps their
output in float32 host memory; ``attach`` then builds any later batch's trunk states from the
cache, and the step runs only the trained blocks and the head (``train_step.TRUNK_KEY``).

Keyed by token content, so a hit is exact by construction (same tokens, same frozen weights,
same states; the only difference to computing them in the step is float rounding of a
different row layout, ~1e-7). Storage: the first sequence is kept whole and every other only
from where it stops sharing that one's tokens (the harness's system prompt is stored once).

``budget_mb`` bounds the storage. Sequences that do not fit are not stored; a batch holding
any of them (or any sequence never filled, e.g. the short-context phase's cut sequences) is
returned as None by ``attach`` and trains as without the cache: the frozen blocks run inside
the step. Exact either way; only the saving is lost for those batches.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Iterator

import numpy as np

from legorl_jax.trainer import batching
from legorl_jax.trainer.train_step import TRUNK_KEY

log = logging.getLogger(__name__)

Part = tuple[np.ndarray, np.ndarray, np.ndarray]  # (full token ids, slots in the row, positions)


def _row_parts(ids: np.ndarray, pos: np.ndarray, seg: np.ndarray,
               layout: tuple[int, int] | None) -> Iterator[list[Part]]:
  """Per sequence in one row: the slots it fills, as ``(full token ids of the sequence, slots,
  positions)`` parts (a token's position is its index in the full sequence). A grouped row's
  prompt is a part of its first branch's sequence. Sequences whose positions are not their
  indices (none that the batchers make) are skipped, so they never hit."""
  if layout is not None:
    p, l = layout
    n = int(np.sum(seg[:p] == 1))
    prompt = np.arange(n)
    first = True
    for j in range((len(ids) - p) // l):
      slots = p + j * l + np.flatnonzero(seg[p + j * l:p + (j + 1) * l] == 2 + j)
      if not len(slots):
        continue
      full = np.concatenate([ids[:n], ids[slots]])
      if not np.array_equal(pos[slots], np.arange(n, n + len(slots))):
        yield []
        continue
      parts = [(full, slots, pos[slots])]
      if first and n:
        parts.append((full, prompt, prompt))
      first = False
      yield parts
    return
  for sid in np.unique(seg[seg > 0]):
    slots = np.flatnonzero(seg == sid)
    if np.array_equal(pos[slots], np.arange(len(slots))):
      yield [(ids[slots], slots, pos[slots])]
    else:
      yield []


def _common(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if len(diff) else n


class TrunkCache:
  """Trunk states of token sequences, filled with ``trunk_fn(batch) -> [B, T, D]`` float32
  (``Learner.trunk_states``), bounded to ``budget_mb`` of host memory."""

  def __init__(self, trunk_fn: Callable[[dict], np.ndarray], budget_mb: float):
    self._fn = trunk_fn
    self.budget_bytes = int(float(budget_mb) * 2**20)
    self.bytes = 0
    self._ref_ids = self._ref_states = None
    self._entries: dict[bytes, tuple[int, np.ndarray]] = {}  # key -> (shared with ref, tail)
    self.over_budget = 0  # sequences not stored: past the bound
    self.hits = self.misses = 0  # batches served from the cache / trained without it
    self.fill_s = 0.0

  @property
  def sequences(self) -> int:
    return len(self._entries)

  def _store(self, full: np.ndarray, states: np.ndarray) -> None:
    key = full.tobytes()
    if key in self._entries:
      return
    if self._ref_ids is None:
      if states.nbytes > self.budget_bytes:
        self.over_budget += 1
        return
      self._ref_ids, self._ref_states = full.copy(), states.copy()
      self._entries[key] = (len(full), states[:0].copy())
      self.bytes += states.nbytes
      return
    k = _common(self._ref_ids, full)
    tail = states[k:]
    if self.bytes + tail.nbytes > self.budget_bytes:
      self.over_budget += 1
      return
    self._entries[key] = (k, tail.copy())
    self.bytes += tail.nbytes

  def _fits(self, full: np.ndarray) -> bool:
    tail = len(full) - _common(self._ref_ids, full)
    return self.bytes + tail * self._ref_states.shape[1] * 4 <= self.budget_bytes

  def _states(self, full: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
    entry = self._entries.get(full.tobytes())
    if entry is None:
      return None
    k, tail = entry
    out = np.empty((len(positions), self._ref_states.shape[1]), np.float32)
    shared = positions < k
    out[shared] = self._ref_states[positions[shared]]
    out[~shared] = tail[positions[~shared] - k]
    return out

  def fill(self, batches: Iterable[dict]) -> None:
    """Runs the frozen blocks over ``batches`` and stores every sequence in them that fits."""
    t0 = time.perf_counter()
    for batch in batches:
      arrays, layout = batching.split_layout(batch)
      need = [(r, parts) for r in range(arrays["input_ids"].shape[0])
              for parts in _row_parts(arrays["input_ids"][r], arrays["positions"][r],
                                      arrays["segment_ids"][r], layout)
              if parts and parts[0][0].tobytes() not in self._entries]
      if self._ref_ids is not None:  # sequences that cannot fit: not computed at all
        fits = [self._fits(parts[0][0]) for _, parts in need]
        self.over_budget += fits.count(False)
        need = [x for x, ok in zip(need, fits) if ok]
      if not need:
        continue
      states = self._fn(batch)
      for r, parts in need:
        full = parts[0][0]
        seq = np.empty((len(full), states.shape[-1]), np.float32)
        for _, slots, positions in parts:
          seq[positions] = states[r, slots]
        self._store(full, seq)
    self.fill_s += time.perf_counter() - t0

  def attach(self, batch: dict) -> dict | None:
    """``batch`` with its trunk states under ``TRUNK_KEY``, or None when any of its sequences
    is not in the cache (train it as it is: the step runs the frozen blocks itself)."""
    arrays, layout = batching.split_layout(batch)
    if self._ref_states is None:
      self.misses += 1
      return None
    b, t = arrays["input_ids"].shape
    trunk = np.zeros((b, t, self._ref_states.shape[1]), np.float32)
    for r in range(b):
      for parts in _row_parts(arrays["input_ids"][r], arrays["positions"][r],
                              arrays["segment_ids"][r], layout):
        for full, slots, positions in parts or [(None, None, None)]:
          got = None if full is None else self._states(full, positions)
          if got is None:
            self.misses += 1
            return None
          trunk[r, slots] = got
    self.hits += 1
    return {**batch, TRUNK_KEY: trunk}

  def metrics(self) -> dict[str, float]:
    return {"trunk_cache/sequences": self.sequences, "trunk_cache/mb": self.bytes / 2**20,
            "trunk_cache/over_budget": self.over_budget, "trunk_cache/hit_batches": self.hits,
            "trunk_cache/miss_batches": self.misses, "trunk_cache/fill_s": self.fill_s}
