"""Pallas kernels for the lm-head vocabulary statistics (same math as token_logprobs_xla).

Three kernels, all with a 1-D parallel grid and an in-kernel loop over the other axis so
that no grid axis carries a reduction (grid programs run concurrently on GPUs):

* forward: one program per token block, loops over vocab blocks with the online
  log-sum-exp; writes (lse, ez, zy) for its tokens.
* d hidden: one program per token block, loops over vocab blocks, recomputes the logits
  block and accumulates dz @ W_blk^T.
* d lm_head: one program per vocab block, loops over token blocks, accumulates h_blk^T dz.

The looped-over operand is passed whole (GPU global memory) and sliced in the kernel, which
suits GPUs (Triton) and interpret mode; TPUs would need manual DMA of the lm-head blocks.
Compiled Triton also wants every block dimension a power of two, which whole operands of
real models (hidden 3584, vocab 151936) are not; that is checked up front. The kernels are
verified in interpret mode only, so they are opt-in (``impl="pallas"``) and the dispatcher
uses the XLA path on every backend by default. Inputs are padded to whole blocks (vocab
padding is masked to -inf logits, padded tokens get zero cotangents). On CPU the kernels
run with ``interpret=True`` (tests only: it is slow).
"""

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from legorl_jax.errors import KernelError
from legorl_jax.rl.token_logprobs_xla import logits_cotangent

Array = jax.Array


def _pad_to(x: Array, axis: int, multiple: int) -> Array:
  size = x.shape[axis]
  extra = -size % multiple
  if not extra:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)


def _block_logits(h, w, cols, v, temperature):
  z = jnp.dot(h, w, preferred_element_type=jnp.float32) / temperature
  return jnp.where((cols < v)[None, :], z, -jnp.inf)


def _fwd_kernel(h_ref, w_ref, tgt_ref, lse_ref, ez_ref, zy_ref, *, v, bv, nv, temperature):
  h = h_ref[...]
  tgt = tgt_ref[...]
  bt = h.shape[0]

  def body(j, state):
    m, s, t, zy = state
    cols = j * bv + jnp.arange(bv, dtype=jnp.int32)
    z = _block_logits(h, w_ref[:, pl.ds(j * bv, bv)], cols, v, temperature)
    fresh = (cols < v)[None, :]
    z_real = jnp.where(fresh, z, 0.0)
    m_new = jnp.maximum(m, jnp.max(z, axis=1))
    scale = jnp.exp(m - m_new)
    p = jnp.exp(z - m_new[:, None])
    s = s * scale + jnp.sum(p, axis=1)
    t = t * scale + jnp.sum(p * z_real, axis=1)
    zy = zy + jnp.sum(jnp.where(cols[None, :] == tgt[:, None], z_real, 0.0), axis=1)
    return m_new, s, t, zy

  zeros = jnp.zeros((bt,), jnp.float32)
  m, s, t, zy = jax.lax.fori_loop(0, nv, body, (zeros - jnp.inf, zeros, zeros, zeros))
  lse_ref[...] = m + jnp.log(s)
  ez_ref[...] = t / s
  zy_ref[...] = zy


def _dh_kernel(h_ref, w_ref, tgt_ref, lse_ref, ez_ref, gl_ref, ge_ref, gz_ref, dh_ref, *,
               v, bv, nv, temperature):
  h = h_ref[...]
  tgt, lse, ez = tgt_ref[...], lse_ref[...], ez_ref[...]
  g_lse, g_ez, g_zy = gl_ref[...], ge_ref[...], gz_ref[...]

  def body(j, acc):
    cols = j * bv + jnp.arange(bv, dtype=jnp.int32)
    w = w_ref[:, pl.ds(j * bv, bv)]
    z = _block_logits(h, w, cols, v, temperature)
    fresh = (cols < v)[None, :]
    hit = cols[None, :] == tgt[:, None]
    dz = logits_cotangent(z, fresh, hit, lse, ez, g_lse, g_ez, g_zy)
    return acc + jax.lax.dot_general(dz, w.astype(jnp.float32), (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  acc = jax.lax.fori_loop(0, nv, body, jnp.zeros(dh_ref.shape, jnp.float32))
  dh_ref[...] = (acc / temperature).astype(dh_ref.dtype)


def _dw_kernel(w_ref, h_ref, tgt_ref, lse_ref, ez_ref, gl_ref, ge_ref, gz_ref, dw_ref, *,
               v, bv, bt, nt, temperature):
  w = w_ref[...]
  cols = pl.program_id(0) * bv + jnp.arange(bv, dtype=jnp.int32)
  fresh = (cols < v)[None, :]

  def body(i, acc):
    rows = pl.ds(i * bt, bt)
    h = h_ref[rows, :]
    z = _block_logits(h, w, cols, v, temperature)
    hit = cols[None, :] == tgt_ref[rows][:, None]
    dz = logits_cotangent(z, fresh, hit, lse_ref[rows], ez_ref[rows], gl_ref[rows],
                          ge_ref[rows], gz_ref[rows])
    return acc + jax.lax.dot_general(h.astype(jnp.float32), dz, (((0,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  acc = jax.lax.fori_loop(0, nt, body, jnp.zeros(dw_ref.shape, jnp.float32))
  dw_ref[...] = (acc / temperature).astype(dw_ref.dtype)


def _out(shape, dtype, like: Array) -> jax.ShapeDtypeStruct:
  """Output spec; inside shard_map it must say over which mesh axes the result varies."""
  mat = getattr(jax.typeof(like), "manual_axis_type", None)
  if mat is None or not mat.varying:
    return jax.ShapeDtypeStruct(shape, dtype)
  return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat)


def _interpret_default() -> bool:
  return jax.default_backend() == "cpu"


def _check_compiled_blocks(interpret: bool, **dims: int) -> None:
  """Compiled (Triton) Pallas needs every block dimension to be a power of two; the kernels
  take whole operands as blocks, so that includes the hidden size and the padded vocab and
  token counts. Say so up front instead of failing inside the lowering."""
  if interpret:
    return
  bad = {k: v for k, v in dims.items() if v < 1 or v & (v - 1)}
  if bad:
    raise KernelError(
        f"the compiled Pallas logprob kernels need power-of-two block dimensions; got {bad}. "
        "Use the XLA implementation (trainer.logprob_impl='xla', the default) for this model.")


def stats_fwd(hidden: Array, lm_head: Array, targets: Array, *, temperature: float,
              block_tokens: int, block_vocab: int, interpret=None) -> Tuple[Array, Array, Array]:
  """Per-token (lse, ez, zy), each [N] f32; see token_logprobs_xla.stats_fwd."""
  interpret = _interpret_default() if interpret is None else interpret
  n, d = hidden.shape
  v = lm_head.shape[1]
  bt, bv = min(block_tokens, n), min(block_vocab, v)
  h = _pad_to(hidden, 0, bt)
  w = _pad_to(lm_head, 1, bv)
  tgt = _pad_to(targets.astype(jnp.int32), 0, bt)
  np_, vp = h.shape[0], w.shape[1]
  _check_compiled_blocks(interpret, block_tokens=bt, block_vocab=bv, hidden=d, vocab=vp)
  kernel = functools.partial(_fwd_kernel, v=v, bv=bv, nv=vp // bv, temperature=temperature)
  vec = pl.BlockSpec((bt,), lambda i: (i,))
  out = _out((np_,), jnp.float32, h)
  lse, ez, zy = pl.pallas_call(
      kernel, out_shape=(out, out, out), grid=(np_ // bt,),
      in_specs=[pl.BlockSpec((bt, d), lambda i: (i, 0)),
                pl.BlockSpec((d, vp), lambda i: (0, 0)), vec],
      out_specs=(vec, vec, vec), interpret=interpret)(h, w, tgt)
  return lse[:n], ez[:n], zy[:n]


def stats_bwd(hidden: Array, lm_head: Array, targets: Array, lse: Array, ez: Array,
              g_lse: Array, g_ez: Array, g_zy: Array, *, temperature: float,
              block_tokens: int, block_vocab: int, interpret=None) -> Tuple[Array, Array]:
  """(d hidden [N, D], d lm_head [D, V]); see token_logprobs_xla.stats_bwd."""
  interpret = _interpret_default() if interpret is None else interpret
  n, d = hidden.shape
  v = lm_head.shape[1]
  bt, bv = min(block_tokens, n), min(block_vocab, v)
  h = _pad_to(hidden, 0, bt)
  w = _pad_to(lm_head, 1, bv)
  # Padded tokens: zero cotangents (so dz = 0) and finite statistics.
  vecs = [_pad_to(x, 0, bt) for x in (targets.astype(jnp.int32), lse, ez, g_lse, g_ez, g_zy)]
  np_, vp = h.shape[0], w.shape[1]
  _check_compiled_blocks(interpret, block_tokens=bt, block_vocab=bv, hidden=d, vocab=vp,
                         tokens=np_)
  nt, nv = np_ // bt, vp // bv

  vec_blk = pl.BlockSpec((bt,), lambda i: (i,))
  dh = pl.pallas_call(
      functools.partial(_dh_kernel, v=v, bv=bv, nv=nv, temperature=temperature),
      out_shape=_out((np_, d), hidden.dtype, h), grid=(nt,),
      in_specs=[pl.BlockSpec((bt, d), lambda i: (i, 0)),
                pl.BlockSpec((d, vp), lambda i: (0, 0))] + [vec_blk] * 6,
      out_specs=pl.BlockSpec((bt, d), lambda i: (i, 0)), interpret=interpret)(h, w, *vecs)

  vec_all = pl.BlockSpec((np_,), lambda j: (0,))
  dw = pl.pallas_call(
      functools.partial(_dw_kernel, v=v, bv=bv, bt=bt, nt=nt, temperature=temperature),
      out_shape=_out((d, vp), lm_head.dtype, h), grid=(nv,),
      in_specs=[pl.BlockSpec((d, bv), lambda j: (0, j)),
                pl.BlockSpec((np_, d), lambda j: (0, 0))] + [vec_all] * 6,
      out_specs=pl.BlockSpec((d, bv), lambda j: (0, j)), interpret=interpret)(w, h, *vecs)
  return dh[:n], dw[:, :v]
