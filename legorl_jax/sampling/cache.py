"""The sampler's KV cache, head-major, and the cached forward pass that uses it.

``Decoder.decode`` keeps K/V as ``[B, S, Hkv, Dh]``; attention contracts per (row, head), so
on CPU/GPU XLA transposes the whole cache in every layer at every step. Here V is stored
``[B, Hkv, S, Dh]`` and K transposed, ``[B, Hkv, Dh, S]``: both attention contractions
(``q . K`` over Dh, ``p . V`` over S) are then plain row-major matrix products that stream the
cache once, with no transpose and no horizontal reductions (about 2x faster per decode step on
CPU than ``[B, Hkv, S, Dh]`` keys). The forward reuses the Decoder's own submodules (norms,
projections, RoPE, MLP), so only the cache glue lives here. Semantics are those of
``Decoder.decode``: a token writes K/V at its position (slot ``SCRATCH + position``) and
attends to every position <= its own; positions < 0 are padding, whose writes land in scratch. The tests check it against the
teacher-forced ``Decoder.__call__``.

Mixture-of-experts policies may also keep a *route cache* beside K/V (``Cache.routes``): the
experts each cached token was routed to in every sparse layer, written by the same step that
writes its K/V. Routes then travel with the K/V they produced (prefix copies, row swaps), so a
completion can report the routes of every token its logprobs depended on, reused prefixes
included (rollout routing replay, ``trainer.routing_replay``). Dense models, and engines that
do not record routes, carry ``routes=None``: no array, no work.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

from legorl_jax.models.config import ModelConfig


# Axis of the slot (position) dimension in K, V and the route cache.
K_SLOT_AXIS, V_SLOT_AXIS, ROUTE_SLOT_AXIS = 3, 2, 1
# Scratch slots in front of every row: position p lives in slot ``p + SCRATCH`` and padding
# tokens write their K/V into slot 0, so cache writes never need bounds checks (a masked "drop"
# write reads the old value back, and XLA then copies the whole cache at every decode step) and
# a window of the first slots is one plain slice. 16 slots keep positions 64-byte aligned.
SCRATCH = 16


@flax.struct.dataclass
class Cache:
  """Per-layer key/value slots: ``k[i]`` is ``[B, Hkv, Dh, SCRATCH + S]``, ``v[i]`` is
  ``[B, Hkv, SCRATCH + S, Dh]``; position ``p`` is stored in slot ``SCRATCH + p``.

  ``routes``: None, or the route cache ``[B, SCRATCH + S, L_moe, k]`` in ``config.route_dtype``
  (int8 up to 128 experts): slot ``SCRATCH + p`` holds the experts position ``p``'s token was
  routed to in each sparse layer. It costs ``L_moe * k`` bytes per slot next to K/V's
  ``2 * L * Hkv * Dh * itemsize`` (Qwen3-30B-A3B: 384 B against 96 KiB in bf16, 0.4%).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  routes: jax.Array | None = None

  @property
  def max_len(self) -> int:
    """Positions the cache holds (slots minus scratch)."""
    return self.v[0].shape[V_SLOT_AXIS] - SCRATCH

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, max_len: int, dtype=None,
            routes: bool = False) -> "Cache":
    """An empty cache; ``routes`` adds the route cache (mixture-of-experts models only)."""
    dtype = dtype or config.compute_dtype
    slots = SCRATCH + max_len
    kshape = (batch, config.num_kv_heads, config.head_dim, slots)
    vshape = (batch, config.num_kv_heads, slots, config.head_dim)
    route_cache = None
    if routes:
      rshape = (batch, slots, len(config.moe_layers), config.num_experts_per_tok)
      route_cache = jnp.full(rshape, -1, config.route_dtype)
    return cls(k=tuple(jnp.zeros(kshape, dtype) for _ in range(config.num_layers)),
               v=tuple(jnp.zeros(vshape, dtype) for _ in range(config.num_layers)),
               routes=route_cache)

  def window(self, rows, length: int) -> "Cache":
    """Positions ``[0, length)`` of some rows, with the scratch slots (a copy, unless it is the
    whole cache).

    rows: an int ``R`` (rows ``[0, R)``) or int32 ``[P]`` row indices (``>= B``: padding rows,
      whose window content is arbitrary).
    """
    def take(x, axis):
      x = jax.lax.slice_in_dim(x, 0, SCRATCH + length, axis=axis)
      if isinstance(rows, int):
        return x[:rows]
      # Rows >= B (padding) read a clipped row: their writes are dropped by put_window, and a
      # "fill" gather costs a select over the whole window.
      return jnp.take(x, rows, axis=0, mode="clip")
    return Cache(k=tuple(take(x, K_SLOT_AXIS) for x in self.k),
                 v=tuple(take(x, V_SLOT_AXIS) for x in self.v),
                 routes=None if self.routes is None else take(self.routes, ROUTE_SLOT_AXIS))

  def put_window(self, rows, sub: "Cache") -> "Cache":
    """Writes back a ``window(rows, length)``; rows ``>= B`` are dropped."""
    def put(full, w, axis):
      if isinstance(rows, int):
        return jax.lax.dynamic_update_slice(full, w, (0,) * full.ndim)
      index = (rows,) + (slice(None),) * (axis - 1) + (slice(0, w.shape[axis]),)
      return full.at[index].set(w, mode="drop")
    routes = None
    if self.routes is not None:
      routes = put(self.routes, sub.routes, ROUTE_SLOT_AXIS)
    return Cache(k=tuple(put(f, w, K_SLOT_AXIS) for f, w in zip(self.k, sub.k)),
                 v=tuple(put(f, w, V_SLOT_AXIS) for f, w in zip(self.v, sub.v)), routes=routes)


def attend(q: jax.Array, kt: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """Grouped-query attention of tokens whose K/V are already in the cache.

  q: [B, T, H, Dh]; kt: [B, Hkv, Dh, S]; v: [B, Hkv, S, Dh]; mask: [B, T, S] bool
  -> [B, T, H, Dh]. Scores and softmax in float32. With B == T == 1, kt and v may come without
  their batch axis ([Hkv, Dh, S], [Hkv, S, Dh]).

  Queries go head-major, [B, Hkv, G*T, Dh] (a small transpose), so both products are plain
  batched GEMMs with S minor; left to itself XLA computes ``K^T q`` and then transposes the
  [.., T, S] scores in the softmax pass. The 1/sqrt(Dh) scale goes on q and the softmax
  normalisation on the output, not on the scores: both are elementwise passes over the largest
  array of a prefill.
  """
  b, t, h, dh = q.shape
  if kt.ndim == 3:  # one row and one token, batch axis squeezed out of the cache (``forward``)
    kt, v = kt[None], v[None]
  hkv = kt.shape[1]
  g = h // hkv
  q = q * jnp.asarray(1.0 / math.sqrt(dh), q.dtype)
  qh = q.reshape(b, t, hkv, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, dh)
  scores = jnp.einsum("bkmd,bkds->bkms", qh, kt, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None], scores.reshape(b, hkv, g, t, -1),
                     jnp.finfo(jnp.float32).min)
  e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  total = jnp.sum(e, axis=-1, keepdims=True)
  e = e.reshape(b, hkv, g * t, -1).astype(v.dtype)
  out = jnp.einsum("bkms,bksd->bkmd", e, v, preferred_element_type=jnp.float32)
  out = (out.reshape(b, hkv, g, t, dh) / total).astype(q.dtype)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh)


def _write(x: jax.Array, new: jax.Array, slot: jax.Array, axis: int) -> jax.Array:
  """Stores ``new [B, T, Hkv, Dh]`` at ``slot [B, T]`` (in bounds) along ``axis`` of ``x``.

  ``x`` is ``[B, ...]`` with the slot axis ``axis``, or for one row ``[...]`` without the batch
  axis (slot axis ``axis - 1``).
  """
  new = new.astype(x.dtype)
  if x.ndim == 3:
    # One row, one token: a plain dynamic-update-slice of the squeezed cache (in place).
    upd = new[0, 0][:, :, None] if axis == K_SLOT_AXIS else new[0, 0][:, None, :]
    start = [0, 0, 0]
    start[axis - 1] = slot[0, 0]
    return jax.lax.dynamic_update_slice(x, upd, start)
  rows = jnp.arange(slot.shape[0])[:, None]
  # Advanced indices [B, T] around slices: the update is laid out [B, T, Hkv, Dh], as new is.
  if axis == K_SLOT_AXIS:
    index = (rows, slice(None), slice(None), slot)
  else:
    index = (rows, slice(None), slot)
  return x.at[index].set(new, mode="promise_in_bounds")


def _write_routes(routes: jax.Array, new: jax.Array, slot: jax.Array) -> jax.Array:
  """Stores ``new [B, T, L_moe, k]`` at ``slot [B, T]`` of the route cache ``[B, S, L_moe, k]``
  (or, for one row, ``[S, L_moe, k]`` without the batch axis)."""
  new = new.astype(routes.dtype)
  if routes.ndim == 3:
    return jax.lax.dynamic_update_slice(routes, new[0], (slot[0, 0], 0, 0))
  rows = jnp.arange(slot.shape[0])[:, None]
  return routes.at[rows, slot].set(new, mode="promise_in_bounds")


def forward(model, input_ids: jax.Array, positions: jax.Array, cache: Cache, fused=None,
            shared=None):
  """Runs new tokens of a ``Decoder`` against the cache.

  Args:
    model: a Decoder (merged inside the trace).
    input_ids: int32 [B, T]; positions: int32 [B, T] absolute positions, negative = padding.
    cache: a ``Cache.window`` (or a whole cache); every position < its ``max_len``. For one
      row and one token (B == T == 1) its arrays may come without the batch axis: the decode loop carries them so,
      because XLA otherwise fuses each cache write into two consumers of different shapes (the
      loop carry and the attention's reshaped operand) and copies every layer's cache at every
      step.
    When the cache has a route cache, each token's experts in every sparse layer are written
      at its slot too (padding tokens' land in scratch).
    fused: optional ``sampling.fused.fuse`` of the model: q|k|v and gate|up as one matmul
      each (the same function).
    shared: optional ``sampling.shared_prefix.Prefix`` (decode steps): ``cache`` is then a
      suffix window whose first slot after scratch holds position ``shared.offset``, and
      attention also covers the groups' shared prefix ``[0, offset)``.
  Returns:
    (hidden [B, T, D] final-normed, updated cache).
  """
  s = cache.v[0].shape[-2]
  offset = 0 if shared is None else shared.offset
  index = jnp.arange(s, dtype=jnp.int32)
  slots = jnp.where(index >= SCRATCH, index - SCRATCH + offset, -1)  # each slot's position
  mask = ((slots[None, None, :] >= 0) & (slots[None, None, :] <= positions[:, :, None])
          & (positions[:, :, None] >= 0))
  # padding writes into scratch
  slot = jnp.where(positions >= 0, positions - offset + SCRATCH, 0)
  x = model.embed_tokens(input_ids)
  ks, vs, routes = [], [], []
  b, t = input_ids.shape
  for i, block in enumerate(model.layers):
    f = None if fused is None else fused[i]
    qkv = None if f is None else (f.qkv, f.qkv_bias)
    q, k, v = block.attn.project_qkv(block.attn_norm(x), positions, fused=qkv)
    k_cache = _write(cache.k[i], k, slot, K_SLOT_AXIS)
    v_cache = _write(cache.v[i], v, slot, V_SLOT_AXIS)
    ks.append(k_cache)
    vs.append(v_cache)
    if shared is None:
      o = attend(q, k_cache.astype(x.dtype), v_cache.astype(x.dtype), mask)
    else:
      o = shared.attend(i, q, k_cache.astype(x.dtype), v_cache.astype(x.dtype), mask)
    x = x + block.attn.output(o)
    if cache.routes is not None and block.sparse:
      y, routing = block.mlp.routed(block.mlp_norm(x))
      routes.append(routing.experts.reshape(b, t, -1))
      x = x + y
    elif block.sparse:
      x = x + block.mlp(block.mlp_norm(x))
    else:
      x = x + block.mlp(block.mlp_norm(x), gate_up=None if f is None else f.gate_up)
  route_cache = None
  if cache.routes is not None:
    route_cache = _write_routes(cache.routes, jnp.stack(routes, axis=2), slot)
  return model.final_norm(x), Cache(k=tuple(ks), v=tuple(vs), routes=route_cache)
