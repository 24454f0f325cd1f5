"""Sequence bookkeeping for packed rows and the loss aggregation modes.

Token arrays are [B, T]. ``segment_ids [B, T]`` int numbers the sequences packed in a row
(1, 2, ...; 0 = padding); a sequence is a (row, segment id) pair, so ids may repeat across
rows. ``segment_ids=None`` means one sequence per row. A token counts when its loss mask is
non-zero and its segment id is non-zero; a sequence counts when it has a counted token.

Every aggregation returns ``(loss_sum, denom)`` so that summing both over micro-batches and
dividing once gives exactly the full-batch value (sequences never straddle rows, hence never
micro-batches):

=========================  ==========================================  ====================
mode                       loss_sum                                    denom
=========================  ==========================================  ====================
token-mean                 sum over tokens of l_t                      number of tokens
seq-mean-token-mean        sum over seqs of (mean over its tokens)     number of sequences
seq-mean-token-sum         sum over seqs of (sum over its tokens)      number of sequences
seq-mean-token-sum-norm    sum over seqs of (sum over tokens) / L      number of sequences
=========================  ==========================================  ====================

L (``max_len``) is a fixed constant (e.g. the generation budget), as in Dr. GRPO, so a
sequence's weight does not depend on its own length.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from legorl_jax.errors import ConfigError

Array = jax.Array

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")


def default_segment_ids(mask: Array) -> Array:
  """One sequence per row: [B, T] int32 of ones."""
  return jnp.ones(mask.shape, jnp.int32)


def token_mask(mask: Array, segment_ids: Optional[Array]) -> Array:
  """[B, T] f32: loss mask restricted to non-padding segments."""
  mask = jnp.asarray(mask)
  if not jnp.issubdtype(mask.dtype, jnp.floating):
    mask = mask.astype(jnp.float32)
  if segment_ids is None:
    return mask
  return mask * (segment_ids > 0).astype(mask.dtype)


def _flat_ids(segment_ids: Array) -> Tuple[Array, int]:
  """Unique id per (row, segment): [B, T] int32 and the static number of slots B * (T + 1)."""
  b, t = segment_ids.shape
  seg = jnp.clip(segment_ids.astype(jnp.int32), 0, t)
  rows = jnp.arange(b, dtype=jnp.int32)[:, None] * (t + 1)
  return rows + seg, b * (t + 1)


def sequence_sum(x: Array, segment_ids: Array) -> Array:
  """Per-sequence sums of ``x [B, T]``, broadcast back to each token: [B, T].

  Segment ids must lie in [0, T] (at most T sequences per row).
  """
  ids, n = _flat_ids(segment_ids)
  sums = jax.ops.segment_sum(x.reshape(-1), ids.reshape(-1), num_segments=n)
  return sums[ids]


def sequence_mean(x: Array, mask: Array, segment_ids: Optional[Array]) -> Array:
  """Masked per-sequence mean of ``x [B, T]`` broadcast to its tokens: [B, T] (0 if empty)."""
  if segment_ids is None:
    segment_ids = default_segment_ids(mask)
  m = token_mask(mask, segment_ids)
  tot = sequence_sum(x * m, segment_ids)
  cnt = sequence_sum(m, segment_ids)
  return tot / jnp.maximum(cnt, 1.0)


def sequence_count(mask: Array, segment_ids: Optional[Array]) -> Array:
  """Scalar f32: number of sequences with at least one counted token."""
  if segment_ids is None:
    segment_ids = default_segment_ids(mask)
  m = token_mask(mask, segment_ids)
  ids, n = _flat_ids(segment_ids)
  cnt = jax.ops.segment_sum(m.reshape(-1), ids.reshape(-1), num_segments=n)
  return jnp.sum((cnt > 0).astype(jnp.float32))


def aggregate(loss: Array, mask: Array, segment_ids: Optional[Array] = None, *,
              mode: str = "token-mean", max_len: Optional[float] = None) -> Tuple[Array, Array]:
  """Reduces per-token losses [B, T] to ``(loss_sum, denom)`` scalars (see module table)."""
  if segment_ids is None:
    segment_ids = default_segment_ids(mask)
  m = token_mask(mask, segment_ids)
  loss = jnp.where(m > 0, loss, 0.0)  # Keep NaN/inf of padding out of the sum.
  if mode == "token-mean":
    return jnp.sum(loss * m), jnp.sum(m)
  n_seq = sequence_count(m, segment_ids)
  if mode == "seq-mean-token-mean":
    cnt = sequence_sum(m, segment_ids)
    return jnp.sum(loss * m / jnp.maximum(cnt, 1.0)), n_seq
  if mode == "seq-mean-token-sum":
    return jnp.sum(loss * m), n_seq
  if mode == "seq-mean-token-sum-norm":
    if not max_len:
      raise ConfigError("aggregation 'seq-mean-token-sum-norm' needs max_len (the fixed "
                        "normalising length, e.g. the generation budget); set cfg.max_len.")
    return jnp.sum(loss * m) / float(max_len), n_seq
  raise ConfigError(f"unknown loss aggregation {mode!r}; choose one of {AGGREGATIONS}.")
