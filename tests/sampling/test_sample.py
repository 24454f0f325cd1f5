"""sample_tokens / truncation_mask against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np

from legorl_jax.sampling.sample import (first_argmax, first_true, row_keys, sample_tokens,
                                        truncation_mask)
from tests.sampling import reference


def _keys(n, seed=0):
  return row_keys(jnp.full((n,), seed, jnp.uint32), jnp.arange(n, dtype=jnp.int32))


def test_greedy_and_tempered_logprobs():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 50)).astype(np.float32) * 3
  temp = np.array([0.0, 0.0, 0.7, 1.0, 1.3, 0.7], np.float32)
  top_p = np.array([1.0, 0.5, 1.0, 0.9, 1.0, 0.3], np.float32)
  top_k = np.array([0, 3, 0, 0, 10, 5], np.int32)
  ids, logp = jax.jit(sample_tokens)(logits, _keys(6), temp, top_p, top_k)
  ids, logp = np.asarray(ids), np.asarray(logp)
  for r in range(6):
    if temp[r] == 0:
      assert ids[r] == np.argmax(logits[r])
      want = reference.log_softmax(logits[r])[ids[r]]
    else:
      want = reference.log_softmax(logits[r] / temp[r])[ids[r]]  # untruncated, by design
      assert ids[r] in reference.allowed_set(logits[r], temp[r], top_p[r], top_k[r])
    np.testing.assert_allclose(logp[r], want, atol=1e-5)


def test_first_argmax_and_first_true_match_numpy_ties_and_nan():
  rng = np.random.default_rng(3)
  x = rng.integers(-3, 3, size=(40, 33)).astype(np.float32)  # many ties: the first one wins
  x[5, 7] = x[5, 20] = np.nan  # argmax convention: the first NaN
  x[6, :] = -np.inf
  np.testing.assert_array_equal(np.asarray(jax.jit(first_argmax)(x)), np.argmax(x, axis=-1))
  mask = rng.random((40, 33)) < 0.1
  want = np.where(mask.any(-1), np.argmax(mask, axis=-1), 33)
  np.testing.assert_array_equal(np.asarray(jax.jit(first_true)(mask)), want)


def test_all_greedy_batch_matches_mixed_batch_rows():
  """The all-greedy fast path picks the same ids and logprobs as greedy rows in a mixed batch."""
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(4, 64)).astype(np.float32)
  ones, zeros = np.ones(4, np.float32), np.zeros(4, np.int32)
  all_greedy = jax.jit(sample_tokens)(logits, _keys(4), np.zeros(4, np.float32), ones, zeros)
  mixed_t = np.array([0.0, 0.8, 0.0, 1.0], np.float32)
  mixed = jax.jit(sample_tokens)(logits, _keys(4), mixed_t, ones, zeros)
  for r in (0, 2):
    assert int(all_greedy[0][r]) == int(mixed[0][r]) == int(np.argmax(logits[r]))
    assert float(all_greedy[1][r]) == float(mixed[1][r])


def test_truncation_mask_matches_numpy():
  rng = np.random.default_rng(1)
  n, v = 64, 40
  logits = rng.normal(size=(n, v)).astype(np.float32) * 2
  top_p = rng.choice([0.1, 0.5, 0.9, 0.99, 1.0], n).astype(np.float32)
  top_k = rng.choice([0, 1, 3, 17, 40, 100], n).astype(np.int32)
  mask = np.asarray(jax.jit(truncation_mask)(logits, top_p, top_k))
  for r in range(n):
    assert set(np.flatnonzero(mask[r]).tolist()) == reference.allowed_set(
        logits[r], 1.0, top_p[r], top_k[r]), (r, top_p[r], top_k[r])


def test_sampled_frequencies_follow_truncated_distribution():
  rng = np.random.default_rng(2)
  v, n = 8, 4000
  row = rng.normal(size=v).astype(np.float32)
  temp, top_p, top_k = 0.8, 0.9, 5
  logits = np.broadcast_to(row, (n, v))
  ids, _ = jax.jit(sample_tokens)(
      logits, _keys(n, seed=7), np.full(n, temp, np.float32), np.full(n, top_p, np.float32),
      np.full(n, top_k, np.int32))
  allowed = sorted(reference.allowed_set(row, temp, top_p, top_k))
  assert set(np.asarray(ids).tolist()) <= set(allowed)
  p = np.exp(reference.log_softmax(row / temp)[allowed])
  p /= p.sum()
  freq = np.bincount(np.asarray(ids), minlength=v)[allowed] / n
  np.testing.assert_allclose(freq, p, atol=0.03)


def test_keys_depend_on_seed_and_position_only():
  a = row_keys(jnp.array([5, 5, 6], jnp.uint32), jnp.array([3, 4, 3], jnp.int32))
  b = row_keys(jnp.array([6, 5], jnp.uint32), jnp.array([3, 3], jnp.int32))
  np.testing.assert_array_equal(a[0], b[1])
  np.testing.assert_array_equal(a[2], b[0])
  assert not np.array_equal(a[0], a[1])
