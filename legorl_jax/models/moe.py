"""Mixture-of-experts block of ``qwen3_moe``: router, top-k gates, grouped SwiGLU experts.

Shapes: N tokens (a flattened ``[B, T]``), D = hidden size, E = experts, k = experts per token,
I = expert width. Parameters (kernels ``[in, out]``): ``router_kernel [D, E]``,
``gate_kernel, up_kernel [E, D, I]``, ``down_kernel [E, I, D]``.

Expert compute is *grouped*: the N*k (token, expert) assignments are sorted by expert and each
expert multiplies only its own contiguous rows. Work is about N*k rows per projection, the same
as the active parameters imply, where a dense all-experts einsum does N*E rows (E/k times more:
16x for Qwen3-30B-A3B's 128 experts, top-8). Two lowerings of the same function:
  * ``ragged``: ``jax.lax.ragged_dot`` (one grouped GEMM per projection, group sizes = tokens
    per expert), the native grouped matmul on TPU and GPU;
  * ``blocked``: each expert's rows padded to a multiple of ``BLOCK`` and every block multiplied
    by its expert's weights (a batched einsum over gathered per-block weights). XLA:CPU lowers
    ``ragged_dot`` as every group over every row (measured: its time grows linearly with the
    number of groups, 330x one dot at 128 groups), slower than the dense reference, so CPU
    uses this one (``impl=None`` picks by backend). Grouping beats a capacity-based dispatch here because
it drops no tokens and pads nothing, so the output does not depend on the batch's composition
(the sampler and the learner must compute the same function of each token; a capacity limit
would make a token's output depend on which other tokens share its batch).

Routing replay: ``route(..., experts=given)`` uses given expert indices instead of top-k; the
gate weights still come from the current router's softmax at those indices, so the router
receives gradient through them. Negative ids mark tokens without a recorded route (top-k then).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from legorl_jax import errors
from legorl_jax.models.config import ModelConfig


class Routing(NamedTuple):
  """One sparse layer's routing of N tokens.

  experts: int32 [N, k] selected expert ids (descending gate order when computed by top-k).
  gates: float32 [N, k] combine weights (renormalised over the k when ``norm_topk_prob``).
  probs: float32 [N, E] router softmax (feeds the load-balancing loss).
  """
  experts: jax.Array
  gates: jax.Array
  probs: jax.Array


def route(x: jax.Array, router_kernel: jax.Array, top_k: int, norm_topk_prob: bool,
          experts: jax.Array | None = None) -> Routing:
  """Router of HF's Qwen3-MoE: softmax (float32) over ``x @ router_kernel``, then top-k.

  Args:
    x: [N, D] normed hidden states (compute dtype).
    router_kernel: [D, E].
    top_k: experts per token.
    norm_topk_prob: renormalise the k selected probabilities to sum to 1.
    experts: optional int [N, k] given selection (routing replay); the gates are the current
      probabilities at these ids, differentiable w.r.t. the router. A token whose row holds a
      negative id (the sampler recorded no route for it, ``sampling.cache``) gets the current
      top-k instead.
  Returns:
    Routing (experts int32 [N, k], gates f32 [N, k], probs f32 [N, E]).
  """
  logits = jnp.dot(x, router_kernel.astype(x.dtype), preferred_element_type=jnp.float32)
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  if experts is None:
    gates, experts = jax.lax.top_k(probs, top_k)
  else:
    if experts.shape != (x.shape[0], top_k):
      raise errors.ConfigError(
          f"replayed routes have shape {tuple(experts.shape)}, expected {(x.shape[0], top_k)} "
          f"([tokens, num_experts_per_tok]); record them with the same model config.")
    experts = experts.astype(jnp.int32)
    unrecorded = jnp.any(experts < 0, axis=-1, keepdims=True)
    experts = jnp.where(unrecorded, jax.lax.top_k(probs, top_k)[1], experts)
    gates = jnp.take_along_axis(probs, experts, axis=-1)
  if norm_topk_prob:
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
  return Routing(experts.astype(jnp.int32), gates, probs)


BLOCK = 32
IMPLS = ("ragged", "blocked")


def grouped_experts(x: jax.Array, experts: jax.Array, gates: jax.Array, gate_kernel: jax.Array,
                    up_kernel: jax.Array, down_kernel: jax.Array, impl: str | None = None
                    ) -> jax.Array:
  """sum_j gates[n, j] * SwiGLU_{experts[n, j]}(x[n]) with grouped matmuls.

  Args:
    x: [N, D]; experts: int32 [N, k]; gates: f32 [N, k];
    gate_kernel, up_kernel: [E, D, I]; down_kernel: [E, I, D].
    impl: "ragged" or "blocked" (see the module docstring); None: blocked on CPU, else ragged.
  Returns:
    [N, D] in x's dtype.
  """
  if impl is None:
    impl = "blocked" if jax.default_backend() == "cpu" else "ragged"
  if impl == "blocked":
    return blocked_experts(x, experts, gates, gate_kernel, up_kernel, down_kernel)
  if impl != "ragged":
    raise errors.ConfigError(f"expert compute impl={impl!r} is unknown; use one of {IMPLS}.")
  return ragged_experts(x, experts, gates, gate_kernel, up_kernel, down_kernel)


def ragged_experts(x, experts, gates, gate_kernel, up_kernel, down_kernel):
  """``grouped_experts`` through ``jax.lax.ragged_dot`` (arguments as there)."""
  n, k = experts.shape
  num_experts = gate_kernel.shape[0]
  dt = x.dtype
  flat = experts.reshape(-1)  # [N*k], assignment a = n*k + j
  order = jnp.argsort(flat, stable=True)  # assignments grouped by expert
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)  # [E]
  rows = jnp.take(x, order // k, axis=0)  # [N*k, D]
  g = jax.lax.ragged_dot(rows, gate_kernel.astype(dt), sizes)
  u = jax.lax.ragged_dot(rows, up_kernel.astype(dt), sizes)
  y = jax.lax.ragged_dot(jax.nn.silu(g) * u, down_kernel.astype(dt), sizes)  # [N*k, D]
  # Unsort by the inverse permutation (a gather, so no scatter-add ordering), then combine.
  y = jnp.take(y, jnp.argsort(order), axis=0).reshape(n, k, -1)
  return jnp.einsum("nkd,nk->nd", y, gates.astype(dt))


def blocked_experts(x, experts, gates, gate_kernel, up_kernel, down_kernel, block: int = BLOCK):
  """``grouped_experts`` by padded blocks (arguments as there).

  Assignments sorted by expert are laid out with each expert's group padded to a multiple of
  ``block`` rows: at most ``nb = ceil((N*k + E*(block-1)) / block)`` blocks (static), each
  owned by one expert. A block is ``[block, D] @ W[expert of block]``; padding rows read a
  zero token and are never gathered back.
  """
  n, k = experts.shape
  e = gate_kernel.shape[0]
  dt = x.dtype
  a = n * k
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sorted_e = flat[order]
  sizes = jnp.bincount(flat, length=e)
  padded = (sizes + block - 1) // block * block
  pad_end = jnp.cumsum(padded)
  rank = jnp.arange(a) - (jnp.cumsum(sizes) - sizes)[sorted_e]
  dest = (pad_end - padded)[sorted_e] + rank  # [A] row of each sorted assignment
  nb = -(-(a + e * (block - 1)) // block)
  slot_token = jnp.full((nb * block,), n, jnp.int32).at[dest].set((order // k).astype(jnp.int32))
  xb = jnp.take(jnp.concatenate([x, jnp.zeros((1, x.shape[1]), dt)]), slot_token, axis=0)
  xb = xb.reshape(nb, block, -1)
  owner = jnp.minimum(jnp.searchsorted(pad_end, jnp.arange(nb) * block, side="right"), e - 1)
  w = lambda kernel: jnp.take(kernel.astype(dt), owner, axis=0)  # noqa: E731 [nb, in, out]
  g = jnp.einsum("brd,bdi->bri", xb, w(gate_kernel))
  u = jnp.einsum("brd,bdi->bri", xb, w(up_kernel))
  y = jnp.einsum("bri,bid->brd", jax.nn.silu(g) * u, w(down_kernel)).reshape(nb * block, -1)
  y = jnp.take(jnp.take(y, dest, axis=0), jnp.argsort(order), axis=0).reshape(n, k, -1)
  return jnp.einsum("nkd,nk->nd", y, gates.astype(dt))


def dense_experts(x, experts, gates, gate_kernel, up_kernel, down_kernel):
  """Reference: every expert on every token, combined by the k gates (args as grouped)."""
  dt = x.dtype
  g = jnp.einsum("nd,edi->nei", x, gate_kernel.astype(dt))
  u = jnp.einsum("nd,edi->nei", x, up_kernel.astype(dt))
  y = jnp.einsum("nei,eid->ned", jax.nn.silu(g) * u, down_kernel.astype(dt))  # [N, E, D]
  weight = jnp.sum(jax.nn.one_hot(experts, gate_kernel.shape[0], dtype=dt)
                   * gates.astype(dt)[..., None], axis=1)  # [N, E]
  return jnp.einsum("ned,ne->nd", y, weight)


def load_balancing_loss(probs: jax.Array, experts: jax.Array, valid: jax.Array) -> jax.Array:
  """Switch-Transformer auxiliary loss ``E * sum_e f_e * P_e`` of one layer (HF's definition).

  f_e = selections of expert e per valid token (sums to k), P_e = mean router probability.
  probs: f32 [N, E]; experts: int [N, k]; valid: bool [N] (padding excluded) -> f32 scalar.
  """
  num_experts = probs.shape[-1]
  w = valid.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(w), 1.0)
  f = jnp.sum(jax.nn.one_hot(experts, num_experts) * w[:, None, None], axis=(0, 1)) / count
  p = jnp.sum(probs * w[:, None], axis=0) / count
  return num_experts * jnp.sum(jax.lax.stop_gradient(f) * p)


def _param(rngs, shape, axes, config: ModelConfig):
  std = config.initializer_range
  value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(config.param_dtype)
  return nnx.Param(value, logical_axes=axes)


class MoEBlock(nnx.Module):
  """The sparse MLP of a ``qwen3_moe`` block (HF ``Qwen3MoeSparseMoeBlock``)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    e, d, i = c.num_experts, c.hidden_size, c.moe_intermediate_size
    self.router_kernel = _param(rngs, (d, e), ("embed", "router"), c)
    self.gate_kernel = _param(rngs, (e, d, i), ("experts", "embed", "mlp"), c)
    self.up_kernel = _param(rngs, (e, d, i), ("experts", "embed", "mlp"), c)
    self.down_kernel = _param(rngs, (e, i, d), ("experts", "mlp", "embed"), c)

  def routed(self, x: jax.Array, experts: jax.Array | None = None, *, dense: bool = False):
    """x [B, T, D] -> (y [B, T, D], Routing over the B*T tokens).

    experts: optional int [B, T, k] replayed selection. ``dense`` uses the all-experts
    reference (tests and the benchmark only).
    """
    c = self.config
    b, t, d = x.shape
    flat = x.reshape(b * t, d)
    given = None if experts is None else experts.reshape(b * t, -1)
    r = route(flat, self.router_kernel[...], c.num_experts_per_tok, c.norm_topk_prob, given)
    fn = dense_experts if dense else grouped_experts
    y = fn(flat, r.experts, r.gates, self.gate_kernel[...], self.up_kernel[...],
           self.down_kernel[...])
    return y.reshape(b, t, d), r

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.routed(x)[0]
