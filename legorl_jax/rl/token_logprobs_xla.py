"""Portable chunked implementation of the lm-head vocabulary statistics (XLA loops).

For ``z = hidden @ lm_head / temperature`` over one vocabulary slice this computes, per
token, without ever holding the [N, V] logits:

  lse [N] = log sum_j exp(z_j)
  ez  [N] = sum_j softmax(z)_j z_j           (so entropy = lse - ez)
  zy  [N] = z_target if the target lies in this slice, else 0

with an online log-sum-exp over vocab chunks (running max, running sum of exp and of
exp * z). The backward recomputes each chunk's logits from the saved per-token ``lse`` and
``ez``. The cotangent of the logits, for cotangents (g_lse, g_ez, g_zy), is

  dz_j = q_j (g_lse + g_ez (1 + z_j - ez)) + g_zy [j == target],   q = softmax(z).

Loops run vocab-outer / token-inner so each lm-head column block is sliced once. Sizes that
are not multiples of the chunks are handled without padding copies: the last chunk is
clamped to end at the array's edge and the columns (or rows) it shares with the previous
chunk are masked out.
"""

from typing import Tuple

import jax
import jax.numpy as jnp

Array = jax.Array


def _chunks(size: int, chunk: int) -> Tuple[int, int]:
  chunk = max(1, min(chunk, size))
  return chunk, -(-size // chunk)


def _col_block(w: Array, j: Array, vc: int):
  """Clamped vocab block j: (W[:, start:start+vc], column ids [vc], fresh-column mask [vc])."""
  v = w.shape[1]
  start = jnp.minimum(j * vc, v - vc)
  cols = start + jnp.arange(vc, dtype=jnp.int32)
  return jax.lax.dynamic_slice_in_dim(w, start, vc, axis=1), start, cols, cols >= j * vc


def _row_start(i: Array, tc: int, n: int) -> Array:
  return jnp.minimum(i * tc, n - tc)


def vary_like(x: Array, *refs: Array) -> Array:
  """Marks a fresh array (a loop init) as varying over the mesh axes its inputs vary over,
  so loop carries type-check inside ``shard_map``; a no-op outside it."""
  axes = set()
  for r in refs:
    axes |= _varying(r)
  missing = tuple(sorted(axes - _varying(x)))
  return jax.lax.pcast(x, missing, to="varying") if missing else x


def _varying(x: Array) -> set:
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return set(mat.varying)
  return set(getattr(aval, "vma", ()))


def _logits(h: Array, w: Array, temperature: float) -> Array:
  z = jnp.dot(h, w, preferred_element_type=jnp.float32)
  return z / temperature if temperature != 1.0 else z


def stats_fwd(hidden: Array, lm_head: Array, targets: Array, *, temperature: float,
              token_chunk: int, vocab_chunk: int) -> Tuple[Array, Array, Array]:
  """Per-token (lse, ez, zy), each [N] f32, for hidden [N, D], lm_head [D, V], targets [N]
  (indices into this lm_head's columns; out-of-range targets give zy = 0)."""
  n, v = hidden.shape[0], lm_head.shape[1]
  tc, nt = _chunks(n, token_chunk)
  vc, nv = _chunks(v, vocab_chunk)
  targets = targets.astype(jnp.int32)

  def vocab_step(j, state):
    w_j, _, cols, fresh = _col_block(lm_head, j, vc)

    def token_step(i, state):
      m, s, t, zy = state
      r0 = _row_start(i, tc, n)
      sl = lambda x: jax.lax.dynamic_slice_in_dim(x, r0, tc)
      z = _logits(sl(hidden), w_j, temperature)
      z_real = jnp.where(fresh[None, :], z, 0.0)
      z = jnp.where(fresh[None, :], z, -jnp.inf)
      m_old = sl(m)
      m_new = jnp.maximum(m_old, jnp.max(z, axis=1))
      scale = jnp.exp(m_old - m_new)
      p = jnp.exp(z - m_new[:, None])
      s_new = sl(s) * scale + jnp.sum(p, axis=1)
      t_new = sl(t) * scale + jnp.sum(p * z_real, axis=1)
      hit = fresh[None, :] & (cols[None, :] == sl(targets)[:, None])
      zy_new = sl(zy) + jnp.sum(jnp.where(hit, z_real, 0.0), axis=1)
      # Rows shared with the previous (clamped) token chunk already saw this vocab block.
      rows_fresh = (r0 + jnp.arange(tc)) >= i * tc
      up = lambda x, u: jax.lax.dynamic_update_slice_in_dim(
          x, jnp.where(rows_fresh, u, sl(x)), r0, 0)
      return up(m, m_new), up(s, s_new), up(t, t_new), up(zy, zy_new)

    return jax.lax.fori_loop(0, nt, token_step, state)

  init = (jnp.full((n,), -jnp.inf, jnp.float32), jnp.zeros((n,), jnp.float32),
          jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.float32))
  init = tuple(vary_like(x, hidden, lm_head, targets) for x in init)
  m, s, t, zy = jax.lax.fori_loop(0, nv, vocab_step, init)
  return m + jnp.log(s), t / s, zy


def logits_cotangent(z: Array, fresh: Array, hit: Array, lse: Array, ez: Array,
                     g_lse: Array, g_ez: Array, g_zy: Array) -> Array:
  """dz [tc, vc] for a logits block z (see module docstring); masked columns get 0."""
  z_real = jnp.where(fresh, z, 0.0)
  q = jnp.where(fresh, jnp.exp(z_real - lse[:, None]), 0.0)
  dz = q * (g_lse[:, None] + g_ez[:, None] * (1.0 + z_real - ez[:, None]))
  return dz + jnp.where(hit, g_zy[:, None], 0.0)


def stats_bwd(hidden: Array, lm_head: Array, targets: Array, lse: Array, ez: Array,
              g_lse: Array, g_ez: Array, g_zy: Array, *, temperature: float,
              token_chunk: int, vocab_chunk: int) -> Tuple[Array, Array]:
  """(d hidden [N, D], d lm_head [D, V]) in the inputs' dtypes, by chunked recomputation."""
  n, d = hidden.shape
  v = lm_head.shape[1]
  tc, nt = _chunks(n, token_chunk)
  vc, nv = _chunks(v, vocab_chunk)
  targets = targets.astype(jnp.int32)
  inv_t = 1.0 / temperature

  def vocab_step(j, carry):
    dh, dw = carry
    w_j, c0, cols, fresh = _col_block(lm_head, j, vc)

    def token_step(i, inner):
      dh, dw_j = inner
      r0 = _row_start(i, tc, n)
      sl = lambda x: jax.lax.dynamic_slice_in_dim(x, r0, tc)
      h_i = sl(hidden)
      z = _logits(h_i, w_j, temperature)
      hit = fresh[None, :] & (cols[None, :] == sl(targets)[:, None])
      dz = logits_cotangent(z, fresh[None, :], hit, sl(lse), sl(ez), sl(g_lse), sl(g_ez),
                            sl(g_zy)) * inv_t
      # Rows shared with the previous (clamped) token chunk were already counted.
      rows_fresh = (r0 + jnp.arange(tc)) >= i * tc
      h_fresh = jnp.where(rows_fresh[:, None], h_i, 0).astype(jnp.float32)
      dw_j = dw_j + jnp.dot(h_fresh.T, dz, preferred_element_type=jnp.float32)
      dh_i = jnp.dot(dz, w_j.T.astype(jnp.float32), preferred_element_type=jnp.float32)
      dh_i = jnp.where(rows_fresh[:, None], dh_i, 0.0)
      dh = jax.lax.dynamic_update_slice_in_dim(dh, sl(dh) + dh_i, r0, 0)
      return dh, dw_j

    dw_j = vary_like(jnp.zeros((d, vc), jnp.float32), hidden, lm_head, targets, g_lse)
    dh, dw_j = jax.lax.fori_loop(0, nt, token_step, (dh, dw_j))
    old = jax.lax.dynamic_slice_in_dim(dw, c0, vc, axis=1)
    dw = jax.lax.dynamic_update_slice_in_dim(dw, old + dw_j.astype(dw.dtype), c0, 1)
    return dh, dw

  init = (jnp.zeros((n, d), jnp.float32), jnp.zeros((d, v), jnp.float32))
  init = tuple(vary_like(x, hidden, lm_head, targets, g_lse) for x in init)
  dh, dw = jax.lax.fori_loop(0, nv, vocab_step, init)
  return dh.astype(hidden.dtype), dw.astype(lm_head.dtype)
