"""Per-row token sampling: greedy, temperature, top-k and top-p in one jitted function.

Every sampling parameter is a ``[B]`` array, so one compiled step serves a batch that mixes
greedy and stochastic requests.

Recorded logprob convention (what the learner recomputes):
  * temperature > 0: ``log_softmax(logits / temperature)[token]`` -- the *untruncated*
    tempered distribution; top-k / top-p only restrict which tokens can be drawn.
  * temperature == 0 (greedy): ``log_softmax(logits)[token]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Temperatures at or below this are treated as greedy.
GREEDY_EPS = 1e-6


def row_keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
  """One PRNG key per row from a per-request seed and the sampled position.

  seeds: uint32 [B]; positions: int32 [B] -> keys [B, 2] uint32. A token's randomness depends
  only on its request's seed and its position, never on which other requests share the batch.
  """
  return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.PRNGKey(s), p))(seeds, positions)


def truncation_mask(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
  """Which tokens survive top-k then top-p (top-p over the renormalised top-k mass).

  scaled: float32 [B, V] tempered logits; top_p: float32 [B] in (0, 1]; top_k: int32 [B]
  (<= 0 disables). Returns bool [B, V]. The most likely token always survives; tokens tied
  with the last kept logit are kept too.
  """
  v = scaled.shape[-1]
  sorted_desc = -jnp.sort(-scaled, axis=-1)
  rank = jnp.arange(v, dtype=jnp.int32)[None, :]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)[:, None]
  in_k = rank < k
  probs = jax.nn.softmax(jnp.where(in_k, sorted_desc, -jnp.inf), axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = in_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0))
  keep = keep | (rank == 0)
  n_keep = jnp.sum(keep, axis=-1)
  threshold = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)
  return scaled >= threshold


def first_argmax(x: jax.Array) -> jax.Array:
  """``jnp.argmax(x, axis=-1)`` (first maximum; first NaN if any) as two plain reductions.

  x: float32 [B, V] -> int32 [B]. XLA:CPU runs argmax as one variadic (value, index) reduction
  that does not vectorise: ~6x slower at [16, 8192] than a max followed by a min over indices.
  """
  m = jnp.max(x, axis=-1, keepdims=True)
  return first_true((x == m) | jnp.isnan(x))


def first_true(mask: jax.Array) -> jax.Array:
  """Index of the first True along the last axis (bool [B, V] -> int32 [B]; V where none)."""
  iota = jax.lax.broadcasted_iota(jnp.int32, mask.shape, mask.ndim - 1)
  return jnp.min(jnp.where(mask, iota, mask.shape[-1]), axis=-1)


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array,
                  top_k: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row.

  Args:
    logits: float32 [B, V].
    keys: uint32 [B, 2] per-row PRNG keys (see ``row_keys``).
    temperature: float32 [B]; <= GREEDY_EPS means greedy (argmax).
    top_p: float32 [B] in (0, 1]; 1 disables.
    top_k: int32 [B]; <= 0 disables.
  Returns:
    (ids int32 [B], logprobs float32 [B]) with the logprob convention of this module.
  """
  logits = logits.astype(jnp.float32)
  greedy = temperature <= GREEDY_EPS
  scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
  logp_all = jax.nn.log_softmax(scaled, axis=-1)
  greedy_ids = first_argmax(logits)

  def draw():
    needs_trunc = jnp.any(~greedy & ((top_p < 1.0) | (top_k > 0)))
    allowed = jax.lax.cond(needs_trunc, lambda: truncation_mask(scaled, top_p, top_k),
                           lambda: jnp.ones(scaled.shape, bool))
    # Inverse-CDF draw: one uniform per row instead of V Gumbel variates (the RNG dominated).
    cdf = jnp.cumsum(jnp.where(allowed, jnp.exp(logp_all), 0.0), axis=-1)
    u = jax.vmap(lambda key: jax.random.uniform(key, dtype=jnp.float32))(keys) * cdf[:, -1]
    above = cdf > u[:, None]  # first such index is the draw; none only by rounding at u ~ total
    return jnp.where(above[:, -1], first_true(above), first_argmax(scaled))

  # An all-greedy batch (evaluation, the benchmarks) skips the draw's passes over the vocab.
  drawn = jax.lax.cond(jnp.any(~greedy), draw, lambda: greedy_ids)
  ids = jnp.where(greedy, greedy_ids, drawn).astype(jnp.int32)
  logp = jnp.take_along_axis(logp_all, ids[:, None], axis=-1)[:, 0]
  return ids, logp
