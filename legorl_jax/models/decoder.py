"""Flax NNX decoder family: Llama 3, Qwen2/2.5, Qwen3 and Qwen3-MoE (``models.moe``).

Every parameter carries ``logical_axes`` metadata (see ``legorl_jax.sharding.rules``), so one
rules table places it on a ``(data, fsdp, tensor)`` mesh. Kernels are stored ``[in, out]``.

Two forward modes share one attention function:
  * training / scoring: ``hidden(input_ids, positions, segment_ids)``; tokens attend causally
    within their segment (packed rows hold several sequences; segment id 0 is padding), or,
    with ``shared_prefix``, rows hold one prompt and several branches that share it;
  * sampling: ``decode(input_ids, positions, cache)`` writes K/V at each token's absolute
    position in a per-row cache slot and attends to every cached position <= its own.
    Tokens with ``position < 0`` are padding: they write nothing.

Mixture-of-experts policies also expose their routing: ``hidden_routed`` and ``decode(...,
return_routes=True)`` return each token's selected experts per sparse layer (int32
``[B, T, L_moe, k]``), and both accept such an array to replay instead of recomputing top-k.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from legorl_jax import errors
from legorl_jax.models.config import ModelConfig
from legorl_jax.models.moe import MoEBlock, load_balancing_loss
from legorl_jax.models.rope import apply_rope, rope_inv_freq


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value slots: ``k[i], v[i]`` are ``[B, S, H_kv, D_head]``."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[1]

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "KVCache":
    dtype = dtype or config.compute_dtype
    shape = (batch, max_len, config.num_kv_heads, config.head_dim)
    return cls(k=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
               v=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)))


def _param(rngs: nnx.Rngs, shape, axes, config: ModelConfig, std=None, init="normal"):
  dtype = jnp.dtype(config.param_dtype)
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    std = config.initializer_range if std is None else std
    value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
  """RMSNorm in float32, weight applied after casting back (HF convention)."""

  def __init__(self, dim: int, config: ModelConfig, *, rngs: nnx.Rngs, axis_name="norm"):
    self.eps = config.rms_norm_eps
    self.weight = _param(rngs, (dim,), (axis_name,), config, init="ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.weight[...].astype(x.dtype) * y.astype(x.dtype)


def _scores(q, k):
  """Scaled head-major scores: q [B, T, H, Dh], k [B, S, Hkv, Dh] -> f32 [B, Hkv, G, T, S].

  Queries and keys go head-major first ([B, Hkv, G*T, Dh], [B, Hkv, S, Dh]: transposes of the
  small operands), so both products are batched GEMMs that leave S minor in the scores. Left
  to pick, XLA computes ``K q^T`` and transposes the [T, S] scores inside the softmax pass,
  forward and backward (a forward+backward of preset ``small`` at B=4, T=256: 3.6 -> 3.0 s).
  """
  b, t, h, dh = q.shape
  hkv = k.shape[2]
  g = h // hkv
  q = q * jnp.asarray(1.0 / math.sqrt(dh), q.dtype)
  qh = q.reshape(b, t, hkv, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, dh)
  scores = jnp.einsum("bkmd,bksd->bkms", qh, k.transpose(0, 2, 1, 3),
                      preferred_element_type=jnp.float32)
  return scores.reshape(b, hkv, g, t, -1)


def _mix(probs, v):
  """probs [B, Hkv, G, T, S] (v's dtype), v [B, S, Hkv, Dh] -> [B, T, H, Dh]."""
  b, hkv, g, t, s = probs.shape
  out = jnp.einsum("bkms,bksd->bkmd", probs.reshape(b, hkv, g * t, s), v.transpose(0, 2, 1, 3))
  return out.reshape(b, hkv, g, t, -1).transpose(0, 3, 1, 2, 4).reshape(b, t, hkv * g, -1)


def attend(q, k, v, mask):
  """Grouped-query attention.

  q: [B, T, H, Dh]; k, v: [B, S, Hkv, Dh]; mask: [B, T, S] bool, or a ``GroupedMask`` for
  rows laid out as a shared prompt and its branches -> [B, T, H, Dh]. Softmax runs in float32.
  """
  if isinstance(mask, GroupedMask):
    return attend_grouped(q, k, v, mask)
  scores = jnp.where(mask[:, None, None], _scores(q, k), jnp.finfo(jnp.float32).min)
  return _mix(jax.nn.softmax(scores, axis=-1).astype(v.dtype), v)


class GroupedMask(NamedTuple):
  """Attention of a row laid out as ``[prompt: P tokens | K branches of L tokens]``.

  GRPO samples several completions of one prompt (and every demonstration of a harness starts
  with the same system prompt): the shared prompt is computed once per row instead of once per
  completion. Prompt tokens attend causally within the prompt; a branch token attends to
  every valid prompt token and causally within its own branch, so each branch sees exactly
  what its unshared sequence would. Shapes (bool): ``prefix [B, P, P]`` (prompt queries over
  prompt keys) and ``branch [B, K, L, P + L]`` (a branch's queries over the prompt's keys and
  then its own).
  """
  prefix: jax.Array
  branch: jax.Array

  @classmethod
  def from_segments(cls, segment_ids: jax.Array, prefix_len: int, branch_len: int) -> "GroupedMask":
    """From ``segment_ids [B, P + K*L]`` (0 = padding; each branch its own id)."""
    b, t = segment_ids.shape
    p, l = prefix_len, branch_len
    if p <= 0 or l <= 0 or t <= p or (t - p) % l:
      raise ValueError(f"a grouped row of {t} tokens cannot be a {p}-token prompt followed by "
                       f"branches of {l} tokens; the row length must be prompt + K * branch.")
    seg_p, seg_b = segment_ids[:, :p], segment_ids[:, p:].reshape(b, (t - p) // l, l)
    prefix = (jnp.tril(jnp.ones((p, p), bool))[None] & (seg_p[:, :, None] == seg_p[:, None, :])
              & (seg_p[:, :, None] != 0))
    to_prefix = (seg_b[..., :, None] != 0) & (seg_p[:, None, None, :] != 0)
    own = (jnp.tril(jnp.ones((l, l), bool))[None, None]
           & (seg_b[..., :, None] == seg_b[..., None, :]) & (seg_b[..., :, None] != 0))
    return cls(prefix, jnp.concatenate([to_prefix, own], -1))


def attend_grouped(q, k, v, mask: GroupedMask):
  """``attend`` over a grouped row (see ``GroupedMask``): q [B, P + K*L, H, Dh], k, v
  [B, P + K*L, Hkv, Dh] -> [B, P + K*L, H, Dh].

  Branch queries score against the prompt's keys and their own branch's keys (one softmax
  over both). Work per branch token is O(P + L), not O(P + K*L) as in a dense mask over the
  row.
  """
  p = mask.prefix.shape[-1]
  b, nb, l, _ = mask.branch.shape
  h, dh = q.shape[2:]
  hkv = k.shape[2]
  out_p = attend(q[:, :p], k[:, :p], v[:, :p], mask.prefix)
  # Each branch attends to [prompt keys | own keys]: the prompt's K/V are repeated per branch
  # (small next to the scores), so one plain attention call covers every branch.
  def per_branch(x):  # [B, P + K*L, Hkv, Dh] -> [B*K, P + L, Hkv, Dh]
    return jnp.concatenate([jnp.repeat(x[:, :p], nb, axis=0),
                            x[:, p:].reshape(b * nb, l, hkv, dh)], 1)
  qb = q[:, p:].reshape(b * nb, l, h, dh)
  out_b = attend(qb, per_branch(k), per_branch(v), mask.branch.reshape(b * nb, l, p + l))
  out_b = out_b.reshape(b, nb * l, h, dh)
  return jnp.concatenate([out_p, out_b], axis=1)


class Attention(nnx.Module):

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    self.q_kernel = _param(rngs, (c.hidden_size, q_dim), ("embed", "heads"), c)
    self.k_kernel = _param(rngs, (c.hidden_size, kv_dim), ("embed", "kv_heads"), c)
    self.v_kernel = _param(rngs, (c.hidden_size, kv_dim), ("embed", "kv_heads"), c)
    self.o_kernel = _param(rngs, (q_dim, c.hidden_size), ("heads", "embed"), c)
    if c.qkv_bias:
      self.q_bias = _param(rngs, (q_dim,), ("heads",), c, init="zeros")
      self.k_bias = _param(rngs, (kv_dim,), ("kv_heads",), c, init="zeros")
      self.v_bias = _param(rngs, (kv_dim,), ("kv_heads",), c, init="zeros")
    if c.qk_norm:
      self.q_norm = RMSNorm(c.head_dim, c, rngs=rngs, axis_name="head_dim")
      self.k_norm = RMSNorm(c.head_dim, c, rngs=rngs, axis_name="head_dim")

  def project_qkv(self, x, positions, fused=None):
    """x [B, T, D] -> q [B, T, H, Dh], k, v [B, T, Hkv, Dh] (rotated, normed). fused: optional
    (kernel [D, (H + 2 Hkv) Dh], bias or None): q|k|v as one matmul (``sampling.fused``)."""
    c, dt = self.config, x.dtype
    b, t, _ = x.shape
    heads = (c.num_heads, c.num_kv_heads, c.num_kv_heads)
    cuts = np.cumsum(heads[:2]) * c.head_dim
    if fused is None:  # three matmuls: the kernels the learner trains
      ys = [x @ getattr(self, f"{n}_kernel")[...].astype(dt) for n in "qkv"]
      bias = [getattr(self, f"{n}_bias")[...] for n in "qkv"] if c.qkv_bias else None
    else:  # one matmul, split after
      ys = jnp.split(x @ fused[0].astype(dt), cuts, axis=-1)
      bias = None if fused[1] is None else jnp.split(fused[1], cuts)
    if bias is not None:
      ys = [y + bb.astype(dt) for y, bb in zip(ys, bias)]
    q, k, v = (y.reshape(b, t, n, c.head_dim) for y, n in zip(ys, heads))
    if c.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    inv_freq = rope_inv_freq(c)  # numpy constant, computed at trace time
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

  def output(self, o):
    b, t = o.shape[:2]
    return o.reshape(b, t, -1) @ self.o_kernel[...].astype(o.dtype)


class MLP(nnx.Module):

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.gate_kernel = _param(rngs, (c.hidden_size, c.intermediate_size), ("embed", "mlp"), c)
    self.up_kernel = _param(rngs, (c.hidden_size, c.intermediate_size), ("embed", "mlp"), c)
    self.down_kernel = _param(rngs, (c.intermediate_size, c.hidden_size), ("mlp", "embed"), c)

  def __call__(self, x, gate_up=None):
    """x [..., D] -> [..., D]. gate_up: optional [D, 2 I], one matmul (``sampling.fused``)."""
    dt = x.dtype
    if gate_up is None:
      g, u = (x @ getattr(self, f"{n}_kernel")[...].astype(dt) for n in ("gate", "up"))
    else:
      g, u = jnp.split(x @ gate_up.astype(dt), 2, axis=-1)
    return (jax.nn.silu(g) * u) @ self.down_kernel[...].astype(dt)


class Block(nnx.Module):

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, layer: int = 0):
    self.attn_norm = RMSNorm(config.hidden_size, config, rngs=rngs)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = RMSNorm(config.hidden_size, config, rngs=rngs)
    self.sparse = config.is_moe_layer(layer)
    self.mlp = MoEBlock(config, rngs=rngs) if self.sparse else MLP(config, rngs=rngs)

  def __call__(self, x, positions, mask, kv=None):
    """x [B, T, D]; mask [B, T, S]; kv: optional (k_cache, v_cache) [B, S, Hkv, Dh].

    Returns (x, kv) where kv is the updated cache (or None).
    """
    x, kv, _ = self.forward(x, positions, mask, kv)
    return x, kv

  def forward(self, x, positions, mask, kv=None, experts=None):
    """``__call__`` that also returns the sparse MLP's ``moe.Routing`` (None when dense).

    experts: optional int [B, T, k] routes to replay (sparse blocks only).
    Returns (x, kv, routing).
    """
    q, k, v = self.attn.project_qkv(self.attn_norm(x), positions)
    if kv is not None:
      k_cache, v_cache = kv
      s = k_cache.shape[1]
      rows = jnp.arange(x.shape[0])[:, None]
      slot = jnp.where(positions >= 0, positions, s)  # out of range -> dropped
      k_cache = k_cache.at[rows, slot].set(k.astype(k_cache.dtype), mode="drop")
      v_cache = v_cache.at[rows, slot].set(v.astype(v_cache.dtype), mode="drop")
      k, v, kv = k_cache.astype(x.dtype), v_cache.astype(x.dtype), (k_cache, v_cache)
    x = x + self.attn.output(attend(q, k, v, mask))
    if self.sparse:
      y, routing = self.mlp.routed(self.mlp_norm(x), experts)
    else:
      y, routing = self.mlp(self.mlp_norm(x)), None
    return x + y, kv, routing


class RouteInfo(NamedTuple):
  """Routing of a mixture-of-experts forward.

  experts: int32 [B, T, L_moe, k], the selected experts of each token in each sparse layer
    (replayed ones when given). Stored compactly as ``config.route_dtype`` (int8 up to 128
    experts): ``L_moe * k`` bytes per token, 384 B for Qwen3-30B-A3B (48 layers, top-8).
  aux_loss: f32 scalar, the load-balancing loss averaged over sparse layers (valid tokens only).
  """
  experts: jax.Array
  aux_loss: jax.Array


class Decoder(nnx.Module):
  """Decoder-only transformer policy.

  ``model(input_ids)`` maps int32 ``[B, T]`` to float32 logits ``[B, T, V]``.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    self.embed = _param(rngs, (c.vocab_size, c.hidden_size), ("vocab", "embed"), c)
    self.layers = nnx.List([Block(c, rngs=rngs, layer=i) for i in range(c.num_layers)])
    self.final_norm = RMSNorm(c.hidden_size, c, rngs=rngs)
    if not c.tie_word_embeddings:
      self.lm_head = _param(rngs, (c.hidden_size, c.vocab_size), ("embed", "vocab"), c)

  # -- pieces ---------------------------------------------------------------------------------
  def lm_head_kernel(self) -> jax.Array:
    """The output projection ``[D, V]`` (the transposed embedding when tied)."""
    if self.config.tie_word_embeddings:
      return self.embed[...].T
    return self.lm_head[...]

  def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
    """int32 [B, T] -> [B, T, D] in the compute dtype."""
    return jnp.take(self.embed[...], input_ids, axis=0).astype(self.config.compute_dtype)

  def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
    """[..., D] -> float32 logits [..., V]."""
    if self.config.tie_word_embeddings:
      # Contract the embedding's own minor axis: through ``embed.T`` XLA:CPU lowers a one-row
      # decode step's head as a copy+loop fusion at about half the speed of a library GEMV.
      w = self.embed[...].astype(hidden.dtype)
      return jnp.einsum("...d,vd->...v", hidden, w, preferred_element_type=jnp.float32)
    w = self.lm_head[...].astype(hidden.dtype)
    return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)

  # -- training / scoring ---------------------------------------------------------------------
  def hidden(self, input_ids, positions=None, segment_ids=None, shared_prefix=None):
    """Final-normed hidden states.

    Args:
      input_ids: int32 [B, T].
      positions: int32 [B, T] RoPE positions (default ``arange(T)``; restart per packed segment).
      segment_ids: int32 [B, T]; tokens attend only within equal non-zero ids (default all 1).
      shared_prefix: static ``(P, L)``: every row is a P-token prompt followed by branches of L
        tokens that all attend to it (see ``GroupedMask``); None for plain rows.
    Returns:
      [B, T, D] in the compute dtype.
    """
    return self.hidden_from(self.embed_tokens(input_ids), 0, positions, segment_ids, shared_prefix)

  def trunk(self, input_ids, stop: int, positions=None, segment_ids=None, shared_prefix=None):
    """The input of block ``stop``: the embedding run through blocks ``[0, stop)`` ([B, T, D],
    not normed). ``hidden_from(trunk(ids, k, ...), k, ...)`` is ``hidden(ids, ...)``: a frozen
    trunk's output can be computed once and reused (``trainer.trunk_cache``)."""
    positions, mask = _positions_and_mask(input_ids.shape, positions, segment_ids, shared_prefix)
    return self.run_blocks(self.embed_tokens(input_ids), positions, mask, 0, stop)

  def hidden_from(self, x, start: int, positions=None, segment_ids=None, shared_prefix=None):
    """Final-normed hidden states from ``x`` [B, T, D], the input of block ``start``: blocks
    ``[start, L)`` then the final norm (arguments as ``hidden``)."""
    positions, mask = _positions_and_mask(x.shape[:2], positions, segment_ids, shared_prefix)
    return self.final_norm(self.run_blocks(x, positions, mask, start))

  def run_blocks(self, x, positions, mask, start: int = 0, stop: int | None = None):
    """Blocks ``[start, stop)`` (default: to the top) on ``x`` [B, T, D]; ``mask`` as ``attend``."""
    for block in self.layers[start:stop]:
      if self.config.remat:
        x = _remat_block(block, x, positions, mask)
      else:
        x, _ = block(x, positions, mask)
    return x

  def hidden_routed(self, input_ids, positions=None, segment_ids=None, experts=None,
                    shared_prefix=None):
    """``hidden`` that also returns the routing (``RouteInfo``); arguments as ``hidden``.

    experts: optional int [B, T, L_moe, k] routes to replay (routing replay); without it each
      sparse layer computes top-k, as it does for a token whose ids in a layer are negative (no
      route recorded, e.g. padding or the last sampled token: ``moe.route``).
    Returns (hidden [B, T, D], RouteInfo).
    """
    c = self.config
    if not c.moe_layers:
      raise errors.ConfigError(
          f"hidden_routed needs a mixture-of-experts model (architecture qwen3_moe); this is a "
          f"dense {c.architecture} model, use hidden().")
    b, t = input_ids.shape
    valid = (jnp.ones((b, t), bool) if segment_ids is None else segment_ids != 0).reshape(-1)
    positions, mask = _positions_and_mask((b, t), positions, segment_ids, shared_prefix)
    x, routings = self.embed_tokens(input_ids), []
    for block in self.layers:
      given = None
      if block.sparse and experts is not None:
        given = experts[:, :, len(routings)]
      if c.remat:
        x, routing = _remat_forward(block, x, positions, mask, given)
      else:
        x, _, routing = block.forward(x, positions, mask, experts=given)
      if routing is not None:
        routings.append(routing)
    return self.final_norm(x), _route_info(routings, valid, b, t)

  def __call__(self, input_ids, positions=None, segment_ids=None):
    """int32 [B, T] -> float32 logits [B, T, V]."""
    return self.logits_from_hidden(self.hidden(input_ids, positions, segment_ids))

  # -- sampling -------------------------------------------------------------------------------
  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    return KVCache.zeros(self.config, batch, max_len, dtype)

  def decode(self, input_ids, positions, cache: KVCache, experts=None,
             return_routes: bool = False):
    """Runs new tokens against the KV cache (prefill when T > 1, decode when T == 1).

    Args:
      input_ids: int32 [B, T].
      positions: int32 [B, T] absolute positions (= cache slot); negative = padding.
      cache: KVCache with slots [B, S, Hkv, Dh].
      experts: optional int [B, T, L_moe, k] routes to replay (mixture-of-experts only).
      return_routes: also return the selected experts (``RouteInfo.experts``) as
        ``config.route_dtype`` [B, T, L_moe, k].
    Returns:
      (hidden [B, T, D] final-normed, updated cache), plus routes when ``return_routes``.
    """
    s = cache.max_len
    slots = jnp.arange(s, dtype=jnp.int32)
    mask = (slots[None, None, :] <= positions[:, :, None]) & (positions[:, :, None] >= 0)
    x = self.embed_tokens(input_ids)
    ks, vs, routes = [], [], []
    for i, block in enumerate(self.layers):
      given = experts[:, :, len(routes)] if block.sparse and experts is not None else None
      x, (k, v), routing = block.forward(x, positions, mask, kv=(cache.k[i], cache.v[i]),
                                         experts=given)
      ks.append(k)
      vs.append(v)
      if routing is not None:
        routes.append(routing.experts)
    out = self.final_norm(x), KVCache(k=tuple(ks), v=tuple(vs))
    if not return_routes:
      return out
    if not routes:
      raise errors.ConfigError(f"return_routes=True needs a mixture-of-experts model; this is a "
                               f"dense {self.config.architecture} model.")
    b, t = input_ids.shape
    stacked = jnp.stack([r.reshape(b, t, -1) for r in routes], axis=2)
    return (*out, stacked.astype(self.config.route_dtype))


def _route_info(routings, valid, b, t) -> RouteInfo:
  """RouteInfo from per-layer ``moe.Routing`` over ``B*T`` tokens (``valid`` bool [B*T])."""
  experts = jnp.stack([r.experts.reshape(b, t, -1) for r in routings], axis=2)
  aux = jnp.mean(jnp.stack([load_balancing_loss(r.probs, r.experts, valid) for r in routings]))
  return RouteInfo(experts, aux)


def _positions_and_mask(shape, positions, segment_ids, shared_prefix):
  """Default positions and segment ids of ``hidden``'s rows, and their attention mask."""
  b, t = shape
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  if segment_ids is None:
    segment_ids = jnp.ones((b, t), jnp.int32)
  if shared_prefix is not None:
    return positions, GroupedMask.from_segments(segment_ids, *shared_prefix)
  causal = jnp.tril(jnp.ones((t, t), bool))
  mask = (causal[None] & (segment_ids[:, :, None] == segment_ids[:, None, :])
          & (segment_ids[:, :, None] != 0))
  return positions, mask


def _remat_forward(block: Block, x, positions, mask, experts):
  """``block.forward`` without a cache, rematerialised: (x, routing or None)."""
  graphdef, state = nnx.split(block)

  @jax.checkpoint
  def run(state, x, experts):
    out, _, routing = nnx.merge(graphdef, state).forward(x, positions, mask, experts=experts)
    return out, routing

  return run(state, x, experts)


def _remat_block(block: Block, x, positions, mask):
  graphdef, state = nnx.split(block)

  @jax.checkpoint
  def run(state, x):
    out, _ = nnx.merge(graphdef, state)(x, positions, mask)
    return out

  return run(state, x)
