"""Fused lm-head log-prob and entropy of target tokens, without materialising [N, V] logits.

One public function, ``token_logprobs``, dispatches to three implementations:

* ``"xla"``: chunked loops over tokens and vocab (``token_logprobs_xla``); portable, the
  default on every backend.
* ``"pallas"``: Pallas kernels for forward and backward (``token_logprobs_pallas``); opt-in,
  verified in interpret mode (CPU tests); compiled Triton needs power-of-two shapes.
* ``"reference"``: materialises the logits with ``jax.nn.log_softmax``; the tests' oracle.

The fused implementations share one differentiable primitive, ``vocab_stats``, that returns
per-token ``(lse, ez, zy)`` over a slice of the vocabulary (see ``token_logprobs_xla``), with
``logp = zy - lse`` and ``entropy = lse - ez``. Its custom VJP saves only ``lse`` and ``ez``
per token and recomputes logits chunk by chunk. Because the statistics of vocab slices
combine with a max / sum, the same primitive gives the vocab-parallel version
(``token_logprobs_sharded``): each ``tensor`` shard reduces its slice, then ``pmax`` /
``psum`` merge them, and autodiff of that merge feeds each shard's backward.
"""

import functools
from typing import NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from legorl_jax.errors import KernelError, ShardingError
from legorl_jax.rl import token_logprobs_pallas as _pallas
from legorl_jax.rl import token_logprobs_xla as _xla

Array = jax.Array

IMPLS = ("xla", "pallas", "reference")
# CPU-tuned defaults (see experiments/benchmarks/loss.py).
DEFAULT_TOKEN_CHUNK = 4096
DEFAULT_VOCAB_CHUNK = 2048
# Pallas block sizes (GPU-sized; tests pass small ones).
DEFAULT_BLOCK_TOKENS = 64
DEFAULT_BLOCK_VOCAB = 128


class _Static(NamedTuple):
  impl: str
  temperature: float
  token_chunk: int
  vocab_chunk: int
  interpret: Optional[bool]


def _fwd_stats(h, w, tgt, st: _Static):
  if st.impl == "pallas":
    return _pallas.stats_fwd(h, w, tgt, temperature=st.temperature, block_tokens=st.token_chunk,
                             block_vocab=st.vocab_chunk, interpret=st.interpret)
  return _xla.stats_fwd(h, w, tgt, temperature=st.temperature, token_chunk=st.token_chunk,
                        vocab_chunk=st.vocab_chunk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def vocab_stats(hidden: Array, lm_head: Array, targets: Array, st: _Static
                ) -> Tuple[Array, Array, Array]:
  """Per-token (lse [N], ez [N], zy [N]) f32 over the columns of ``lm_head [D, V]``.

  ``targets [N]`` index this lm_head's columns; a target outside [0, V) contributes zy = 0.
  """
  return _fwd_stats(hidden, lm_head, targets, st)


def _vocab_stats_fwd(hidden, lm_head, targets, st):
  lse, ez, zy = _fwd_stats(hidden, lm_head, targets, st)
  return (lse, ez, zy), (hidden, lm_head, targets, lse, ez)


def _vocab_stats_bwd(st, res, g):
  hidden, lm_head, targets, lse, ez = res
  g_lse, g_ez, g_zy = (jnp.asarray(x, jnp.float32) for x in g)
  kw = dict(temperature=st.temperature)
  if st.impl == "pallas":
    dh, dw = _pallas.stats_bwd(hidden, lm_head, targets, lse, ez, g_lse, g_ez, g_zy,
                               block_tokens=st.token_chunk, block_vocab=st.vocab_chunk,
                               interpret=st.interpret, **kw)
  else:
    dh, dw = _xla.stats_bwd(hidden, lm_head, targets, lse, ez, g_lse, g_ez, g_zy,
                            token_chunk=st.token_chunk, vocab_chunk=st.vocab_chunk, **kw)
  return dh, dw, None


vocab_stats.defvjp(_vocab_stats_fwd, _vocab_stats_bwd)


def reference_token_logprobs(hidden: Array, lm_head: Array, targets: Array, *,
                             temperature: float = 1.0) -> Tuple[Array, Array]:
  """Naive oracle: materialises [N, V] f32 logits. Returns (logp [N], entropy [N]) f32."""
  z = jnp.dot(hidden, lm_head, preferred_element_type=jnp.float32) / temperature
  logp_all = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets.astype(jnp.int32)[:, None], axis=-1)[:, 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, entropy


def _resolve(impl: Optional[str], token_chunk, vocab_chunk, interpret) -> _Static:
  if impl is None:
    impl = "xla"
  if impl not in IMPLS:
    raise KernelError(f"unknown token_logprobs impl {impl!r}; choose one of {IMPLS}.")
  if impl == "pallas":
    tc = DEFAULT_BLOCK_TOKENS if token_chunk is None else token_chunk
    vc = DEFAULT_BLOCK_VOCAB if vocab_chunk is None else vocab_chunk
  else:
    tc = DEFAULT_TOKEN_CHUNK if token_chunk is None else token_chunk
    vc = DEFAULT_VOCAB_CHUNK if vocab_chunk is None else vocab_chunk
  if tc < 1 or vc < 1:
    raise KernelError(f"token_chunk and vocab_chunk must be >= 1 (got {tc}, {vc}).")
  return _Static(impl, 1.0, int(tc), int(vc), interpret)


def _check(hidden, lm_head, targets, temperature):
  if hidden.ndim != 2 or lm_head.ndim != 2 or targets.ndim != 1:
    raise KernelError(f"token_logprobs expects hidden [N, D], lm_head [D, V], targets [N]; "
                      f"got {hidden.shape}, {lm_head.shape}, {targets.shape}. Flatten batch "
                      "and time into N first.")
  if hidden.shape[1] != lm_head.shape[0] or hidden.shape[0] != targets.shape[0]:
    raise KernelError(f"shape mismatch: hidden {hidden.shape}, lm_head {lm_head.shape}, "
                      f"targets {targets.shape}.")
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise KernelError(f"targets must be integer token ids, got {targets.dtype}.")
  if not isinstance(temperature, (int, float)) or temperature <= 0:
    raise KernelError(f"temperature must be a positive Python float (static), got {temperature!r}.")


def token_logprobs(hidden: Array, lm_head: Array, targets: Array, *, temperature: float = 1.0,
                   impl: Optional[str] = None, token_chunk: Optional[int] = None,
                   vocab_chunk: Optional[int] = None, interpret: Optional[bool] = None,
                   mesh: Optional[Mesh] = None, batch_axes: Sequence[str] = ("data", "fsdp"),
                   vocab_axis: str = "tensor") -> Tuple[Array, Array]:
  """Log-prob of ``targets`` and entropy under softmax(hidden @ lm_head / temperature).

  Args:
    hidden: [N, D] float (f32 or bf16; accumulation is f32).
    lm_head: [D, V] float.
    targets: [N] int token ids.
    temperature: static positive float (the sampler's temperature).
    impl: "xla" | "pallas" | "reference" | None (xla).
    token_chunk, vocab_chunk: chunk (xla) or block (pallas) sizes; any positive ints, the
      sizes need not divide N or V.
    interpret: pallas interpret mode (default: on CPU).
    mesh: if given, run vocab-parallel via ``token_logprobs_sharded``.
  Returns:
    (logp [N] f32, entropy [N] f32), differentiable w.r.t. hidden and lm_head.
  """
  _check(hidden, lm_head, targets, temperature)
  if mesh is not None:
    return token_logprobs_sharded(hidden, lm_head, targets, mesh, batch_axes=batch_axes,
                                  vocab_axis=vocab_axis, temperature=temperature, impl=impl,
                                  token_chunk=token_chunk, vocab_chunk=vocab_chunk,
                                  interpret=interpret)
  st = _resolve(impl, token_chunk, vocab_chunk, interpret)._replace(temperature=float(temperature))
  if st.impl == "reference":
    return reference_token_logprobs(hidden, lm_head, targets, temperature=st.temperature)
  lse, ez, zy = vocab_stats(hidden, lm_head, targets.astype(jnp.int32), st)
  return zy - lse, lse - ez


def token_logprobs_sharded(hidden: Array, lm_head: Array, targets: Array, mesh: Mesh, *,
                           batch_axes: Sequence[str] = ("data", "fsdp"),
                           vocab_axis: str = "tensor", temperature: float = 1.0,
                           impl: Optional[str] = None, token_chunk: Optional[int] = None,
                           vocab_chunk: Optional[int] = None,
                           interpret: Optional[bool] = None) -> Tuple[Array, Array]:
  """Vocab-parallel ``token_logprobs`` with ``jax.shard_map``.

  Tokens are split over ``batch_axes`` and the lm-head columns over ``vocab_axis``; inputs
  in other layouts are resharded on entry. Each shard computes (lse, ez, zy) over its vocab
  slice; they merge as lse = M + log psum(exp(lse_k - M)) with M = pmax(lse_k),
  ez = psum(exp(lse_k - lse) ez_k), zy = psum(zy_k). Gradients flow through the merge into
  each shard's fused backward; d lm_head is summed over the batch axes by shard_map's
  autodiff. Outputs are sharded over ``batch_axes``.

  Shapes and returns as ``token_logprobs``; N must divide by the product of the batch axes'
  sizes and V by the vocab axis' size.
  """
  _check(hidden, lm_head, targets, temperature)
  st = _resolve(impl, token_chunk, vocab_chunk, interpret)._replace(temperature=float(temperature))
  batch_axes = tuple(a for a in batch_axes if a in mesh.shape)
  if vocab_axis not in mesh.shape:
    raise ShardingError(f"mesh axes {tuple(mesh.shape)} lack the vocab axis {vocab_axis!r}; "
                        "pass vocab_axis= one of them.")
  n_b = 1
  for a in batch_axes:
    n_b *= mesh.shape[a]
  n_v = mesh.shape[vocab_axis]
  n, v = hidden.shape[0], lm_head.shape[1]
  if n % n_b or v % n_v:
    raise ShardingError(f"token_logprobs_sharded needs N={n} divisible by {n_b} (axes "
                        f"{batch_axes}) and V={v} divisible by {n_v} ({vocab_axis!r}); pad "
                        "the token batch / vocabulary (padded vocab rows of the lm head are "
                        "fine if their logits never win: pad with a very negative bias).")
  v_local = v // n_v
  tok = P(batch_axes or None)

  def local(h, w, tgt):
    offset = jax.lax.axis_index(vocab_axis) * v_local
    local_tgt = tgt.astype(jnp.int32) - offset
    if st.impl == "reference":
      z = jnp.dot(h, w, preferred_element_type=jnp.float32) / st.temperature
      lse = jax.nn.logsumexp(z, axis=-1)
      ez = jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
      owned = (local_tgt >= 0) & (local_tgt < v_local)
      zy = jnp.where(owned, jnp.take_along_axis(
          z, jnp.clip(local_tgt, 0, v_local - 1)[:, None], axis=-1)[:, 0], 0.0)
    else:
      # Make every operand vary over all axes, so the custom VJP's per-shard cotangents
      # type-check; the transposes of these casts are the psums over the other axes.
      h, w, local_tgt = (_xla.vary_like(x, h, w, local_tgt) for x in (h, w, local_tgt))
      lse, ez, zy = vocab_stats(h, w, local_tgt, st)
    m = jax.lax.pmax(jax.lax.stop_gradient(lse), vocab_axis)
    tot = m + jnp.log(jax.lax.psum(jnp.exp(lse - m), vocab_axis))
    ez = jax.lax.psum(jnp.exp(lse - tot) * ez, vocab_axis)
    zy = jax.lax.psum(zy, vocab_axis)
    return zy - tot, tot - ez

  specs = (P(batch_axes or None, None), P(None, vocab_axis), tok)
  args = [_place(x, mesh, spec) for x, spec in zip((hidden, lm_head, targets), specs)]
  # pallas_call in interpret mode does not yet propagate varying-axis types through its
  # internal loops, so that path runs unchecked (its values and grads are tested).
  fn = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(tok, tok),
                     check_vma=st.impl != "pallas")
  return fn(*args)


def _place(x: Array, mesh: Mesh, spec: P) -> Array:
  """Reshards x to ``spec`` on ``mesh`` (Explicit axes: jax.reshard; Auto: a constraint)."""
  sharding = jax.sharding.NamedSharding(mesh, spec)
  if all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    return jax.reshard(x, sharding)
  return jax.lax.with_sharding_constraint(x, sharding)
