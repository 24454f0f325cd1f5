"""Segments to device batches: padded (optionally packed) rows in a few fixed lengths.

Every shape the learner sees is one of ``len(buckets)`` shapes ``[rows, T]``, so the jitted
step compiles once per bucket. A segment longer than the largest bucket is truncated (its
tail is dropped, never its prompt) and counted.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

import numpy as np

from legorl_jax import errors

KEYS = ("input_ids", "positions", "segment_ids", "loss_mask", "advantages", "rollout_logp")


@dataclasses.dataclass
class TrainSequence:
  """One training sequence (a recorded segment) with its trial-level advantage."""

  token_ids: list[int]
  loss_mask: list[int]
  logprobs: list[float]
  advantage: float
  trial_id: str = ""


def sequences_from_trajectory(traj: dict, advantage: float, trial_id: str = "") -> list[TrainSequence]:
  """Train segments of a proxy trajectory, each carrying the trial's advantage."""
  out = []
  for seg in traj.get("segments", []):
    if not seg.get("train", True) or not any(seg["loss_mask"]):
      continue
    out.append(TrainSequence(list(seg["token_ids"]), list(seg["loss_mask"]), list(seg["logprobs"]),
                         float(advantage), trial_id))
  return out


def _bucket(buckets: Sequence[int], n: int) -> int:
  for b in buckets:
    if n <= b:
      return b
  return buckets[-1]


def _rows(seqs: list[TrainSequence], length: int, pack: bool) -> list[list[TrainSequence]]:
  """First-fit packing of sequences (already <= length) into rows of ``length`` tokens."""
  if not pack:
    return [[s] for s in seqs]
  rows, free = [], []
  for s in sorted(seqs, key=lambda s: -len(s.token_ids)):
    for i, f in enumerate(free):
      if len(s.token_ids) <= f:
        rows[i].append(s)
        free[i] -= len(s.token_ids)
        break
    else:
      rows.append([s])
      free.append(length - len(s.token_ids))
  return rows


def _row_arrays(row: list[TrainSequence], length: int) -> dict[str, np.ndarray]:
  a = {k: np.zeros(length, np.float32 if k in ("loss_mask", "advantages", "rollout_logp")
                   else np.int32) for k in KEYS}
  off = 0
  for sid, s in enumerate(row, start=1):
    n = len(s.token_ids)
    sl = slice(off, off + n)
    a["input_ids"][sl] = s.token_ids
    a["positions"][sl] = np.arange(n)
    a["segment_ids"][sl] = sid
    a["loss_mask"][sl] = s.loss_mask
    a["advantages"][sl] = s.advantage
    a["rollout_logp"][sl] = s.logprobs
    off += n
  return a


def make_batches(seqs: Iterable[TrainSequence], *, buckets: Sequence[int], rows_per_batch: int,
                 pack: bool = False) -> tuple[list[dict[str, np.ndarray]], collections.Counter]:
  """Packs sequences into batches ``{key: [rows_per_batch, T]}`` with T from ``buckets``.

  Returns the batches (each an optimizer update) and counters: ``sequences``, ``tokens``,
  ``truncated`` (sequences cut to the largest bucket), ``padding_rows``.
  """
  buckets = sorted(int(b) for b in buckets)
  if not buckets or rows_per_batch < 1:
    raise errors.ConfigError("batching needs at least one bucket and rows_per_batch >= 1.")
  stats = collections.Counter()
  by_bucket: dict[int, list[TrainSequence]] = collections.defaultdict(list)
  for s in seqs:
    if len(s.token_ids) > buckets[-1]:
      stats["truncated"] += 1
      s = dataclasses.replace(s, token_ids=s.token_ids[:buckets[-1]],
                              loss_mask=s.loss_mask[:buckets[-1]], logprobs=s.logprobs[:buckets[-1]])
    if not any(s.loss_mask):
      stats["no_trainable_tokens"] += 1
      continue
    stats["sequences"] += 1
    stats["tokens"] += len(s.token_ids)
    by_bucket[_bucket(buckets, len(s.token_ids))].append(s)
  batches = []
  for length in sorted(by_bucket):
    rows = [_row_arrays(r, length) for r in _rows(by_bucket[length], length, pack)]
    for i in range(0, len(rows), rows_per_batch):
      chunk = rows[i:i + rows_per_batch]
      pad = rows_per_batch - len(chunk)
      stats["padding_rows"] += pad
      chunk += [_row_arrays([], length)] * pad
      batches.append({k: np.stack([r[k] for r in chunk]) for k in KEYS})
  return batches, stats
