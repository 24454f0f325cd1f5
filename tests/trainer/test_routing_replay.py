"""Rollout routing replay in the learner: sampler-recorded logprobs (the KV-cache decode path the
engine runs, routes recorded per token) equal the learner's with replay on and off (identical
numerics); under an induced router mismatch, replay removes every differing expert selection."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from legorl_jax import errors
from legorl_jax.models import get_preset
from legorl_jax.models.build import create_model
from legorl_jax.models.params import split_model
from legorl_jax.trainer import train_step as ts
from legorl_jax.trainer.state import create_train_state

CONFIG = get_preset("tiny", architecture="qwen3_moe", vocab_size=64, hidden_size=32,
                    intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                    mlp_only_layers=(1,), initializer_range=0.3)
B, PROMPT, NEW = 2, 6, 8


def _rollout(model_def, params, seed=0):
  """Prefill + token-by-token decode; returns the batch with recorded logp and routes."""
  model = model_def.merge(params)
  rng = np.random.RandomState(seed)
  t = PROMPT + NEW
  ids = np.zeros((B, t), np.int32)
  ids[:, :PROMPT] = rng.randint(0, 64, (B, PROMPT))
  routes = np.zeros((B, t, len(CONFIG.moe_layers), 2), np.int8)
  logp = np.zeros((B, t), np.float32)
  cache = model.init_cache(B, t)
  pos = np.broadcast_to(np.arange(t, dtype=np.int32), (B, t))
  h, cache, r = model.decode(jnp.asarray(ids[:, :PROMPT]), jnp.asarray(pos[:, :PROMPT]), cache,
                             return_routes=True)
  routes[:, :PROMPT] = np.asarray(r)
  for i in range(PROMPT, t):
    lp = np.asarray(jax.nn.log_softmax(model.logits_from_hidden(h[:, -1])))
    tok = np.array([rng.choice(64, p=np.exp(row) / np.exp(row).sum()) for row in lp])
    ids[:, i], logp[:, i] = tok, lp[np.arange(B), tok]
    if i + 1 < t:  # a token's routes come from the step that writes its K/V
      h, cache, r = model.decode(jnp.asarray(ids[:, i:i + 1]), jnp.asarray(pos[:, i:i + 1]),
                                 cache, return_routes=True)
      routes[:, i] = np.asarray(r[:, 0])
  mask = np.zeros((B, t), np.float32)
  mask[:, PROMPT:] = 1
  return dict(input_ids=jnp.asarray(ids), positions=jnp.asarray(pos),
              segment_ids=jnp.ones((B, t), jnp.int32), loss_mask=jnp.asarray(mask),
              advantages=jnp.ones((B, t), jnp.float32), rollout_logp=jnp.asarray(logp),
              routed_experts=jnp.asarray(routes))


@pytest.fixture(scope="module")
def setup():
  model_def, params = split_model(create_model(CONFIG, seed=0))
  return model_def, params, _rollout(model_def, params)


def _learner_logp(model_def, params, batch, replay):
  fn = jax.jit(ts.make_logprob_fn(model_def, temperature=1.0, routing_replay=replay))
  return np.asarray(fn(params, batch)[0])


@pytest.mark.parametrize("replay", [False, True])
def test_sampler_logprobs_equal_learner(setup, replay):
  model_def, params, batch = setup
  logp = _learner_logp(model_def, params, batch, replay)
  d = np.abs(logp - np.asarray(batch["rollout_logp"]))[:, PROMPT:]
  assert d.max() < 1e-5, d.max()


def test_replay_removes_the_mismatch(setup):
  """The sampler's router is perturbed (as a bf16 engine's would be); the learner is exact."""
  model_def, params, _ = setup
  noisy = dict(params)
  rng = np.random.RandomState(5)
  for k, v in params.items():
    if k.endswith("router_kernel"):
      noisy[k] = v + jnp.asarray(0.05 * rng.randn(*v.shape), v.dtype)
  batch = _rollout(model_def, noisy, seed=1)
  model = model_def.merge(params)
  _, info = model.hidden_routed(batch["input_ids"], batch["positions"], batch["segment_ids"])
  rec = np.asarray(batch["routed_experts"])[:, :-1]
  differ = np.sort(np.asarray(info.experts)[:, :-1], -1) != np.sort(rec, -1)
  assert differ.any()  # the perturbation flips some decisions
  _, replayed = model.hidden_routed(batch["input_ids"], batch["positions"], batch["segment_ids"],
                                    experts=batch["routed_experts"])
  np.testing.assert_array_equal(np.asarray(replayed.experts), np.asarray(batch["routed_experts"]))
  d = {r: np.abs(_learner_logp(model_def, params, batch, r)
                 - np.asarray(batch["rollout_logp"]))[:, PROMPT:] for r in (False, True)}
  assert d[True].max() < d[False].max(), (d[True].max(), d[False].max())


def test_train_step_uses_routes_and_trains_the_router(setup):
  model_def, params, batch = setup
  cfg = ml_collections.ConfigDict()
  cfg.loss = ml_collections.ConfigDict(dict(name="grpo", temperature=1.0, aggregation="token-mean",
                                            clip_eps_low=0.2, clip_eps_high=0.28, vf_coef=0.0))
  cfg.trainer = ml_collections.ConfigDict(dict(micro_batches=1, routing_replay=True))
  opt = optax.sgd(1e-2)
  state = create_train_state(params, opt)
  step = ts.make_train_step(model_def, opt, cfg)
  grads, _ = jax.jit(step.batch_grads)(state, batch)
  router = [k for k in grads["policy"] if k.endswith("router_kernel")]
  assert router and all(float(jnp.abs(grads["policy"][k]).max()) > 0 for k in router)
  with pytest.raises(errors.TrainerError, match="routing_replay"):
    step.batch_grads(state, {k: v for k, v in batch.items() if k != "routed_experts"})
