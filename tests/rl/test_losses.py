"""Policy/value losses, mismatch correction, KL, entropy and aggregation vs NumPy loops."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from legorl_jax.errors import ConfigError
from legorl_jax.rl import losses as L
from legorl_jax.rl import metrics as M

B, T = 3, 12
MAX_LEN = 16


def _make_batch(seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  seg = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0],
                  [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                  [1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 0]], np.int32)
  mask = (rng.random((B, T)) > 0.25).astype(dtype)
  mask[0, 0] = mask[2, 5] = 1.0
  mask[2, 0] = mask[2, 1] = 0.0  # Segment 1 of row 2 has no trained token.
  logp = -rng.random((B, T)).astype(dtype) * 3.0
  old = logp + rng.normal(0, 0.3, (B, T)).astype(dtype)
  rollout = old + rng.normal(0, 0.4, (B, T)).astype(dtype)
  ref = logp + rng.normal(0, 0.2, (B, T)).astype(dtype)
  seq_adv = rng.normal(size=(B, T + 1)).astype(dtype)
  adv = np.take_along_axis(seq_adv, seg, axis=1)
  entropy = rng.random((B, T)).astype(dtype) * 2.0
  return {"logp": logp, "old_logp": old, "rollout_logp": rollout, "ref_logp": ref,
          "advantages": adv, "loss_mask": mask, "segment_ids": seg, "entropy": entropy}


def _sequences(b):
  """{(row, seg): [t, ...]} over counted tokens (mask > 0, seg > 0)."""
  out = {}
  for i in range(B):
    for t in range(T):
      s = b["segment_ids"][i, t]
      if s > 0 and b["loss_mask"][i, t] > 0:
        out.setdefault((i, int(s)), []).append(t)
  return out


def _np_aggregate(loss, b, mode, max_len=MAX_LEN):
  seqs = _sequences(b)
  if mode == "token-mean":
    toks = [loss[i, t] for (i, _), ts in seqs.items() for t in ts]
    return sum(toks), len(toks)
  per = []
  for (i, _), ts in seqs.items():
    tot = sum(loss[i, t] for t in ts)
    if mode == "seq-mean-token-mean":
      per.append(tot / len(ts))
    elif mode == "seq-mean-token-sum":
      per.append(tot)
    else:
      per.append(tot / max_len)
  return sum(per), len(per)


def _np_seq_value(b, fn):
  """Per-token array whose entries are fn(row, token list) for the token's sequence."""
  out = np.zeros((B, T))
  for (i, _), ts in _sequences(b).items():
    val = fn(i, ts)
    for t in ts:
      out[i, t] = val
  return out


def _np_clip_surr(r, a, lo, hi, c=None):
  loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
  if c is not None and a < 0:
    loss = min(loss, -a * c)
  return loss


def _np_policy_term(name, b, cfg):
  """Per-token policy term (before IS weights, KL and entropy) as float64 [B, T]."""
  lp, old, adv = (b[k].astype(np.float64) for k in ("logp", "old_logp", "advantages"))
  out = np.zeros((B, T))
  if name in ("ppo", "grpo"):
    for i in range(B):
      for t in range(T):
        out[i, t] = _np_clip_surr(math.exp(lp[i, t] - old[i, t]), adv[i, t], cfg.clip_eps_low,
                                  cfg.clip_eps_high, cfg.dual_clip_c)
  elif name in ("gspo", "gspo_token"):
    def seq_loss(i, ts):
      s = math.exp(np.mean([lp[i, t] - old[i, t] for t in ts]))
      a = np.mean([adv[i, t] for t in ts])
      return _np_clip_surr(s, a, cfg.clip_eps_low, cfg.clip_eps_high, cfg.dual_clip_c)
    out = _np_seq_value(b, seq_loss)
  elif name == "cispo":
    lower = 0.0 if cfg.cispo_eps_low is None else 1 - cfg.cispo_eps_low
    for i in range(B):
      for t in range(T):
        w = min(max(math.exp(lp[i, t] - old[i, t]), lower), 1 + cfg.cispo_eps_high)
        out[i, t] = -w * adv[i, t] * lp[i, t]
  elif name == "reinforce":
    out = -adv * lp
  return out


def _np_is_weight(b, cfg):
  log_w = (b["old_logp"] - b["rollout_logp"]).astype(np.float64)
  if cfg.is_level == "sequence":
    red = np.mean if cfg.is_seq_reduce == "geo_mean" else np.sum
    log_w = _np_seq_value(b, lambda i, ts: red([log_w[i, t] for t in ts]))
  w = np.exp(log_w)
  if cfg.is_correction == "tis":
    return np.minimum(w, cfg.tis_cap)
  return np.where((w < cfg.mis_low) | (w > cfg.mis_high), 0.0, w)


def _np_kl(b, est):
  lr = (b["logp"] - b["ref_logp"]).astype(np.float64)
  return {"k1": lr, "k2": 0.5 * lr ** 2, "k3": np.exp(-lr) - 1 + lr}[est]


def _np_total(name, b, cfg):
  loss = _np_policy_term(name, b, cfg)
  if cfg.is_correction != "none":
    loss = loss * _np_is_weight(b, cfg)
  if cfg.kl_coef:
    loss = loss + cfg.kl_coef * _np_kl(b, cfg.kl_estimator)
  loss = loss - cfg.entropy_coef * b["entropy"]
  return _np_aggregate(loss, b, cfg.aggregation, cfg.max_len)


CASES = [
    ("ppo", dict()),
    ("ppo", dict(clip_eps_high=0.28, dual_clip_c=3.0, aggregation="seq-mean-token-mean")),
    ("grpo", dict(kl_coef=0.05, kl_estimator="k3", aggregation="seq-mean-token-sum")),
    ("gspo", dict(clip_eps_low=3e-2, clip_eps_high=4e-2, aggregation="seq-mean-token-mean")),
    ("gspo_token", dict(clip_eps_low=3e-2, clip_eps_high=4e-2,
                        aggregation="seq-mean-token-sum-norm", max_len=MAX_LEN)),
    ("cispo", dict(cispo_eps_high=0.5, entropy_coef=0.01)),
    ("cispo", dict(cispo_eps_low=0.5, cispo_eps_high=0.3, kl_coef=0.1, kl_estimator="k2")),
    ("reinforce", dict(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.02)),
    ("ppo", dict(is_correction="tis", tis_cap=1.5)),
    ("ppo", dict(is_correction="mis", mis_low=0.7, mis_high=1.4)),
    ("grpo", dict(is_correction="tis", is_level="sequence", tis_cap=1.2,
                  aggregation="seq-mean-token-mean")),
    ("gspo", dict(is_correction="mis", is_level="sequence", is_seq_reduce="product",
                  mis_low=0.2, mis_high=3.0)),
    ("cispo", dict(is_correction="mis", is_level="sequence", mis_low=0.8, mis_high=1.25,
                   aggregation="seq-mean-token-sum-norm", max_len=MAX_LEN)),
]


@pytest.mark.parametrize("name,kw", CASES)
def test_policy_loss_matches_numpy(name, kw):
  b = _make_batch()
  cfg = L.LossConfig(**kw)
  s, d, m = L.policy_loss(name, b, cfg)
  want_s, want_d = _np_total(name, b, cfg)
  assert float(d) == want_d
  np.testing.assert_allclose(float(s), want_s, rtol=2e-5, atol=1e-6)
  assert int(m["tokens"]) == int(np.sum(b["loss_mask"] * (b["segment_ids"] > 0)))
  assert int(m["seqs"]) == len(_sequences(b))


def test_config_dict_and_registry():
  b = _make_batch()
  assert set(L.POLICY_LOSSES) == {"ppo", "grpo", "gspo", "gspo_token", "cispo", "reinforce"}
  cd = ml_collections.ConfigDict({"clip_eps_high": 0.28, "aggregation": "seq-mean-token-mean"})
  s1, d1, _ = L.policy_loss("ppo", b, cd)
  s2, d2, _ = L.policy_loss("ppo", b, L.LossConfig(clip_eps_high=0.28,
                                                     aggregation="seq-mean-token-mean"))
  assert float(s1) == float(s2) and float(d1) == float(d2)
  with pytest.raises(ConfigError, match="unknown policy loss"):
    L.policy_loss("trpo", b, None)
  with pytest.raises(ConfigError, match="rollout_logp"):
    L.policy_loss("ppo", dict(b, rollout_logp=None), L.LossConfig(is_correction="tis"))
  with pytest.raises(ConfigError, match="max_len"):
    L.policy_loss("ppo", b, L.LossConfig(aggregation="seq-mean-token-sum-norm"))
  with pytest.raises(ConfigError, match="aggregation"):
    L.policy_loss("ppo", b, L.LossConfig(aggregation="mean"))


def test_on_policy_defaults_and_jit():
  """old_logp=None means on-policy: ratio 1, gradient = REINFORCE gradient."""
  b = _make_batch()
  b_on = dict(b, old_logp=None, rollout_logp=None)
  fn = jax.jit(lambda bb: L.policy_loss("ppo", bb, L.LossConfig()))
  s, d, m = fn(b_on)
  np.testing.assert_allclose(float(s), -np.sum(b["advantages"] * b["loss_mask"] *
                                               (b["segment_ids"] > 0)), rtol=1e-5)
  g_ppo = jax.grad(lambda lp: L.policy_loss("ppo", dict(b_on, logp=lp))[0])(b["logp"])
  g_rf = jax.grad(lambda lp: L.policy_loss("reinforce", dict(b_on, logp=lp))[0])(b["logp"])
  np.testing.assert_allclose(np.asarray(g_ppo), np.asarray(g_rf), rtol=1e-6, atol=1e-7)
  assert "rollout_abs_dlogp_max" not in m


def test_metrics_match_numpy():
  b = _make_batch()
  cfg = L.LossConfig(clip_eps_low=0.1, clip_eps_high=0.15, dual_clip_c=1.3,
                     is_correction="tis", tis_cap=1.3, kl_coef=0.1)
  _, _, m = L.policy_loss("ppo", b, cfg)
  f = M.finalize_metrics(m)
  sel = (b["loss_mask"] > 0) & (b["segment_ids"] > 0)
  lr = (b["logp"] - b["old_logp"]).astype(np.float64)[sel]
  r, a = np.exp(lr), b["advantages"][sel]
  np.testing.assert_allclose(f["clip_low_frac"], np.mean((a < 0) & (r < 0.9)), rtol=1e-6)
  np.testing.assert_allclose(f["clip_high_frac"], np.mean((a > 0) & (r > 1.15)), rtol=1e-6)
  np.testing.assert_allclose(f["dual_clip_frac"], np.mean((a < 0) & (r > 1.3)), rtol=1e-6)
  np.testing.assert_allclose(f["approx_kl_k1"], np.mean(-lr), rtol=1e-5)
  np.testing.assert_allclose(f["approx_kl_k3"], np.mean(r - 1 - lr), rtol=1e-5)
  np.testing.assert_allclose(f["ratio"], np.mean(r), rtol=1e-5)
  np.testing.assert_allclose(f["ratio_max"], np.max(r), rtol=1e-5)
  np.testing.assert_allclose(f["entropy"], np.mean(b["entropy"][sel]), rtol=1e-5)
  np.testing.assert_allclose(f["kl_ref"], np.mean(_np_kl(b, "k3")[sel]), rtol=1e-5)
  dl = np.abs(b["old_logp"] - b["rollout_logp"]).astype(np.float64)[sel]
  np.testing.assert_allclose(f["rollout_abs_dlogp"], dl.mean(), rtol=1e-5)
  np.testing.assert_allclose(f["rollout_abs_dlogp_max"], dl.max(), rtol=1e-6)
  np.testing.assert_allclose(f["rollout_abs_dlogp_p99"], np.quantile(dl, 0.99, method="higher"),
                             rtol=1e-6)
  w = np.exp((b["old_logp"] - b["rollout_logp"]).astype(np.float64)[sel])
  np.testing.assert_allclose(f["is_weight"], np.mean(np.minimum(w, 1.3)), rtol=1e-5)
  np.testing.assert_allclose(f["is_truncated_frac"], np.mean(w > 1.3), rtol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", ["ppo", "gspo"])
def test_microbatch_accumulation_equals_full_batch(mode, name):
  b = _make_batch(seed=4)
  cfg = L.LossConfig(aggregation=mode, max_len=MAX_LEN, is_correction="tis",
                     is_level="sequence", kl_coef=0.05)
  s, d, m = L.policy_loss(name, b, cfg)
  acc_s, acc_d, acc_m = 0.0, 0.0, None
  for rows in ([0], [1, 2]):
    mb = {k: v[rows] for k, v in b.items()}
    si, di, mi = L.policy_loss(name, mb, cfg)
    acc_s, acc_d = acc_s + si, acc_d + di
    acc_m = mi if acc_m is None else M.merge_metrics(acc_m, mi)
  np.testing.assert_allclose(float(acc_s / acc_d), float(s / d), rtol=1e-6)
  full, merged = M.finalize_metrics(m), M.finalize_metrics(acc_m)
  for k, v in full.items():
    if k.endswith("_p99"):
      assert float(merged[k]) >= float(v) - 1e-6  # Merged p99 bounds the full one.
    else:
      np.testing.assert_allclose(float(merged[k]), float(v), rtol=1e-5, err_msg=k)


def test_value_loss_matches_numpy():
  rng = np.random.default_rng(5)
  b = _make_batch()
  v, old, ret = (rng.normal(size=(B, T)).astype(np.float32) for _ in range(3))
  for clip in (None, 0.2):
    s, d, m = L.value_loss(v, old, ret, b["loss_mask"], b["segment_ids"], clip_eps=clip)
    per = 0.5 * (v - ret) ** 2
    if clip is not None:
      per = np.maximum(per, 0.5 * (old + np.clip(v - old, -clip, clip) - ret) ** 2)
    want_s, want_d = _np_aggregate(per, b, "token-mean")
    np.testing.assert_allclose(float(s), want_s, rtol=1e-5)
    assert float(d) == want_d


# ------------------------------------------------------------------ float64 gradients


@pytest.fixture
def x64():
  prev = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  yield
  jax.config.update("jax_enable_x64", prev)


def _fd_grad(f, x, eps=1e-6):
  g = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    xp, xm = x.copy(), x.copy()
    xp[idx] += eps
    xm[idx] -= eps
    g[idx] = (f(xp) - f(xm)) / (2 * eps)
  return g


@pytest.mark.parametrize("name,kw", [
    ("ppo", dict(clip_eps_high=0.28, dual_clip_c=2.0, is_correction="tis", kl_coef=0.1,
                 aggregation="seq-mean-token-mean")),
    ("gspo", dict(clip_eps_low=0.1, clip_eps_high=0.12, aggregation="seq-mean-token-mean",
                  kl_coef=0.05, is_correction="mis", is_level="sequence", mis_low=0.3,
                  mis_high=3.0)),
    ("gspo_token", dict(clip_eps_low=0.1, clip_eps_high=0.12, aggregation="token-mean")),
])
def test_gradients_match_finite_differences(x64, name, kw):
  b = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in
       _make_batch(seed=6).items()}
  cfg = L.LossConfig(**kw)

  def f(lp):
    s, d, _ = L.policy_loss(name, dict(b, logp=lp), cfg)
    return s / d

  f = jax.jit(f)
  g = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(b["logp"])))
  assert g.dtype == np.float64
  want = _fd_grad(lambda lp: float(f(jnp.asarray(lp))), b["logp"])
  np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-8)
  assert np.abs(g).sum() > 0


def test_gspo_token_equals_gspo_for_sequence_advantages(x64):
  b = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in
       _make_batch(seed=7).items()}
  cfg = L.LossConfig(clip_eps_low=0.1, clip_eps_high=0.12, aggregation="seq-mean-token-mean")
  grads, vals = [], []
  for name in ("gspo", "gspo_token"):
    f = lambda lp: L.policy_loss(name, dict(b, logp=lp), cfg)[0]
    vals.append(float(f(jnp.asarray(b["logp"]))))
    grads.append(np.asarray(jax.grad(f)(jnp.asarray(b["logp"]))))
  np.testing.assert_allclose(vals[0], vals[1], rtol=1e-12)
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_padding_garbage_does_not_leak(name):
  b = _make_batch(seed=8)
  off = (b["loss_mask"] == 0) | (b["segment_ids"] == 0)
  dirty = dict(b)
  for k in ("old_logp", "rollout_logp", "ref_logp"):
    dirty[k] = np.where(off, -np.inf, b[k]).astype(np.float32)
  cfg = L.LossConfig(is_correction="tis", is_level="sequence", kl_coef=0.1)
  f = lambda bb, lp: L.policy_loss(name, dict(bb, logp=lp), cfg)[0]
  np.testing.assert_allclose(float(f(dirty, b["logp"])), float(f(b, b["logp"])), rtol=1e-6)
  g = np.asarray(jax.grad(lambda lp: f(dirty, lp))(b["logp"]))
  assert np.all(np.isfinite(g))
  np.testing.assert_allclose(g, np.asarray(jax.grad(lambda lp: f(b, lp))(b["logp"])),
                             rtol=1e-6, atol=1e-8)
