"""Metric merge/finalize rules and masked statistics vs NumPy."""

import jax
import numpy as np

from legorl_jax.rl import metrics as M


def test_masked_stats_match_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 50)).astype(np.float32)
  m = rng.random((4, 50)) > 0.3
  np.testing.assert_allclose(float(M.masked_sum(x, m)), x[m].sum(), rtol=1e-5)
  np.testing.assert_allclose(float(M.masked_max(x, m)), x[m].max())
  np.testing.assert_allclose(float(M.masked_quantile(x, m, 0.99)),
                             np.quantile(x[m], 0.99, method="higher"), rtol=1e-6)
  assert float(M.masked_quantile(x, np.zeros_like(m), 0.99)) == -np.inf
  assert float(jax.jit(M.masked_max)(x, np.zeros_like(m))) == -np.inf


def test_merge_then_finalize_gives_exact_means():
  a = {"tokens": 2.0, "seqs": 1.0, "x_sum": 3.0, "x_max": 5.0, "d_p99": 1.0}
  b = {"tokens": 6.0, "seqs": 2.0, "x_sum": 5.0, "x_max": 4.0, "d_p99": 2.0}
  f = M.finalize_metrics(jax.jit(M.merge_metrics)(a, b))
  assert float(f["x"]) == 1.0 and float(f["tokens"]) == 8.0 and float(f["seqs"]) == 3.0
  assert float(f["x_max"]) == 5.0 and float(f["d_p99"]) == 2.0
  assert "x_sum" not in f


def test_merged_p99_bounds_the_full_batch_p99_for_any_split():
  quantile = jax.jit(lambda x, m: M.masked_quantile(x, m, 0.99))

  def p99(v):  # one padded shape, so one compilation: the mask selects the values
    x, m = np.zeros((1, 512), np.float32), np.zeros((1, 512), np.float32)
    x[0, :len(v)], m[0, :len(v)] = v, 1.0
    return float(quantile(x, m))
  assert max(p99([0, 1]), p99([0, 1])) >= p99([0, 0, 1, 1])  # interpolation gets this wrong
  rng = np.random.default_rng(1)
  for _ in range(200):
    n = int(rng.integers(2, 400))
    v = rng.exponential(size=n).round(int(rng.integers(0, 3)))  # ties included
    cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(1, min(n - 1, 6) + 1)),
                              replace=False))
    parts = np.split(rng.permutation(v), cuts)
    assert max(p99(p) for p in parts) >= p99(v)
    assert p99(v) == np.quantile(v.astype(np.float32), 0.99, method="higher")
