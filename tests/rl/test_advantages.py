"""Advantage estimators against plain NumPy loops."""

import jax
import numpy as np
import pytest

from legorl_jax.errors import ConfigError
from legorl_jax.rl import advantages as A


def _np_group(rewards, valid, mask_broken, fn):
  """Applies fn(list of valid rewards) -> list of advantages per group, with masking rules."""
  g, n = rewards.shape
  adv, mask = np.zeros((g, n)), np.zeros((g, n))
  for i in range(g):
    if mask_broken and not valid[i].all():
      continue
    idx = [j for j in range(n) if valid[i, j]]
    out = fn([float(rewards[i, j]) for j in idx])
    if out is None:
      continue
    for j, a in zip(idx, out):
      adv[i, j], mask[i, j] = a, 1.0
  return adv, mask


def _np_grpo(rs, eps=1e-6, ddof=0):
  mean = sum(rs) / len(rs)
  var = sum((r - mean) ** 2 for r in rs) / max(len(rs) - ddof, 1)
  return [(r - mean) / (var ** 0.5 + eps) for r in rs]


def _np_dr_grpo(rs):
  mean = sum(rs) / len(rs)
  return [r - mean for r in rs]


def _np_rloo(rs):
  if len(rs) < 2:
    return None
  return [r - (sum(rs) - r) / (len(rs) - 1) for r in rs]


@pytest.fixture
def data():
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(5, 4)).astype(np.float32)
  rewards[1] = 0.5  # A group with identical rewards.
  valid = np.ones((5, 4), bool)
  valid[2, 1] = False
  valid[3, :3] = False  # Only one valid trial left.
  rewards[2, 1] = np.nan  # Broken trials may carry garbage.
  return rewards, valid


@pytest.mark.parametrize("mask_broken", [True, False])
@pytest.mark.parametrize("name,ref,kw", [
    ("grpo", _np_grpo, {}),
    ("grpo", lambda rs: _np_grpo(rs, ddof=1), {"std_ddof": 1}),
    ("dr_grpo", _np_dr_grpo, {}),
    ("rloo", _np_rloo, {}),
])
def test_group_estimators_match_numpy(data, name, ref, kw, mask_broken):
  rewards, valid = data
  adv, mask = A.compute_advantages(name, rewards, valid, mask_broken_groups=mask_broken, **kw)
  want_adv, want_mask = _np_group(rewards, valid, mask_broken, ref)
  np.testing.assert_allclose(np.asarray(mask), want_mask)
  np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-5, atol=1e-6)
  assert np.all(np.isfinite(np.asarray(adv)))


def test_broken_group_masked_whole(data):
  rewards, valid = data
  adv, mask = A.grpo_advantages(rewards, valid)
  assert not np.asarray(mask)[2].any() and not np.asarray(adv)[2].any()
  assert np.asarray(mask)[0].all()
  # Identical rewards: zero advantage but still trained on (mask 1).
  assert np.asarray(mask)[1].all() and not np.asarray(adv)[1].any()


def test_registry_and_jit(data):
  rewards, valid = data
  assert set(A.ADVANTAGE_ESTIMATORS) == {"grpo", "dr_grpo", "rloo"}
  fn = jax.jit(lambda r, v: A.compute_advantages("rloo", r, v))
  np.testing.assert_allclose(np.asarray(fn(rewards, valid)[0]),
                             np.asarray(A.rloo_advantages(rewards, valid)[0]), atol=1e-6)
  with pytest.raises(ConfigError, match="unknown advantage estimator"):
    A.compute_advantages("ppo2", rewards, valid)
  with pytest.raises(ConfigError, match="groups, trials"):
    A.compute_advantages("grpo", rewards.reshape(-1), None)


def _np_gae(r, v, d, m, gamma, lam, last):
  b, t = r.shape
  adv, ret = np.zeros((b, t)), np.zeros((b, t))
  for i in range(b):
    next_v, next_a = last[i], 0.0
    for k in reversed(range(t)):
      nd = 1.0 - d[i, k]
      if not m[i, k]:
        if d[i, k]:  # the episode ends after this skipped step: nothing to bootstrap from
          next_v, next_a = 0.0, 0.0
        continue
      delta = r[i, k] + gamma * next_v * nd - v[i, k]
      a = delta + gamma * lam * nd * next_a
      adv[i, k], ret[i, k] = a, a + v[i, k]
      next_v, next_a = v[i, k], a
  return adv, ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_numpy(gamma, lam):
  rng = np.random.default_rng(2)
  b, t = 3, 11
  r = rng.normal(size=(b, t)).astype(np.float32)
  v = rng.normal(size=(b, t)).astype(np.float32)
  d = np.zeros((b, t), np.float32)
  d[0, 4] = d[0, 10] = d[1, 10] = 1.0
  m = rng.random((b, t)) > 0.3
  last = rng.normal(size=b).astype(np.float32)
  adv, ret = A.gae(r, v, d, gamma=gamma, lam=lam, last_value=last, mask=m)
  want_adv, want_ret = _np_gae(r, v, d, m, gamma, lam, last)
  np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-5, atol=1e-5)


def test_gae_episode_end_on_a_skipped_step_cuts_the_bootstrap():
  # step 1 is not an action (mask 0) but the episode ends there: step 0 is terminal, so its
  # advantage is r0 - v0, not a bootstrap from step 2's value.
  adv, _ = A.gae(np.array([[0.0, 0.0, 1.0]]), np.array([[0.5, 0.0, 5.0]]),
                 np.array([[0.0, 1.0, 0.0]]), mask=np.array([[1.0, 0.0, 1.0]]))
  np.testing.assert_allclose(np.asarray(adv), [[-0.5, 0.0, -4.0]], atol=1e-6)


def test_whiten_masked():
  rng = np.random.default_rng(3)
  x = rng.normal(3.0, 2.0, size=(4, 9)).astype(np.float32)
  m = rng.random((4, 9)) > 0.4
  sel = x[m].astype(np.float64)
  want = np.where(m, (x - sel.mean()) / np.sqrt(sel.var() + 1e-8), 0.0)
  np.testing.assert_allclose(np.asarray(A.whiten(x, m)), want, rtol=1e-5, atol=1e-5)
  want_scale = np.where(m, x / np.sqrt(sel.var() + 1e-8), 0.0)
  np.testing.assert_allclose(np.asarray(A.whiten(x, m, shift_mean=False)), want_scale,
                             rtol=1e-5, atol=1e-5)
