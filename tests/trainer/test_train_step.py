"""The learner step against a naive reference (materialised logits, plain REINFORCE algebra),
micro-batch accumulation, and 1 device vs an 8-device (2, 2, 2) mesh."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from legorl_jax.models import create_model, get_preset
from legorl_jax.models.params import split_model
from legorl_jax.sharding import make_mesh
from legorl_jax.trainer import optimizer as opt_lib
from legorl_jax.trainer import state as state_lib
from legorl_jax.trainer import train_step as ts

CFG = get_preset("tiny").replace(vocab_size=512, num_layers=2, hidden_size=64,
                                 intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)


def make_cfg(loss="grpo", micro=1, temperature=1.0, aggregation="token-mean"):
  c = ml_collections.ConfigDict()
  c.loss = ml_collections.ConfigDict(dict(name=loss, temperature=temperature, aggregation=aggregation,
                                          clip_eps_low=0.2, clip_eps_high=0.28, vf_coef=0.0))
  c.trainer = ml_collections.ConfigDict(dict(micro_batches=micro, logprob_impl="xla"))
  c.optim = ml_collections.ConfigDict(dict(learning_rate=1e-2, schedule="constant", max_grad_norm=0.0))
  return c


def make_batch(b=4, t=24, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, CFG.vocab_size, (b, t)).astype(np.int32)
  seg = np.ones((b, t), np.int32)
  seg[1, 12:] = 2          # two packed sequences in row 1
  seg[2, 20:] = 0          # padding at the end of row 2
  pos = np.zeros((b, t), np.int32)
  for r in range(b):
    for s in np.unique(seg[r]):
      idx = np.where(seg[r] == s)[0]
      pos[r, idx] = np.arange(len(idx))
  mask = (rng.random((b, t)) < 0.6).astype(np.float32) * (seg > 0)
  adv = np.repeat(rng.normal(size=(b, 1)), t, 1).astype(np.float32)
  adv[1, 12:] = -0.7
  return {"input_ids": ids, "positions": pos, "segment_ids": seg, "loss_mask": mask,
          "advantages": adv, "rollout_logp": np.zeros((b, t), np.float32)}


def naive_loss(model_def, params, batch, temperature):
  """On-policy GRPO: ratio r = exp(logp - stop_grad(logp)) = 1, loss mean(-A r) over scored tokens,
  whose gradient is the REINFORCE gradient mean(-A grad logp)."""
  model = model_def.merge(params)
  logits = model(batch["input_ids"], batch["positions"], batch["segment_ids"]) / temperature
  logp_all = jax.nn.log_softmax(logits[:, :-1], -1)
  tgt = batch["input_ids"][:, 1:]
  logp = jnp.take_along_axis(logp_all, tgt[..., None], -1)[..., 0]
  seg = batch["segment_ids"]
  scored = batch["loss_mask"][:, 1:] * (seg[:, 1:] == seg[:, :-1]) * (seg[:, 1:] != 0)
  ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))
  return jnp.sum(-batch["advantages"][:, 1:] * ratio * scored) / jnp.sum(scored)


@pytest.fixture(scope="module")
def setup():
  model = create_model(CFG, seed=0)
  model_def, params = split_model(model)
  return model_def, params


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_reference(setup, temperature):
  model_def, params = setup
  cfg = make_cfg(temperature=temperature)
  opt = optax.sgd(1.0)  # update = -gradient, so the step exposes the gradient exactly
  batch = jax.tree.map(jnp.asarray, make_batch())
  step = jax.jit(ts.make_train_step(model_def, opt, cfg))
  state = state_lib.create_train_state(params, opt)
  new_state, metrics = step(state, batch)
  ref_loss, ref_grads = jax.value_and_grad(naive_loss, argnums=1)(model_def, params, batch, temperature)
  np.testing.assert_allclose(metrics["loss/policy"], ref_loss, rtol=1e-5, atol=1e-6)
  for k in params:
    np.testing.assert_allclose(params[k] - new_state.params[k], ref_grads[k], atol=2e-6, rtol=1e-4)
  assert int(new_state.step) == 1
  assert np.isfinite(float(metrics["grad_norm"]))


def test_lm_head_on_scored_tokens_only_is_exact(setup):
  model_def, params = setup
  batch = make_batch(b=4)
  batch["loss_mask"][:, :14] = 0  # like agent trajectories: mostly prompt
  cap = ts.scored_cap_for(batch, 2)
  assert cap is not None and cap < 2 * 23  # fewer rows than all predictions of a micro-batch
  cfg = make_cfg(micro=2)
  opt = optax.sgd(1.0)
  step = jax.jit(ts.make_train_step(model_def, opt, cfg), static_argnames=("scored_cap",))
  dev = jax.tree.map(jnp.asarray, batch)
  full, m_full = step(state_lib.create_train_state(params, opt), dev)
  capped, m_cap = step(state_lib.create_train_state(params, opt), dev, scored_cap=cap)
  np.testing.assert_allclose(m_cap["loss/policy"], m_full["loss/policy"], rtol=1e-6)
  np.testing.assert_allclose(m_cap["entropy"], m_full["entropy"], rtol=1e-5)
  for k in params:
    np.testing.assert_allclose(capped.params[k], full.params[k], atol=1e-7)


def test_micro_batches_give_same_update(setup):
  model_def, params = setup
  batch = jax.tree.map(jnp.asarray, make_batch(b=4))
  outs = []
  for micro in (1, 2, 4):
    cfg = make_cfg(micro=micro, aggregation="seq-mean-token-mean")
    # SGD: the update is linear in the gradient, so float rounding stays at rounding size
    # (Adam's first step divides by |g| and turns rounding of tiny gradients into lr-sized jumps).
    opt = optax.sgd(0.1)
    step = jax.jit(ts.make_train_step(model_def, opt, cfg))
    new_state, metrics = step(state_lib.create_train_state(params, opt), batch)
    outs.append((new_state, metrics))
  for s, m in outs[1:]:
    np.testing.assert_allclose(m["loss/policy"], outs[0][1]["loss/policy"], rtol=1e-5)
    np.testing.assert_allclose(m["grad_norm"], outs[0][1]["grad_norm"], rtol=1e-4)
    for k in params:
      np.testing.assert_allclose(s.params[k], outs[0][0].params[k], atol=1e-6)


def test_mesh_matches_single_device(setup):
  assert jax.device_count() >= 8, "tests/conftest.py should provide 8 CPU devices"
  model_def, params = setup
  cfg = make_cfg(micro=2)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
  batch = jax.tree.map(jnp.asarray, make_batch(b=8, seed=3))
  step_fn = ts.make_train_step(model_def, opt, cfg)
  single, m_single = jax.jit(step_fn)(state_lib.create_train_state(params, opt), batch)

  mesh = make_mesh(2, 2, 2)
  # A copy: device_put may reuse a device-0 buffer as one shard, and the step donates its state.
  state = state_lib.create_train_state(jax.tree.map(jnp.copy, params), opt)
  state_sh = state_lib.state_shardings(state, model_def, mesh)
  state = jax.device_put(state, state_sh)
  batch_sh = ts.batch_shardings(batch, mesh)
  sharded_step = ts.jit_train_step(step_fn, state_sh, batch_sh)
  out, m_mesh = sharded_step(state, jax.device_put(batch, batch_sh))
  assert out.params["layers.0.mlp.up_kernel"].sharding.spec == state_sh.params["layers.0.mlp.up_kernel"].spec
  np.testing.assert_allclose(m_mesh["loss/policy"], m_single["loss/policy"], rtol=1e-5, atol=1e-6)
  for k in params:
    np.testing.assert_allclose(np.asarray(out.params[k]), np.asarray(single.params[k]), atol=1e-5)


def test_adamw_optimizer_from_config_steps(setup):
  model_def, params = setup
  cfg = make_cfg()
  cfg.optim.schedule, cfg.optim.warmup_steps, cfg.optim.total_steps = "cosine", 2, 10
  cfg.optim.max_grad_norm = 1.0
  opt = opt_lib.make_optimizer(cfg.optim)
  step = jax.jit(ts.make_train_step(model_def, opt, cfg))
  state = state_lib.create_train_state(params, opt)
  batch = jax.tree.map(jnp.asarray, make_batch())
  logprobs = jax.jit(ts.make_logprob_fn(model_def, temperature=1.0))

  def objective(p):  # the advantage-weighted logprob of the scored tokens, which GRPO ascends
    logp, _ = logprobs(p, batch)
    sb = ts.shifted(batch)
    return float(jnp.sum(sb["advantages"] * logp[:, 1:] * sb["loss_mask"]) / jnp.sum(sb["loss_mask"]))

  before = objective(params)
  for _ in range(4):
    state, m = step(state, batch)
    assert np.isfinite(float(m["grad_norm"]))
  assert int(state.step) == 4
  assert objective(state.params) > before


def test_bad_micro_batch_count_is_named(setup):
  model_def, params = setup
  cfg = make_cfg(micro=3)
  opt = opt_lib.make_optimizer(cfg.optim)
  step = ts.make_train_step(model_def, opt, cfg)
  with pytest.raises(Exception, match="micro_batches=3"):
    step(state_lib.create_train_state(params, opt), jax.tree.map(jnp.asarray, make_batch(b=4)))


def _group_sequences(seed=0):
  """Two GRPO groups (4 and 3 samples of one prompt each) and a loner, as TrainSequences."""
  from legorl_jax.trainer.batching import TrainSequence
  rng = np.random.default_rng(seed)
  seqs = []
  for g, (plen, n) in enumerate([(11, 4), (7, 3), (9, 1)]):
    prompt = list(rng.integers(0, CFG.vocab_size, plen))
    for i in range(n):
      comp = list(rng.integers(0, CFG.vocab_size, int(rng.integers(2, 9))))
      seqs.append(TrainSequence(prompt + comp, [0] * plen + [1] * len(comp),
                                [0.0] * plen + list(rng.normal(-2, 0.5, len(comp))),
                                float(rng.normal()), f"g{g}s{i}"))
  return seqs


@pytest.mark.parametrize("loss,aggregation", [("grpo", "token-mean"),
                                              ("gspo", "seq-mean-token-mean")])
def test_grouped_batch_gives_same_update_as_plain_rows(setup, loss, aggregation):
  """The shared-prompt layout is a compute saving only: same loss, metrics and parameters as
  one plain row per sequence."""
  from legorl_jax.trainer import batching
  model_def, params = setup
  seqs = _group_sequences()
  grouped, rest, stats = batching.make_grouped_batches(seqs, prefix_len=12, branch_len=10,
                                                       branches=4, rows_per_batch=2)
  assert len(grouped) == 1 and stats["sequences"] == 7 and [s.trial_id for s in rest] == ["g2s0"]
  plain, _ = batching.make_batches([s for s in seqs if s.trial_id != "g2s0"], buckets=(24,),
                                   rows_per_batch=7)
  cfg = make_cfg(loss=loss, aggregation=aggregation)
  opt = optax.sgd(0.1)
  step = jax.jit(ts.make_train_step(model_def, opt, cfg), static_argnames=("scored_cap", "shared_prefix"))
  arrays, layout = batching.split_layout(grouped[0])
  assert layout == (12, 10)
  for cap in (None, ts.scored_cap_for(arrays, 1)):
    g_state, g_m = step(state_lib.create_train_state(params, opt), jax.tree.map(jnp.asarray, arrays),
                        scored_cap=cap, shared_prefix=layout)
    p_state, p_m = step(state_lib.create_train_state(params, opt), jax.tree.map(jnp.asarray, plain[0]))
    for key in ("loss/policy", "entropy", "grad_norm"):
      np.testing.assert_allclose(g_m[key], p_m[key], rtol=2e-5, err_msg=key)
    for k in params:
      np.testing.assert_allclose(g_state.params[k], p_state.params[k], atol=1e-6)


def test_learner_takes_grouped_and_plain_batches_in_one_update(setup):
  """``Learner.update`` reads each batch's layout: a grouped batch plus a plain batch of the
  leftovers give the same parameters as plain rows for all sequences, split the same way."""
  from legorl_jax.models import create_model
  from legorl_jax.trainer import batching
  from legorl_jax.trainer.learner import Learner
  seqs = _group_sequences(seed=1)
  cfg = make_cfg(loss="grpo")
  cfg.optim.eps = 1.0  # Adam update ~ lr * g: gradient rounding stays rounding-sized
  grouped, rest, _ = batching.make_grouped_batches(seqs, prefix_len=12, branch_len=10, branches=4,
                                                   rows_per_batch=2)
  rest_batches, _ = batching.make_batches(rest, buckets=(24,), rows_per_batch=2)
  shared_seqs = [s for s in seqs if s not in rest]
  plain_first, _ = batching.make_batches(shared_seqs, buckets=(24,), rows_per_batch=8)
  a = Learner(create_model(CFG, seed=0), cfg)
  b = Learner(create_model(CFG, seed=0), cfg)
  ma = a.update(grouped + rest_batches)
  mb = b.update(plain_first + rest_batches)
  np.testing.assert_allclose(ma["loss/policy"], mb["loss/policy"], rtol=1e-5)
  pa, pb = a.params_copy(), b.params_copy()
  for k in pa:
    np.testing.assert_allclose(np.asarray(pa[k]), np.asarray(pb[k]), atol=2e-6)
  # logprobs of a grouped batch land on its branch tokens, as for the plain rows
  lg, _ = a.logprobs(grouped[0])
  assert lg.shape == grouped[0]["input_ids"].shape


def test_recorded_logprobs_line_up_with_the_learners_own(setup):
  """Off-policy inputs are per-token arrays aligned with ``input_ids`` (column t = token t).
  Recorded logprobs equal to the learner's own must give ratio 1, |dlogp| 0 and importance
  weight 1, and so the on-policy REINFORCE update; one column of misalignment must not."""
  model_def, params = setup
  cfg = make_cfg()
  cfg.loss.is_correction, cfg.loss.is_level = "tis", "token"
  logp, _ = jax.jit(ts.make_logprob_fn(model_def, temperature=1.0, impl="xla"))(
      params, jax.tree.map(jnp.asarray, make_batch()))
  logp = np.asarray(logp)
  assert (logp[:, 0] == 0).all() and (logp[:, 1:] < 0).all()
  opt = optax.sgd(1.0)
  step = jax.jit(ts.make_train_step(model_def, opt, cfg))

  def run(old, rollout):
    batch = dict(make_batch(), old_logp=old, rollout_logp=rollout)
    return step(state_lib.create_train_state(params, opt), jax.tree.map(jnp.asarray, batch))

  new_state, m = run(logp, logp)
  m = {k: float(v) for k, v in m.items()}
  assert abs(m["ratio"] - 1) < 1e-5 and abs(m["ratio_max"] - 1) < 1e-5
  assert m["rollout_abs_dlogp_max"] < 1e-5 and abs(m["is_weight_max"] - 1) < 1e-5
  ref_grads = jax.grad(naive_loss, argnums=1)(model_def, params,
                                              jax.tree.map(jnp.asarray, make_batch()), 1.0)
  for k in params:
    np.testing.assert_allclose(params[k] - new_state.params[k], ref_grads[k], atol=2e-6, rtol=1e-4)

  late = np.roll(logp, 1, axis=1)  # one token late
  _, bad_rollout = run(logp, late)  # sampler's record misaligned: learner-vs-rollout disagree
  assert float(bad_rollout["rollout_abs_dlogp_max"]) > 0.5
  _, bad_old = run(late, late)  # old logprobs misaligned: the ratio leaves 1
  assert float(bad_old["ratio_max"]) > 1.5
