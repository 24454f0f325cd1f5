"""Segments to device batches: padded (optionally packed) rows in a few fixed lengths.

Every shape the learner sees is one of ``len(buckets)`` shapes ``[rows, T]``, so the jitted
step compiles once per bucket. A segment longer than the largest bucket is truncated (its
tail is dropped, never its prompt) and counted.

Grouped batches (``make_grouped_batches``) lay each row out as one prompt shared by several
branches (the samples of a GRPO group, or demonstrations behind one system prompt), so the
prompt is computed once per row; they carry their static layout under ``LAYOUT_KEY``.

Mixture-of-experts trajectories carry the sampler's routes (``routed_experts``); when any
sequence of a call has them, every batch it returns has ``ROUTES_KEY`` int ``[rows, T, L_moe, k]``
beside the ``[rows, T]`` arrays (-1 where nothing was recorded: padding, the last sampled token,
sequences without routes), for ``trainer.routing_replay``. Dense trajectories: no such key.

Replayed SFT demonstrations (``TrainSequence.demo``, ``loss.demo_replay_weight``) ride in the
same rows; when any sequence of a call is one, every batch it returns has ``DEMO_KEY`` f32
``[rows, T]``, 1 on their tokens (the train step gives them the NLL term, not a policy term).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.proxy import route_codec
from legorl_jax.rollout.trajectory import Trajectory

KEYS = ("input_ids", "positions", "segment_ids", "loss_mask", "advantages", "rollout_logp")
LAYOUT_KEY = "shared_prefix"  # int32 [2]: (P, L) of a grouped batch
ROUTES_KEY = "routed_experts"  # as train_step.ROUTES_KEY
DEMO_KEY = "demo_mask"  # as train_step.DEMO_KEY


def split_layout(batch: dict) -> tuple[dict, tuple[int, int] | None]:
  """(the batch's arrays, its static ``shared_prefix`` layout or None for plain rows)."""
  if LAYOUT_KEY not in batch:
    return batch, None
  p, l = (int(x) for x in np.asarray(batch[LAYOUT_KEY]))
  return {k: v for k, v in batch.items() if k != LAYOUT_KEY}, (p, l)


@dataclasses.dataclass
class TrainSequence:
  """One training sequence (a recorded segment) with its trial-level advantage."""

  token_ids: list[int]
  loss_mask: list[int]
  logprobs: list[float]
  advantage: float
  trial_id: str = ""
  routes: np.ndarray | None = None  # int [T, L_moe, k] sampler routes (-1: none), MoE only
  demo: bool = False  # a replayed SFT demonstration (DEMO_KEY), not a rollout


def sequences_from_trajectory(traj: Trajectory, advantage: float,
                              trial_id: str = "") -> list[TrainSequence]:
  """Train segments of a trial's trajectory that sampled anything, each carrying the trial's
  advantage (and the sampler's routes, for a mixture-of-experts policy)."""
  out = []
  for seg in traj.segments:
    if not seg.train or not seg.sampled:
      continue
    routes = None
    if seg.routed_experts is not None:
      where = f"trial {trial_id or '?'} segment {seg.id} routed_experts"
      routes = route_codec.decode(seg.routed_experts, where)
      if len(routes) != len(seg.token_ids):
        raise errors.RolloutError(f"{where}: routes for {len(routes)} tokens, the segment has "
                                  f"{len(seg.token_ids)}; the trajectory is inconsistent.")
    out.append(TrainSequence(list(seg.token_ids), list(seg.loss_mask), list(seg.logprobs),
                             float(advantage), trial_id, routes))
  return out


RouteLayout = tuple[tuple[int, int], np.dtype]  # ((L_moe, k), dtype) of a batch's routes


def route_layout(seqs: Sequence[TrainSequence]) -> RouteLayout | None:
  """``((L_moe, k), dtype)`` of the sequences' routes (the sampler's ``route_dtype``: the same
  for every batch of one policy, so routes never add a compiled shape), None when none has
  any; mixed shapes raise."""
  shapes = {s.routes.shape[1:] for s in seqs if s.routes is not None}
  if len(shapes) > 1:
    raise errors.RolloutError(f"sequences carry routes of different shapes {sorted(shapes)} "
                              "[L_moe, k]; batch trajectories of one policy together.")
  if not shapes:
    return None
  return shapes.pop(), np.result_type(*[s.routes.dtype for s in seqs if s.routes is not None])


def _empty_arrays(length: int, routes: RouteLayout | None,
                  demo: bool = False) -> dict[str, np.ndarray]:
  """One row's zero arrays (routes -1: none recorded; ``demo``: with a zero DEMO_KEY)."""
  a = {k: np.zeros(length, np.float32 if k in ("loss_mask", "advantages", "rollout_logp")
                   else np.int32) for k in KEYS}
  if demo:
    a[DEMO_KEY] = np.zeros(length, np.float32)
  if routes is not None:
    a[ROUTES_KEY] = np.full((length, *routes[0]), -1, routes[1])
  return a


def _put_routes(a: dict, sl: slice, s: TrainSequence, start: int = 0):
  """Copies ``s.routes[start:]`` into the row's routes at ``sl`` (nothing without routes)."""
  if ROUTES_KEY in a and s.routes is not None:
    a[ROUTES_KEY][sl] = s.routes[start:start + sl.stop - sl.start]


def _put_demo(a: dict, sl: slice, s: TrainSequence):
  """Marks a replayed demonstration's tokens in the row's DEMO_KEY (when the row has one)."""
  if DEMO_KEY in a and s.demo:
    a[DEMO_KEY][sl] = 1.0


def _stack(rows: list[dict]) -> dict[str, np.ndarray]:
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


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


def _row_arrays(row: list[TrainSequence], length: int,
                routes: RouteLayout | None = None, demo: bool = False) -> dict[str, np.ndarray]:
  a = _empty_arrays(length, routes, demo)
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
    _put_demo(a, sl, s)
    _put_routes(a, sl, s)
    off += n
  return a


def make_batches(seqs: Iterable[TrainSequence], *, buckets: Sequence[int], rows_per_batch: int,
                 pack: bool = False, with_demo: bool | None = None
                 ) -> tuple[list[dict[str, np.ndarray]], collections.Counter]:
  """Packs sequences into batches ``{key: [rows_per_batch, T]}`` with T from ``buckets``.

  ``with_demo``: whether the batches carry ``DEMO_KEY`` (default: when a sequence is a demo).

  Returns the batches (each an optimizer update) and counters: ``sequences``, ``tokens``,
  ``truncated`` (sequences cut to the largest bucket), ``padding_rows``.
  """
  buckets = sorted(int(b) for b in buckets)
  if not buckets or rows_per_batch < 1:
    raise errors.ConfigError("batching needs at least one bucket and rows_per_batch >= 1.")
  stats = collections.Counter()
  seqs = list(seqs)
  routes = route_layout(seqs)
  demo = any(s.demo for s in seqs) if with_demo is None else bool(with_demo)
  by_bucket: dict[int, list[TrainSequence]] = collections.defaultdict(list)
  for s in seqs:
    if len(s.token_ids) > buckets[-1]:
      stats["truncated"] += 1
      cut = buckets[-1]
      s = dataclasses.replace(s, token_ids=s.token_ids[:cut], loss_mask=s.loss_mask[:cut],
                              logprobs=s.logprobs[:cut],
                              routes=None if s.routes is None else s.routes[:cut])
    if not any(s.loss_mask):
      stats["no_trainable_tokens"] += 1
      continue
    stats["sequences"] += 1
    stats["tokens"] += len(s.token_ids)
    by_bucket[_bucket(buckets, len(s.token_ids))].append(s)
  batches = []
  for length in sorted(by_bucket):
    rows = [_row_arrays(r, length, routes, demo) for r in _rows(by_bucket[length], length, pack)]
    for i in range(0, len(rows), rows_per_batch):
      chunk = rows[i:i + rows_per_batch]
      pad = rows_per_batch - len(chunk)
      stats["padding_rows"] += pad
      chunk += [_row_arrays([], length, routes, demo)] * pad
      batches.append(_stack(chunk))
  return batches, stats


def _first_trained(s: TrainSequence) -> int:
  return next((i for i, m in enumerate(s.loss_mask) if m), len(s.loss_mask))


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
  n = min(len(a), len(b), limit)
  for i in range(n):
    if a[i] != b[i]:
      return i
  return n


def shared_prompt_length(seqs: Sequence[TrainSequence]) -> int:
  """Leading tokens that every sequence has in common and trains on none of (a harness's
  system prompt and tool list): what ``share_prompt`` rows can compute once."""
  if not seqs:
    return 0
  first = seqs[0].token_ids
  return min(min(_common_prefix(first, s.token_ids, len(first)), _first_trained(s)) for s in seqs)


def _grouped_row(members: list[TrainSequence], shared: int, prefix_len: int, branch_len: int,
                 branches: int, routes: RouteLayout | None = None,
                 demo: bool = False) -> dict[str, np.ndarray]:
  """One row: ``members[0]``'s first ``shared - 1`` tokens, then each member from token
  ``shared - 1`` on (the last shared token is repeated so it predicts its branch's first token).
  The shared prompt's routes are ``members[0]``'s (the same tokens, so the same routes when the
  members were sampled by one policy version; the prefix cache copies them)."""
  length = prefix_len + branches * branch_len
  a = _empty_arrays(length, routes, demo)
  n = shared - 1
  if members:
    a["input_ids"][:n] = members[0].token_ids[:n]
    _put_routes(a, slice(0, n), members[0])
  a["positions"][:n] = np.arange(n)
  a["segment_ids"][:n] = 1
  for j, s in enumerate(members):
    tail = len(s.token_ids) - n
    sl = slice(prefix_len + j * branch_len, prefix_len + j * branch_len + tail)
    a["input_ids"][sl] = s.token_ids[n:]
    a["positions"][sl] = np.arange(n, len(s.token_ids))
    a["segment_ids"][sl] = 2 + j
    a["loss_mask"][sl] = s.loss_mask[n:]
    a["advantages"][sl] = s.advantage
    a["rollout_logp"][sl] = s.logprobs[n:]
    _put_demo(a, sl, s)
    _put_routes(a, sl, s, start=n)
  return a


def make_grouped_batches(seqs: Iterable[TrainSequence], *, prefix_len: int, branch_len: int,
                         branches: int, rows_per_batch: int, min_shared: int = 2,
                         with_demo: bool | None = None
                         ) -> tuple[list[dict[str, np.ndarray]], list[TrainSequence], collections.Counter]:
  """Rows of one shared prompt (``prefix_len`` slots) and ``branches`` branches of
  ``branch_len`` tokens, for sequences that share a prompt.

  Sequences are sorted by their tokens and taken greedily into rows while the row's members
  still share at least ``min_shared`` leading tokens, none of which is trained (a trained
  token carries its own sequence's advantage, so it cannot be shared), and every branch fits.
  Returns ``(batches, rest, stats)``: ``rest`` are the sequences that share with no other or
  do not fit (batch them with ``make_batches``); ``stats`` counts ``sequences``, ``rows``,
  ``tokens`` (as computed, the prompt once per row) and ``unshared_tokens`` (as plain rows
  would compute them) and ``no_trainable_tokens`` (sequences left out: nothing sampled in
  them). Each batch maps ``LAYOUT_KEY`` to ``(prefix_len, branch_len)``.
  """
  if prefix_len < 1 or branch_len < 2 or branches < 2 or rows_per_batch < 1 or min_shared < 2:
    raise errors.ConfigError(
        "grouped batches need prefix_len >= 1, branch_len >= 2, branches >= 2, "
        "rows_per_batch >= 1 and min_shared >= 2.")
  stats = collections.Counter()
  rows, rest = [], []
  order = []
  seqs = list(seqs)
  routes = route_layout(seqs)
  demo = any(s.demo for s in seqs) if with_demo is None else bool(with_demo)
  for s in seqs:
    if not any(s.loss_mask):
      stats["no_trainable_tokens"] += 1  # nothing to learn from; counted as make_batches does
      continue
    # the longest prompt this sequence could share leaves it too long for a branch
    if len(s.token_ids) - min(_first_trained(s), prefix_len + 1) + 1 > branch_len:
      rest.append(s)
    else:
      order.append(s)
  order.sort(key=lambda s: s.token_ids)
  members, shared = [], 0

  def close():
    if len(members) >= 2:
      rows.append(_grouped_row(members, shared, prefix_len, branch_len, branches, routes, demo))
      stats["sequences"] += len(members)
      stats["rows"] += 1
      stats["tokens"] += shared - 1 + sum(len(m.token_ids) - shared + 1 for m in members)
      stats["unshared_tokens"] += sum(len(m.token_ids) for m in members)
    else:
      rest.extend(members)

  for s in order:
    if members and len(members) < branches:
      c = min(shared, _common_prefix(members[0].token_ids, s.token_ids, shared), _first_trained(s))
      if c >= min_shared and all(len(m.token_ids) - c + 1 <= branch_len for m in members + [s]):
        members.append(s)
        shared = c
        continue
    close()
    members = [s]
    shared = min(_first_trained(s), prefix_len + 1)
  close()
  empty = _grouped_row([], 1, prefix_len, branch_len, branches, routes, demo)
  batches = []
  for i in range(0, len(rows), rows_per_batch):
    chunk = rows[i:i + rows_per_batch]
    stats["padding_rows"] += rows_per_batch - len(chunk)
    chunk += [empty] * (rows_per_batch - len(chunk))
    batch = _stack(chunk)
    batch[LAYOUT_KEY] = np.asarray([prefix_len, branch_len], np.int32)
    batches.append(batch)
  return batches, rest, stats
