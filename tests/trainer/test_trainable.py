"""``trainer.trainable``: what trains (all, top:K, LoRA), against independent references.

The top:K and LoRA updates are checked against the full-parameter gradient of the naive
reference loss (materialised logits, plain algebra; ``test_train_step.naive_loss``) through
the chain rule; the compiled step's matmul count shows the backward pass stops at the lowest
trained block; the KL term against the starting policy is 0 at the start and > 0 after
updates; the state, optimizer and checkpoint hold trainables only.
"""

import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.models import lora as lora_lib
from legorl_jax.models.params import split_model
from legorl_jax.trainer import checkpoint
from legorl_jax.trainer import train_step as ts
from legorl_jax.trainer import trainable as trainable_lib
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers

CFG4 = helpers.CFG.replace(num_layers=4)


def _cfg(trainable="all", lr=1e-2, kl=0.0, rank=4, alpha=8.0, targets=("q", "v", "up", "down")):
  c = helpers.make_cfg(loss="reinforce")
  c.optim = ml_collections.ConfigDict(dict(learning_rate=lr, schedule="constant", max_grad_norm=0.0))
  c.trainer.trainable = trainable
  c.trainer.lora_rank, c.trainer.lora_alpha, c.trainer.lora_targets = rank, alpha, targets
  c.loss.kl_coef, c.loss.kl_estimator = kl, "k3"
  return c


def _np(tree):
  return {k: np.asarray(v) for k, v in tree.items()}


def _sgd(learner, lr):
  """Swaps the learner's AdamW for SGD (update = -lr * gradient), rebuilding its jitted step."""
  import optax
  from legorl_jax.trainer import state as state_lib
  learner.optimizer = optax.sgd(lr)
  learner.state = state_lib.create_train_state(learner.state.params, learner.optimizer,
                                               ref_params=learner.state.ref_params)
  step_fn = ts.make_train_step(learner.model_def, learner.optimizer, learner.cfg, plan=learner.plan)
  learner._step = jax.jit(step_fn, donate_argnums=(0,), static_argnames=("scored_cap", "shared_prefix"))


def _naive_grads(params, batch):
  """Full-parameter gradient of REINFORCE at the batch's advantages (the naive reference)."""
  model_def, _ = split_model(create_model(helpers.CFG, seed=0))
  return jax.grad(helpers.naive_loss, argnums=1)(model_def, params, jax.tree.map(jnp.asarray, batch), 1.0)


def test_config_forms_and_errors():
  assert trainable_lib.parse(ml_collections.ConfigDict()).kind == "all"
  assert trainable_lib.parse(ml_collections.ConfigDict(dict(trainable="top:3"))).top_k == 3
  spec = trainable_lib.parse(_cfg("lora", rank=2, alpha=4.0, targets=("q", "gate")).trainer)
  assert (spec.kind, spec.lora_rank, spec.lora_alpha, spec.lora_targets) == ("lora", 2, 4.0, ("q", "gate"))
  for bad, match in (("top:0", "top:K"), ("top:x", "top:K"), ("some", "trainer.trainable"),
                     ("top", "trainer.trainable")):
    with pytest.raises(errors.ConfigError, match=match):
      trainable_lib.parse(ml_collections.ConfigDict(dict(trainable=bad)))
  with pytest.raises(errors.ConfigError, match="lora_targets"):
    trainable_lib.parse(_cfg("lora", targets=("q", "qq")).trainer)
  with pytest.raises(errors.ConfigError, match="lora_rank"):
    trainable_lib.parse(_cfg("lora", rank=0).trainer)
  with pytest.raises(errors.ConfigError, match="more blocks than the model has"):
    Learner(create_model(helpers.CFG, seed=0), _cfg("top:3"))
  from experiments.configs import common
  from legorl_jax.trainer import config_check
  c = common.base_config()
  c.trainer.trainable = "top:-1"
  with pytest.raises(errors.ConfigError, match="trainer.trainable"):
    config_check.validate(c)


def test_top_k_updates_the_top_blocks_by_their_gradient_and_nothing_else(tmp_path):
  model = create_model(helpers.CFG, seed=0)
  _, base = split_model(model)
  base = _np(base)
  learner = Learner(model, _cfg("top:1"))
  top = {k for k in base if k.startswith(("layers.1.", "final_norm."))}
  assert set(learner.state.params) == top
  assert "embed" in learner.frozen and not set(learner.frozen) & top
  # The optimizer covers exactly the trainables: AdamW's two moments per trainable leaf.
  n_train = sum(base[k].size for k in top)
  n_opt = sum(x.size for x in jax.tree.leaves(learner.state.opt_state) if x.ndim > 0)
  assert n_opt == 2 * n_train
  _sgd(learner, 0.5)
  batch = helpers.make_batch(seed=5)
  learner.update([batch])
  grads = _naive_grads(base, batch)
  new = _np(learner.params_copy())
  for k in base:
    if k in top:
      np.testing.assert_allclose(base[k] - new[k], 0.5 * np.asarray(grads[k]), atol=2e-6, rtol=1e-4,
                                 err_msg=k)
    else:
      assert np.array_equal(new[k], base[k]), k  # frozen: bit for bit
  assert np.abs(base["layers.1.mlp.up_kernel"] - new["layers.1.mlp.up_kernel"]).max() > 1e-4
  # The checkpoint holds the trainables only.
  ck = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  ck.save(1, learner.state, host={})
  ck.close()
  names = " ".join(open(os.path.join(r, f), errors="ignore").read()
                   for r, _, fs in os.walk(tmp_path) for f in fs if "METADATA" in f)
  assert "layers.1.mlp.up_kernel" in names and "layers.0." not in names and "embed" not in names


def test_lora_starts_at_the_base_and_its_update_is_the_chain_rule_of_the_full_gradient():
  model = create_model(helpers.CFG, seed=0)
  _, base = split_model(model)
  base = _np(base)
  cfg = _cfg("lora", rank=4, alpha=8.0, targets=("q", "v", "up", "down"))
  learner = Learner(model, cfg)
  kernels = [f"layers.{i}.{n}" for i in range(2)
             for n in ("attn.q_kernel", "attn.v_kernel", "mlp.down_kernel", "mlp.up_kernel")]
  assert sorted(learner.plan.lora_kernels) == sorted(kernels)
  assert set(learner.state.params) == {k + s for k in kernels for s in (".lora_a", ".lora_b")}
  start = _np(learner.params_copy())
  assert all(np.array_equal(start[k], base[k]) for k in base)  # B = 0: exactly the base
  adapters0 = _np(learner.state.params)
  _sgd(learner, 0.5)
  batch = helpers.make_batch(seed=6)
  learner.update([batch])
  grads = _naive_grads(base, batch)
  scale = 8.0 / 4
  ad = _np(learner.state.params)
  for k in kernels:
    a0 = adapters0[k + ".lora_a"]
    g = np.asarray(grads[k], np.float64)  # dL/dW of the merged kernel (= W at the start)
    # dL/dA = scale * G @ B^T = 0 at B = 0; dL/dB = scale * A^T @ G.
    np.testing.assert_array_equal(ad[k + ".lora_a"], a0)
    np.testing.assert_allclose(-ad[k + ".lora_b"] / 0.5, scale * a0.T.astype(np.float64) @ g,
                               atol=2e-6, rtol=1e-4, err_msg=k)
  merged = _np(learner.params_copy())
  for k in base:
    if k in kernels:
      want = base[k].astype(np.float64) + scale * (ad[k + ".lora_a"].astype(np.float64)
                                                   @ ad[k + ".lora_b"].astype(np.float64))
      np.testing.assert_allclose(merged[k], want, atol=1e-6, err_msg=k)
      assert np.abs(merged[k] - base[k]).max() > 1e-6
    else:
      assert np.array_equal(merged[k], base[k]), k
  # The weight sync carries the merged targeted kernels only.
  sync = _np(learner.sync_params())
  assert set(sync) == set(kernels)
  assert all(np.array_equal(sync[k], merged[k]) for k in kernels)


def _dots(compiled_text: str) -> int:
  return len(re.findall(r"\bdot\(", compiled_text))


def test_backward_stops_at_the_lowest_trained_block():
  """Matmuls in the optimised HLO of the compiled step: each trained block adds the same
  backward matmuls; top:1 has those of one block only (it would equal top:4 if the frozen
  blocks were differentiated); 'all' adds the (tied) embedding's gradient over top:4."""
  batch = jax.tree.map(jnp.asarray, helpers.make_batch(seed=1))
  counts, flops = {}, {}
  for trainable in ("top:1", "top:2", "top:3", "top:4", "all"):
    learner = Learner(create_model(CFG4, seed=0), _cfg(trainable))
    compiled = learner._step.lower(learner.state, batch, learner.frozen).compile()
    counts[trainable] = _dots(compiled.as_text())
    flops[trainable] = float(compiled.cost_analysis().get("flops", 0.0))
  c1, c2, c3, c4 = (counts[f"top:{k}"] for k in (1, 2, 3, 4))
  per_block = c2 - c1
  assert per_block > 0 and c3 - c2 == per_block and c4 - c3 == per_block, counts
  assert counts["all"] > c4, counts
  fwd_model = create_model(CFG4, seed=0)
  md, params = split_model(fwd_model)
  fwd = jax.jit(ts.make_logprob_fn(md, temperature=1.0, impl="xla")).lower(params, batch).compile()
  # top:1 = forward + one block's backward + the lm head's input gradient: far below top:4.
  assert c1 < c4 - 2 * per_block and c1 > _dots(fwd.as_text()), (counts, _dots(fwd.as_text()))
  if all(flops.values()):
    assert flops["top:1"] < flops["top:2"] < flops["top:4"] < flops["all"], flops


def test_kl_against_the_starting_policy_is_zero_first_and_positive_after_updates():
  for trainable in ("top:1", "lora"):
    learner = Learner(create_model(helpers.CFG, seed=0), _cfg(trainable, lr=3e-2, kl=0.1))
    assert learner.state.ref_params is not None
    ms = [learner.update([helpers.make_batch(seed=10 + i)]) for i in range(3)]
    assert abs(ms[0]["kl_ref"]) < 1e-7, (trainable, ms[0])
    assert ms[-1]["kl_ref"] > 1e-6, (trainable, ms[-1])
    # The reference stayed the start: frozen base + starting trainables (LoRA: the base).
    ref = jax.jit(learner.plan.merge)(learner.frozen, learner.state.ref_params)
    _, base = split_model(create_model(helpers.CFG, seed=0))
    assert all(np.array_equal(np.asarray(ref[k]), np.asarray(base[k])) for k in base)


def test_next_phase_continues_the_trainables_on_the_same_base():
  model = create_model(helpers.CFG, seed=0)
  for trainable in ("top:1", "lora"):
    a = Learner(model, _cfg(trainable))
    a.update([helpers.make_batch(seed=2)])
    b = a.with_config(_cfg(trainable, kl=0.1), seed=3)
    pa, pb = _np(a.params_copy()), _np(b.params_copy())
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert int(b.step) == 0
    with pytest.raises(errors.ConfigError, match="same trainer.trainable"):
      Learner(a.base_model(), _cfg("top:2"), start=a.state.params)


def test_lora_low_rank_step_equals_the_merged_policy_with_and_without_remat():
  """The step applies adapters as x @ W + s (x @ A) @ B (``lora.LowRankKernel``); its logprobs
  equal the merged kernels' and a rematerialised block gives the same update."""
  batch = helpers.make_batch(seed=9)
  out = {}
  for remat in (False, True):
    learner = Learner(create_model(helpers.CFG.replace(remat=remat), seed=0), _cfg("lora"))
    _sgd(learner, 0.5)  # update = -lr * gradient: differences stay rounding-sized (Adam's need not)
    learner.update([batch])
    learner.update([helpers.make_batch(seed=10)])
    out[remat] = _np(learner.state.params)
    low_rank, _ = learner.logprobs(batch)
    merged_model = learner.model()
    md, merged = split_model(merged_model)
    want, _ = jax.jit(ts.make_logprob_fn(md, temperature=1.0, impl="xla"))(
        merged, jax.tree.map(jnp.asarray, batch))
    np.testing.assert_allclose(low_rank, np.asarray(want), atol=1e-5)
  for k in out[False]:
    np.testing.assert_allclose(out[True][k], out[False][k], atol=1e-6, err_msg=k)
