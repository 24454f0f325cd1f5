"""Fused lm-head logprob/entropy: every implementation vs the materialised reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from legorl_jax.errors import KernelError, ShardingError
from legorl_jax.rl import token_logprobs, token_logprobs_pallas
from legorl_jax.rl.token_logprobs import _resolve, reference_token_logprobs, token_logprobs_sharded


def _inputs(n, d, v, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, v)) * scale, jnp.float32)
  t = jnp.asarray(rng.integers(0, v, n), jnp.int32)
  g_lp = jnp.asarray(rng.normal(size=n), jnp.float32)
  g_ent = jnp.asarray(rng.normal(size=n), jnp.float32)
  return h, w, t, g_lp, g_ent


def _value_and_grads(fn, h, w, g_lp, g_ent):
  """(logp, entropy, d/dh, d/dw) of sum(g_lp * logp + g_ent * entropy): both cotangents."""
  def f(h, w):
    lp, ent = fn(h, w)
    return jnp.sum(g_lp * lp) + jnp.sum(g_ent * ent), (lp, ent)
  (_, (lp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(h, w)
  return [np.asarray(x) for x in (lp, ent, dh, dw)]


def _np_reference(h, w, t, temperature):
  """Float64 NumPy oracle for the values."""
  z = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / temperature
  z = z - z.max(axis=1, keepdims=True)
  logp_all = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
  p = np.exp(logp_all)
  return logp_all[np.arange(len(t)), np.asarray(t)], -(p * logp_all).sum(axis=1)


def _assert_close(got, want, tol=1e-5):
  for g, r, name in zip(got, want, ("logp", "entropy", "d_hidden", "d_lm_head")):
    err = np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-30)
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"


def test_reference_matches_numpy_float64():
  h, w, t, _, _ = _inputs(23, 12, 61, scale=0.7)
  lp, ent = reference_token_logprobs(h, w, t, temperature=0.6)
  want_lp, want_ent = _np_reference(h, w, t, 0.6)
  np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature,token_chunk,vocab_chunk", [
    (1.0, None, None),   # Default chunks larger than the shapes: one chunk each.
    (0.7, 8, 50),        # Neither N nor V a multiple of the chunk.
    (1.3, 5, 7),         # Many clamped chunks.
])
def test_xla_matches_reference(temperature, token_chunk, vocab_chunk):
  h, w, t, g_lp, g_ent = _inputs(37, 16, 203, scale=0.5)
  want = _value_and_grads(lambda h, w: reference_token_logprobs(
      h, w, t, temperature=temperature), h, w, g_lp, g_ent)
  got = _value_and_grads(lambda h, w: token_logprobs(
      h, w, t, temperature=temperature, impl="xla", token_chunk=token_chunk,
      vocab_chunk=vocab_chunk), h, w, g_lp, g_ent)
  _assert_close(got, want)


def test_pallas_interpret_matches_reference():
  h, w, t, g_lp, g_ent = _inputs(19, 8, 70, seed=1, scale=0.8)
  want = _value_and_grads(lambda h, w: reference_token_logprobs(
      h, w, t, temperature=0.8), h, w, g_lp, g_ent)
  got = _value_and_grads(lambda h, w: token_logprobs(
      h, w, t, temperature=0.8, impl="pallas", token_chunk=8, vocab_chunk=32,
      interpret=True), h, w, g_lp, g_ent)
  _assert_close(got, want)


def test_default_impl_and_errors():
  h, w, t, _, _ = _inputs(6, 4, 9)
  lp, ent = token_logprobs(h, w, t)  # impl=None -> "xla" on CPU.
  want_lp, want_ent = _np_reference(h, w, t, 1.0)
  np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-6)
  assert lp.dtype == ent.dtype == jnp.float32 and lp.shape == (6,)
  with pytest.raises(KernelError, match="unknown token_logprobs impl"):
    token_logprobs(h, w, t, impl="cuda")
  with pytest.raises(KernelError, match="hidden"):
    token_logprobs(h[None], w, t)
  with pytest.raises(KernelError, match="integer"):
    token_logprobs(h, w, t.astype(jnp.float32))
  with pytest.raises(KernelError, match="temperature"):
    token_logprobs(h, w, t, temperature=0.0)


def _max_intermediate_size(jaxpr) -> int:
  best = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      best = max(best, int(np.prod(getattr(var.aval, "shape", ()))))
    for sub in _sub_jaxprs(eqn.params):
      best = max(best, _max_intermediate_size(sub))
  return best


def _sub_jaxprs(params):
  for p in params.values():
    for x in (p if isinstance(p, (list, tuple)) else [p]):
      if hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
        yield x.jaxpr
      elif hasattr(x, "eqns"):
        yield x


def test_xla_never_materialises_logits():
  """No intermediate of value-and-grad (forward and backward) is as large as [N, V]."""
  n, d, v = 64, 8, 512
  h, w, t, g_lp, g_ent = _inputs(n, d, v)
  f = lambda h, w: jnp.sum(g_lp * token_logprobs(h, w, t, impl="xla", token_chunk=16,
                                                 vocab_chunk=128)[0])
  jaxpr = jax.make_jaxpr(jax.value_and_grad(f, argnums=(0, 1)))(h, w).jaxpr
  assert _max_intermediate_size(jaxpr) <= max(d * v, 16 * 128)
  ref = lambda h, w: jnp.sum(g_lp * reference_token_logprobs(h, w, t)[0])
  assert _max_intermediate_size(jax.make_jaxpr(ref)(h, w).jaxpr) >= n * v  # Test can fail.


@pytest.fixture(scope="module")
def mesh():
  if jax.device_count() < 8:
    pytest.skip("needs 8 host devices (tests/conftest.py sets XLA_FLAGS)")
  return jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))


@pytest.mark.parametrize("impl,kw", [
    ("xla", dict(token_chunk=4, vocab_chunk=13)),
    ("reference", {}),
    ("pallas", dict(token_chunk=4, vocab_chunk=16, interpret=True)),
])
def test_sharded_matches_reference(mesh, impl, kw):
  n, d, v = 36, 16, 202  # N / 4 = 9 tokens and V / 2 = 101 columns per shard.
  h, w, t, g_lp, g_ent = _inputs(n, d, v, seed=2, scale=0.5)
  want = _value_and_grads(lambda h, w: reference_token_logprobs(
      h, w, t, temperature=0.9), h, w, g_lp, g_ent)
  hs = jax.device_put(h, NamedSharding(mesh, P(("data", "fsdp"), None)))
  ws = jax.device_put(w, NamedSharding(mesh, P(None, "tensor")))
  got = _value_and_grads(lambda h, w: token_logprobs(
      h, w, t, temperature=0.9, impl=impl, mesh=mesh, **kw), hs, ws, g_lp, g_ent)
  _assert_close(got, want)


def test_sharded_reshards_inputs_and_checks_shapes(mesh):
  h, w, t, g_lp, g_ent = _inputs(8, 4, 10, seed=3)
  rep = NamedSharding(mesh, P())
  hs, ws = jax.device_put(h, rep), jax.device_put(w, rep)  # Replicated: resharded inside.
  lp, ent = jax.jit(lambda h, w: token_logprobs_sharded(h, w, t, mesh, impl="xla"))(hs, ws)
  want_lp, want_ent = _np_reference(h, w, t, 1.0)
  np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-6)
  auto = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  lp_auto, _ = jax.jit(lambda h, w: token_logprobs(h, w, t, mesh=auto, impl="xla"))(h, w)
  np.testing.assert_allclose(np.asarray(lp_auto), want_lp, rtol=1e-5, atol=1e-6)
  with pytest.raises(ShardingError, match="divisible"):
    token_logprobs_sharded(h[:6], w, t[:6], mesh)
  with pytest.raises(ShardingError, match="vocab axis"):
    token_logprobs_sharded(h, w, t, mesh, vocab_axis="model")


def test_xla_is_the_default_and_compiled_pallas_refuses_shapes_triton_cannot_take():
  assert _resolve(None, None, None, None).impl == "xla"
  h = jnp.zeros((8, 24), jnp.float32)  # hidden 24 and vocab 40 are not powers of two
  w = jnp.zeros((24, 40), jnp.float32)
  tgt = jnp.zeros((8,), jnp.int32)
  with pytest.raises(KernelError, match="power-of-two"):
    token_logprobs_pallas.stats_fwd(h, w, tgt, temperature=1.0, block_tokens=8, block_vocab=8, interpret=False)
  z = jnp.zeros((8,), jnp.float32)
  with pytest.raises(KernelError, match="power-of-two"):
    token_logprobs_pallas.stats_bwd(h, w, tgt, z, z, z, z, z, temperature=1.0, block_tokens=8, block_vocab=8,
                  interpret=False)
