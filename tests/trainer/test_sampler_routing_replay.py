"""Rollout routing replay end to end: a tiny mixture-of-experts policy sampled by the real
``Engine`` behind the proxy (two chat turns in one session), its trajectory through JSON and
``batching``, scored by the ``Learner`` with ``trainer.routing_replay``.

- identical numerics: the learner's logprobs with the sampler's replayed routes equal the
  recorded ones (|delta| < 1e-5, fp32);
- the learner really uses the batch's routes: other routes change its logprobs (replay on),
  and replay off ignores them;
- the sampler's router perturbed (as a bf16 engine's would be), the learner exact: the
  learner's own top-k differs from what was sampled, replay reproduces the sampler's selection
  and brings the logprobs closer than recomputing them.
"""

import asyncio
import json

import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax.models import create_model, get_preset
from legorl_jax.models.params import split_model
from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyService, openai_chat
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.sampling import Engine
from legorl_jax.trainer import batching
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers

CONFIG = get_preset("tiny-moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, moe_intermediate_size=32, initializer_range=0.3)


def _learner(model, replay):
  cfg = helpers.make_cfg(loss="grpo")
  cfg.trainer.routing_replay = replay
  return Learner(model, cfg, seed=0)


def _rollout(service, name):
  """Two chat turns of one proxy session -> the learner's batch of its trajectory."""
  s = service.sessions.create(name)
  conv = [{"role": "user", "content": "Fix the bug in utils.py, please."}]
  for follow in ("Now run the tests.", None):
    reply = asyncio.run(service.complete(openai_chat.parse({"model": "m", "messages": conv}), s))
    conv.append({"role": "assistant", "content": reply.content})
    if follow:
      conv.append({"role": "user", "content": follow})
  traj = json.loads(json.dumps(service.sessions.pop(name).trajectory()))  # as trajectory.json
  assert all("routed_experts" in seg for seg in traj["segments"])
  seqs = batching.sequences_from_trajectory(Trajectory.from_json(traj), advantage=1.0)
  (batch,), _ = batching.make_batches(seqs, buckets=(512,), rows_per_batch=2)
  assert batch["routed_experts"].dtype == np.int8
  return batch


@pytest.fixture(scope="module")
def setup():
  tok = load_tokenizer()
  model = create_model(CONFIG, seed=0)
  engine = Engine(model, max_batch=2, max_len=512, prefill_chunk=64, attn_buckets=(256, 512),
                  decode_chunk=8, seed=0, decode_fn=tok).start()
  service = ProxyService(EngineBackend(engine), tok,
                         ProxyConfig(force_temperature=1.0, max_tokens_cap=24))
  exact = _rollout(service, "exact")
  # The sampler's router perturbed; the learner keeps the exact parameters.
  rng = np.random.RandomState(3)
  _, params = split_model(model)
  noisy = {k: v + jnp.asarray(0.05 * rng.randn(*v.shape), v.dtype)
           for k, v in params.items() if k.endswith("router_kernel")}
  engine.update_params(noisy)
  perturbed = _rollout(service, "perturbed")
  engine.stop()
  return model, exact, perturbed


def _delta(learner, batch):
  logp, _ = learner.logprobs(batch)
  scored = batch["loss_mask"] > 0
  return np.abs(logp - batch["rollout_logp"])[scored]


def test_replayed_sampler_routes_reproduce_the_recorded_logprobs(setup):
  model, batch, _ = setup
  replay = _learner(model, True)
  assert _delta(replay, batch).max() < 1e-5
  # Other routes (every recorded expert id shifted by one) give other logprobs under replay,
  # and are ignored without it.
  other = dict(batch)
  r = batch["routed_experts"]
  other["routed_experts"] = np.where(r >= 0, (r + 1) % CONFIG.num_experts, r).astype(r.dtype)
  assert _delta(replay, other).max() > 1e-2
  assert _delta(_learner(model, False), other).max() < 1e-5


def test_replay_follows_the_sampler_not_the_learners_router(setup):
  model, _, batch = setup
  recorded = batch["routed_experts"]
  valid = (recorded >= 0).all(axis=(-1, -2)) & (batch["segment_ids"] > 0)
  _, own = model.hidden_routed(jnp.asarray(batch["input_ids"]), jnp.asarray(batch["positions"]),
                               jnp.asarray(batch["segment_ids"]))
  _, replayed = model.hidden_routed(jnp.asarray(batch["input_ids"]),
                                    jnp.asarray(batch["positions"]),
                                    jnp.asarray(batch["segment_ids"]),
                                    experts=jnp.asarray(recorded))
  flips = np.sort(np.asarray(own.experts), -1) != np.sort(recorded, -1)
  assert flips[valid].any()  # the perturbed sampler routed some tokens elsewhere
  np.testing.assert_array_equal(np.asarray(replayed.experts)[valid], recorded[valid])
  d_on, d_off = _delta(_learner(model, True), batch), _delta(_learner(model, False), batch)
  assert d_on.max() < d_off.max(), (d_on.max(), d_off.max())
