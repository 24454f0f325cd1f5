"""Issue 44's objective options against naive references: the asymmetric (clip-higher) PPO/GRPO
clip, the demonstration-replay NLL term (value and gradient, through the real train step and
through batching), and the KL guard that stops a run."""

import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.models.params import split_model
from legorl_jax.rl import losses as L
from legorl_jax.rollout.trajectory import Segment, Trajectory
from legorl_jax.trainer import batching, demo_replay, kl_guard, rl_loop
from legorl_jax.trainer import state as state_lib
from legorl_jax.trainer import train_step as ts
from tests.trainer import test_train_step as helpers


# -- asymmetric clip ---------------------------------------------------------------------------

def _naive_clip_loss(logp, old, adv, mask, lo, hi):
  """Token-mean of max(-A r, -A clip(r, 1 - lo, 1 + hi)), one token at a time."""
  total, n = 0.0, 0
  for i in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      if mask[i, t]:
        r = math.exp(logp[i, t] - old[i, t])
        total += max(-adv[i, t] * r, -adv[i, t] * min(max(r, 1 - lo), 1 + hi))
        n += 1
  return total / n


@pytest.mark.parametrize("hi", [0.2, 0.28])
def test_asymmetric_clip_matches_the_formula(hi):
  rng = np.random.default_rng(0)
  logp = np.log(rng.uniform(0.05, 0.9, (4, 16)))
  # Ratios spread over [0.7, 1.4]: some beyond 1.2, some between 1.2 and 1.28, some beyond 1.28.
  old = logp - np.log(rng.uniform(0.7, 1.4, (4, 16)))
  adv = np.repeat(rng.normal(size=(4, 1)), 16, 1)
  mask = (rng.random((4, 16)) < 0.8).astype(np.float64)
  cfg = L.LossConfig(clip_eps_low=0.2, clip_eps_high=hi)
  batch = {"logp": jnp.asarray(logp, jnp.float32), "old_logp": jnp.asarray(old, jnp.float32),
           "advantages": jnp.asarray(adv, jnp.float32), "loss_mask": jnp.asarray(mask, jnp.float32)}
  s, d, _ = L.policy_loss("grpo", batch, cfg)
  np.testing.assert_allclose(float(s / d), _naive_clip_loss(logp, old, adv, mask, 0.2, hi), rtol=1e-5)


def test_clip_higher_keeps_the_gradient_of_rising_positive_tokens():
  """With A > 0 and r in (1 + eps_low, 1 + eps_high), the symmetric clip removes the token's
  gradient and the clip-higher one keeps it (DAPO's point: low-probability tokens can rise)."""
  logp = jnp.log(jnp.asarray([[0.25, 0.5, 0.5]]))
  old = logp - jnp.log(jnp.asarray([[1.25, 1.25, 1.1]]))  # ratios 1.25, 1.25, 1.1
  adv = jnp.asarray([[1.0, -1.0, 1.0]])
  mask = jnp.ones((1, 3))

  def grad(hi):
    f = lambda lp: L.policy_loss("grpo", {"logp": lp, "old_logp": old, "advantages": adv,
                                           "loss_mask": mask}, L.LossConfig(clip_eps_high=hi))[0]
    return np.asarray(jax.grad(f)(logp))[0]

  sym, asym = grad(0.2), grad(0.28)
  assert sym[0] == 0 and asym[0] == pytest.approx(-1.25)  # d(-A r)/dlogp = -A r
  np.testing.assert_allclose(sym[1:], asym[1:])  # negative advantage, in-range ratio: unchanged


# -- demonstration replay ----------------------------------------------------------------------

def _demo_batch():
  b = helpers.make_batch(b=4, t=24, seed=3)
  demo = np.zeros_like(b["loss_mask"])
  demo[1, 12:] = 1.0  # row 1's second packed sequence is a replayed demonstration
  demo[3, :] = 1.0    # and all of row 3
  b["loss_mask"] = np.where(demo > 0, (b["segment_ids"] > 0).astype(np.float32), b["loss_mask"])
  b["advantages"] = np.where(demo > 0, 0.0, b["advantages"]).astype(np.float32)
  b[ts.DEMO_KEY] = demo
  return b


def _naive_objective(model_def, params, batch, weight):
  """On-policy GRPO on the rollout tokens + weight * token-mean NLL of the demo tokens, with
  materialised logits."""
  model = model_def.merge(params)
  logits = model(batch["input_ids"], batch["positions"], batch["segment_ids"])
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], -1),
                             batch["input_ids"][:, 1:, None], -1)[..., 0]
  seg = batch["segment_ids"]
  scored = batch["loss_mask"][:, 1:] * (seg[:, 1:] == seg[:, :-1]) * (seg[:, 1:] != 0)
  demo = scored * batch[ts.DEMO_KEY][:, 1:]
  rl = scored * (1 - batch[ts.DEMO_KEY][:, 1:])
  ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))
  pg = jnp.sum(-batch["advantages"][:, 1:] * ratio * rl) / jnp.sum(rl)
  nll = -jnp.sum(logp * demo) / jnp.sum(demo)
  return pg + weight * nll, (pg, nll)


@pytest.mark.parametrize("micro", [1, 2])
def test_demo_replay_term_matches_the_naive_objective(micro):
  model_def, params = split_model(create_model(helpers.CFG, seed=0))
  cfg = helpers.make_cfg(micro=micro)
  cfg.loss.demo_replay_weight = 0.1
  batch = jax.tree.map(jnp.asarray, _demo_batch())
  opt = optax.sgd(1.0)  # the update is minus the gradient
  new, m = jax.jit(ts.make_train_step(model_def, opt, cfg))(
      state_lib.create_train_state(params, opt), batch)
  (_, (pg, nll)), grads = jax.value_and_grad(_naive_objective, argnums=1, has_aux=True)(
      model_def, params, batch, 0.1)
  np.testing.assert_allclose(m["loss/policy"], pg, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m["loss/demo_nll"], nll, rtol=1e-5)
  assert float(m["demo_tokens"]) == float(np.sum(_demo_batch()[ts.DEMO_KEY][:, 1:]
                                                 * (np.asarray(batch["segment_ids"])[:, 1:] > 0)
                                                 * (np.asarray(batch["segment_ids"])[:, 1:]
                                                    == np.asarray(batch["segment_ids"])[:, :-1])))
  for k in params:
    np.testing.assert_allclose(params[k] - new.params[k], grads[k], atol=3e-6, rtol=1e-4)


def test_demo_tokens_get_no_policy_term_at_weight_zero():
  """At weight 0 a batch with demonstration tokens updates exactly as the batch without them."""
  model_def, params = split_model(create_model(helpers.CFG, seed=0))
  cfg = helpers.make_cfg()
  cfg.loss.demo_replay_weight = 0.0
  with_demo = _demo_batch()
  without = {k: v for k, v in with_demo.items() if k != ts.DEMO_KEY}
  without["loss_mask"] = with_demo["loss_mask"] * (1 - with_demo[ts.DEMO_KEY])
  opt = optax.sgd(1.0)
  step = jax.jit(ts.make_train_step(model_def, opt, cfg))
  a, _ = step(state_lib.create_train_state(params, opt), jax.tree.map(jnp.asarray, with_demo))
  b, _ = step(state_lib.create_train_state(params, opt), jax.tree.map(jnp.asarray, without))
  for k in params:
    np.testing.assert_allclose(a.params[k], b.params[k], atol=1e-7)


def test_demo_replay_nll_is_the_masked_token_sum():
  logp = jnp.asarray([[-0.5, -1.0, -2.0], [-0.1, -3.0, -0.2]])
  demo = jnp.asarray([[1, 0, 1], [0, 0, 1]], jnp.float32)
  s, n = L.demo_replay_nll(logp, demo)
  assert float(s) == pytest.approx(0.5 + 2.0 + 0.2) and float(n) == 3


def _traj(tokens, mask):
  seg = Segment(id=0, token_ids=list(tokens), loss_mask=list(mask),
                logprobs=[0.0] * len(tokens), train=True)
  return Trajectory(segments=[seg])


def test_replayed_demos_ride_in_the_rows_with_their_mask():
  rollout = batching.TrainSequence([1, 2, 3, 4], [0, 0, 1, 1], [0.0] * 4, 0.5, "t")
  replay = demo_replay.DemoReplay([_traj([5, 6, 7], [0, 1, 1]), _traj([8, 9], [0, 1])], 2, seed=0)
  cfg = ml_collections.ConfigDict({"trainer": {"buckets": (8,), "rows_per_batch": 2, "pack": True,
                                               "share_prompt": ()}})
  batches, stats = rl_loop.grouped_then_plain([rollout] + replay.draw(1), cfg)
  assert len(batches) == 1 and stats["sequences"] == 3
  b = batches[0]
  demo_tokens = {int(t) for t, d in zip(b["input_ids"].ravel(), b[ts.DEMO_KEY].ravel()) if d}
  assert demo_tokens == {5, 6, 7, 8, 9}
  assert np.all(b["advantages"][b[ts.DEMO_KEY] > 0] == 0)
  # Without a replayed sequence the batches have no demo key (one shape set per run).
  plain, _ = rl_loop.grouped_then_plain([rollout], cfg)
  assert ts.DEMO_KEY not in plain[0]


def test_demo_replay_draws_depend_on_the_step_only():
  demos = [_traj([10 + i, 11 + i, 12 + i], [0, 1, 1]) for i in range(10)]
  a, b = demo_replay.DemoReplay(demos, 3, seed=1), demo_replay.DemoReplay(demos, 3, seed=1)
  b.draw(7)
  assert [s.token_ids for s in a.draw(5)] == [s.token_ids for s in b.draw(5)]
  assert all(s.demo and s.advantage == 0 for s in a.draw(5)) and len(a.draw(5)) == 3


def test_demo_replay_without_demonstrations_names_the_flag(tmp_path):
  cfg = ml_collections.ConfigDict({"seed": 0, "loss": {"demo_replay_weight": 0.1, "demo_replay_seqs": 2},
                                   "sft": {"demos": ""}})
  with pytest.raises(errors.ConfigError, match="sft.demos"):
    demo_replay.from_config(cfg, str(tmp_path))
  cfg.loss.demo_replay_weight = 0.0
  assert demo_replay.from_config(cfg, str(tmp_path)) is None
  path = tmp_path / "demos.jsonl"
  path.write_text(json.dumps(_traj([1, 2, 3], [0, 1, 1]).demonstration_json()) + "\n")
  cfg.loss.demo_replay_weight = 0.1
  assert len(demo_replay.from_config(cfg, str(tmp_path)).draw(1)) == 1


# -- the KL guard ------------------------------------------------------------------------------

def _guard_cfg(bound, kl_coef=0.0):
  return ml_collections.ConfigDict({"trainer": {"max_kl": bound}, "loss": {"kl_coef": kl_coef}})


def test_kl_guard_names_step_kl_and_flag():
  kl_guard.check(3, {"kl_to_start_k3": 0.049}, _guard_cfg(0.05))
  kl_guard.check(3, {"kl_to_start_k3": 0.2}, _guard_cfg(None))
  with pytest.raises(errors.KLBoundError) as e:
    kl_guard.check(4, {"kl_to_start_k3": 0.0712, "kl_ref": 0.0}, _guard_cfg(0.05))
  msg = str(e.value)
  assert "RL step 4" in msg and "0.0712" in msg and "trainer.max_kl" in msg
  with pytest.raises(errors.KLBoundError, match="kl_ref"):  # a learner on a mesh: kl_ref
    kl_guard.check(2, {"kl_ref": 0.3}, _guard_cfg(0.05, kl_coef=0.05))
  with pytest.raises(errors.ConfigError, match="kl_coef"):
    kl_guard.check_available(_guard_cfg(0.05), probe_runs=False)
  kl_guard.check_available(_guard_cfg(0.05, kl_coef=0.01), probe_runs=False)
  with pytest.raises(errors.ConfigError, match="max_kl"):
    kl_guard.max_kl(_guard_cfg(-1.0))


def test_bad_issue44_options_fail_at_start():
  from experiments.configs import common
  from legorl_jax.trainer import config_check
  for key, value, match in (("rollout.sampler", "epochs", "rollout.sampler"),
                            ("loss.demo_replay_weight", -0.1, "demo_replay_weight"),
                            ("trainer.max_kl", -1.0, "max_kl"),
                            ("sft.save_at", (0, 5), "sft.save_at")):
    cfg = common.base_config()
    section, field = key.split(".")
    cfg[section][field] = value
    with pytest.raises(errors.ConfigError, match=match):
      config_check.validate(cfg)
  cfg = common.base_config()
  cfg.loss.demo_replay_weight, cfg.sft.steps = 0.1, 0
  with pytest.raises(errors.ConfigError, match="sft.demos"):
    config_check.validate(cfg)
  cfg.sft.demos = "/somewhere/demos.jsonl"
  config_check.validate(cfg)
