"""Pure device steps of the sampler: chunked prefill and a multi-token decode loop.

Both take the model as ``(graphdef, state)`` (``nnx.split`` once on the host, ``nnx.merge``
inside the trace), so new parameters of the same shapes never trigger a recompile.

Both work on a *window* of the full cache (``sampling.cache``): rows ``[:rows]`` (decode) or
gathered rows (prefill), the scratch slots and positions ``[:attn_len]``; and write it back. Attention cost
therefore follows the longest live sequence (rounded up to a bucket), not ``max_len``; the
decode loop updates its window in place (a test checks the compiled loop holds no cache copy).
Callers choose ``attn_len`` > every position the call touches. ``PREFILL`` / ``DECODE`` /
``SWAP_ROWS`` are the jitted forms, shared by every engine (one executable per model shape and
bucket), with the cache donated.

Window buffers: slicing a window out of the cache makes XLA allocate it afresh on every call, and
on CPU a fresh allocation of tens of MB is new pages from the kernel: page faults cost more than
the copy itself (a 16-row, 128-slot decode call spent ~8 of ~13 ms on them with no step run).
Both steps therefore take an optional donated ``window_buffer`` of the window's shape, build the
window in it, and hand it back as an extra last output for the caller to pass next time.

Cache protocol: a row's K/V is valid for positions ``0..p-1`` when its next input token sits
at position ``p``. Prefill writes a prompt *except its last token*; the decode loop feeds that
last token, so every sampled token (the first one too) comes out of the same decode step.
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from legorl_jax.sampling.cache import (K_SLOT_AXIS, ROUTE_SLOT_AXIS, SCRATCH, V_SLOT_AXIS, Cache,
                                       forward)
from legorl_jax import errors
from legorl_jax.sampling import shared_prefix
from legorl_jax.sampling.sample import row_keys, sample_tokens


class DecodeRows(NamedTuple):
  """Per-row decode state; all arrays have leading dim ``rows``.

  tokens: int32 [R] next input token. positions: int32 [R] its position, -1 = inactive row.
  remaining: int32 [R] tokens still allowed (max_tokens budget). temperature, top_p: float32 [R].
  top_k: int32 [R]. seeds: uint32 [R]. stop_ids: int32 [R, S] stop token ids, -1 padded.
  """

  tokens: jax.Array
  positions: jax.Array
  remaining: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  top_k: jax.Array
  seeds: jax.Array
  stop_ids: jax.Array


def prefill(graphdef, state, cache: Cache, slots: jax.Array, ids: jax.Array,
            positions: jax.Array, *, attn_len: int, window_buffer: Cache | None = None,
            fused=None):
  """Writes K/V for a chunk of prompt tokens into some cache rows.

  Args:
    graphdef, state: ``nnx.split`` of a Decoder.
    cache: full cache (``sampling.cache`` layout), N rows of S slots.
    slots: int32 [P] cache row of each chunk row; ``>= N`` marks a padding row.
    ids: int32 [P, T] tokens; positions: int32 [P, T] absolute positions, -1 = padding.
    attn_len: static window length, > every position in ``positions``.
    window_buffer: optional (donated) ``window_shapes(cache, P, attn_len)`` arrays to build the
      window in (see the module docstring).
    fused: optional ``sampling.fused.fuse(graphdef, state)`` (one matmul for q|k|v and gate|up).
  Returns:
    The updated full cache, or ``(cache, window)`` when ``window_buffer`` is given.
  """
  model = nnx.merge(graphdef, state)
  sub = _into(window_buffer, cache.window(slots, attn_len))
  _, sub = forward(model, ids, positions, sub, fused)
  cache = cache.put_window(slots, sub)
  return cache if window_buffer is None else (cache, sub)


def window_shapes(cache: Cache, rows: int, attn_len: int) -> Cache:
  """ShapeDtypeStructs of ``cache.window`` of ``rows`` rows and ``attn_len`` positions."""
  def shape(x, axis):
    dims = list(x.shape)
    dims[0], dims[axis] = rows, SCRATCH + attn_len
    return jax.ShapeDtypeStruct(tuple(dims), x.dtype)
  return Cache(k=tuple(shape(x, K_SLOT_AXIS) for x in cache.k),
               v=tuple(shape(x, V_SLOT_AXIS) for x in cache.v),
               routes=None if cache.routes is None else shape(cache.routes, ROUTE_SLOT_AXIS))


def squeeze(window: Cache) -> Cache:
  """A one-row window's shapes without the batch axis (how the one-row decode loop carries it)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), window)


def decode_window_shapes(cache: Cache, num_rows: int, attn_len: int,
                         prefix_len: int = 0) -> Cache:
  """The shapes of ``decode_steps``' window buffer: ``window_shapes``, squeezed for one row
  (with a shared prefix, the suffix window of ``attn_len - prefix_len`` positions)."""
  shapes = window_shapes(cache, num_rows, attn_len - prefix_len)
  return squeeze(shapes) if num_rows == 1 else shapes


def _into(buffer: Cache | None, window: Cache) -> Cache:
  """The window written into ``buffer`` (in place when it is donated), or the window itself."""
  if buffer is None:
    return window
  return jax.tree.map(lambda b, w: jax.lax.dynamic_update_slice(b, w, (0,) * b.ndim),
                      buffer, window)


def decode_steps(graphdef, state, cache: Cache, rows: DecodeRows, *, num_rows: int,
                 attn_len: int, num_steps: int, window_buffer: Cache | None = None,
                 fused=None, groups: shared_prefix.Groups | None = None, prefix_len: int = 0):
  """Runs up to ``num_steps`` sampling steps for cache rows ``[0, num_rows)`` on device (fewer
  when every row finishes first).

  A row stops (position -> -1) after sampling one of its stop ids or exhausting ``remaining``.
  Callers guarantee ``position + num_steps <= attn_len`` for active rows.

  Args:
    graphdef, state: ``nnx.split`` of a Decoder.
    cache: full cache (``sampling.cache`` layout), N rows of S slots.
    rows: DecodeRows of the first ``num_rows`` cache rows.
    num_rows, attn_len, num_steps: static window and loop sizes.
    window_buffer: optional (donated) arrays of the window's shapes to carry the loop's window
      in: ``decode_window_shapes(cache, num_rows, attn_len)`` (see the module docstring).
    fused: optional ``sampling.fused.fuse(graphdef, state)`` (one matmul for q|k|v and gate|up).
    groups, prefix_len: shared-prompt attention (``sampling.shared_prefix``): each group's
      positions ``[0, prefix_len)`` are read from its leader's row, gathered once before the
      loop; the loop's window holds only ``[prefix_len, attn_len)``. Callers guarantee every
      active row's position is >= ``prefix_len`` and its ``[0, prefix_len)`` K/V equals its
      leader's. ``prefix_len`` 0: plain attention.

  Returns:
    (cache, rows, out_ids int32 [K, R], out_logp float32 [K, R]); ``out_ids`` is -1 where the
    row was inactive at that step. With ``window_buffer``, the loop's final window follows as a
    fifth output (the buffer for the next call).
  """
  model = nnx.merge(graphdef, state)
  prefix = None
  if prefix_len:
    if groups is None or num_rows == 1:
      raise errors.SamplingError("decode_steps: prefix_len needs groups and more than one row")
    prefix = shared_prefix.gather(cache, prefix_len, groups)
    sub = shared_prefix.suffix_window(cache, num_rows, prefix_len, attn_len)
  else:
    sub = cache.window(num_rows, attn_len)
  # One row carries its cache without the batch axis (see ``cache.forward``).
  squeeze = num_rows == 1
  if squeeze:
    sub = jax.tree.map(lambda x: x[0], sub)
  sub = _into(window_buffer, sub)
  n, k = num_rows, num_steps

  def step(i, carry):
    sub, r, out_ids, out_logp = carry
    active = r.positions >= 0
    hidden, sub = forward(model, r.tokens[:, None], r.positions[:, None], sub, fused, prefix)
    logits = model.logits_from_hidden(hidden[:, 0])
    keys = row_keys(r.seeds, jnp.maximum(r.positions, 0))
    # Inactive rows (idle, or finished) count as greedy: their tokens are dropped, and a batch
    # whose live rows are all greedy then skips the sampler's draw.
    temperature = jnp.where(active, r.temperature, 0.0)
    ids, logp = sample_tokens(logits, keys, temperature, r.top_p, r.top_k)
    remaining = r.remaining - active.astype(jnp.int32)
    hit_stop = jnp.any(ids[:, None] == r.stop_ids, axis=-1)
    done = active & (hit_stop | (remaining <= 0))
    r = r._replace(
        tokens=jnp.where(active, ids, r.tokens),
        positions=jnp.where(active & ~done, r.positions + 1, -1),
        remaining=remaining)
    out_ids = out_ids.at[i].set(jnp.where(active, ids, -1))
    out_logp = out_logp.at[i].set(jnp.where(active, logp, 0.0))
    return sub, r, out_ids, out_logp

  # Stops early once every row has finished (a stop token or its budget mid-chunk), so a
  # request that ends on its 3rd token does not pay for the chunk's other steps.
  def cond(carry):
    i, (_, r, _, _) = carry
    return (i < k) & jnp.any(r.positions >= 0)

  def body(carry):
    i, c = carry
    return i + 1, step(i, c)

  init = (sub, rows, jnp.full((k, n), -1, jnp.int32), jnp.zeros((k, n), jnp.float32))
  _, (sub, rows, out_ids, out_logp) = jax.lax.while_loop(cond, body, (jnp.int32(0), init))
  carried = sub
  if squeeze:
    sub = jax.tree.map(lambda x: x[None], sub)
  if prefix is None:
    cache = cache.put_window(num_rows, sub)
  else:
    cache = shared_prefix.put_suffix_window(cache, prefix_len, sub)
  if window_buffer is None:
    return cache, rows, out_ids, out_logp
  return cache, rows, out_ids, out_logp, carried


def swap_rows(cache: Cache, i: jax.Array, j: jax.Array) -> Cache:
  """Exchanges cache rows ``i`` and ``j`` (int32 scalars), every layer, K and V (and routes)."""
  def swap(x):
    xi = jax.lax.dynamic_index_in_dim(x, i, keepdims=True)
    xj = jax.lax.dynamic_index_in_dim(x, j, keepdims=True)
    x = jax.lax.dynamic_update_index_in_dim(x, xj, i, 0)
    return jax.lax.dynamic_update_index_in_dim(x, xi, j, 0)
  return jax.tree.map(swap, cache)


def copy_prefix(cache: Cache, src: jax.Array, dst: jax.Array, *, attn_len: int) -> Cache:
  """Copies slots ``[0, SCRATCH + attn_len)`` of row ``src`` into row ``dst`` (int32 scalars),
  every layer, K and V (and the routes, when the cache keeps them): how one row starts from
  the prefix another row (or the prefix store) holds. Slots past the source's valid prefix carry its stale K/V along; the destination
  overwrites them before any query can attend to them (``cache.forward``'s mask)."""
  def copy(x, axis):
    row = jax.lax.dynamic_index_in_dim(x, src, keepdims=True)
    row = jax.lax.slice_in_dim(row, 0, SCRATCH + attn_len, axis=axis)
    return jax.lax.dynamic_update_slice(x, row, (dst,) + (0,) * (x.ndim - 1))
  return Cache(k=tuple(copy(x, K_SLOT_AXIS) for x in cache.k),
               v=tuple(copy(x, V_SLOT_AXIS) for x in cache.v),
               routes=None if cache.routes is None else copy(cache.routes, ROUTE_SLOT_AXIS))


def row_routes(routes: jax.Array, row: jax.Array) -> jax.Array:
  """Row ``row`` (an int32 scalar) of the route cache: ``[SCRATCH + S, L_moe, k]``."""
  return jax.lax.dynamic_index_in_dim(routes, row, keepdims=False)


# Process-wide: a trace means one new compiled shape (the Python body runs only when tracing).
COMPILATIONS: collections.Counter = collections.Counter()


def _counted(name, fn):
  @functools.wraps(fn)
  def traced(*args, **kwargs):
    COMPILATIONS[name] += 1
    return fn(*args, **kwargs)
  return traced


# graphdef (arg 0) is static; the cache and window buffers are donated and updated in place.
PREFILL = jax.jit(_counted("prefill", prefill), static_argnums=(0,),
                  static_argnames=("attn_len",), donate_argnames=("cache", "window_buffer"))
SWAP_ROWS = jax.jit(_counted("swap_rows", swap_rows), donate_argnums=(0,))
COPY_PREFIX = jax.jit(_counted("copy_prefix", copy_prefix), static_argnames=("attn_len",),
                      donate_argnums=(0,))
ROW_ROUTES = jax.jit(_counted("row_routes", row_routes))
DECODE = jax.jit(_counted("decode", decode_steps), static_argnums=(0,),
                 static_argnames=("num_rows", "attn_len", "num_steps", "prefix_len"),
                 donate_argnames=("cache", "window_buffer"))
