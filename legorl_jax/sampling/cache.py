"""The sampler's KV cache, head-major, and the cached forward pass that uses it.

``Decoder.decode`` keeps K/V as ``[B, S, Hkv, Dh]``; attention contracts per (row, head), so
on CPU/GPU XLA transposes the whole cache in every layer at every step. Here K/V are stored
``[B, Hkv, S, Dh]`` -- the layout attention reads -- and the forward reuses the Decoder's own
submodules (norms, projections, RoPE, MLP), so only the cache glue lives here. Semantics are
those of ``Decoder.decode``: a token writes K/V at its position (= slot) and attends to every
slot <= its position; positions < 0 are padding that write nothing. The tests check it against
the teacher-forced ``Decoder.__call__``.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

from legorl_jax.models.config import ModelConfig


@flax.struct.dataclass
class Cache:
  """Per-layer key/value slots: ``k[i], v[i]`` are ``[B, Hkv, S, Dh]``."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "Cache":
    shape = (batch, config.num_kv_heads, max_len, config.head_dim)
    dtype = dtype or config.compute_dtype
    return cls(k=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
               v=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)))

  def map(self, fn) -> "Cache":
    return Cache(k=tuple(map(fn, self.k)), v=tuple(map(fn, self.v)))

  def map2(self, fn, other: "Cache") -> "Cache":
    return Cache(k=tuple(map(fn, self.k, other.k)), v=tuple(map(fn, self.v, other.v)))


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """Grouped-query attention on a head-major cache.

  q: [B, T, H, Dh]; k, v: [B, Hkv, S, Dh]; mask: [B, T, S] bool -> [B, T, H, Dh].
  """
  b, t, h, dh = q.shape
  hkv = k.shape[1]
  q = q.reshape(b, t, hkv, h // hkv, dh)
  if t == 1:
    # One query per row is a matrix-vector product; as broadcast-multiply-reduce XLA streams
    # the cache once instead of running many tiny batched matmuls.
    q1 = q[:, 0].astype(jnp.float32)  # [B, Hkv, G, Dh]
    scores = jnp.sum(q1[:, :, :, None, :] * k[:, :, None].astype(jnp.float32), axis=-1)
    scores = scores[:, :, :, None, :]  # [B, Hkv, G, 1, S]
  else:
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None], scores / math.sqrt(dh), jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if t == 1:
    out = jnp.sum(probs[:, :, :, 0, :, None] * v[:, :, None], axis=-2)  # [B, Hkv, G, Dh]
    return out.reshape(b, 1, h, dh)
  return jnp.einsum("bkgts,bksd->btkgd", probs, v).reshape(b, t, h, dh)


def forward(model, input_ids: jax.Array, positions: jax.Array, cache: Cache):
  """Runs new tokens of a ``Decoder`` against the cache.

  Args:
    model: a Decoder (merged inside the trace).
    input_ids: int32 [B, T]; positions: int32 [B, T] absolute positions, negative = padding.
    cache: Cache with slots [B, Hkv, S, Dh].
  Returns:
    (hidden [B, T, D] final-normed, updated cache).
  """
  s = cache.k[0].shape[2]
  slots = jnp.arange(s, dtype=jnp.int32)
  mask = (slots[None, None, :] <= positions[:, :, None]) & (positions[:, :, None] >= 0)
  rows = jnp.arange(input_ids.shape[0])[:, None]
  slot = jnp.where(positions >= 0, positions, s)  # out of range -> dropped
  x = model.embed_tokens(input_ids)
  ks, vs = [], []
  for i, block in enumerate(model.layers):
    q, k, v = block.attn.project_qkv(block.attn_norm(x), positions)
    # Advanced indices [B, T] around a slice: the update is laid out [B, T, Hkv, Dh], as k is.
    k_cache = cache.k[i].at[rows, :, slot].set(k.astype(cache.k[i].dtype), mode="drop")
    v_cache = cache.v[i].at[rows, :, slot].set(v.astype(cache.v[i].dtype), mode="drop")
    ks.append(k_cache)
    vs.append(v_cache)
    o = attend(q, k_cache.astype(x.dtype), v_cache.astype(x.dtype), mask)
    x = x + block.attn.output(o)
    x = x + block.mlp(block.mlp_norm(x))
  return model.final_norm(x), Cache(k=tuple(ks), v=tuple(vs))
