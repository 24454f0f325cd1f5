"""The router's load-balancing loss in the train step (``loss.router_aux_coef``, meant for SFT):
with zero advantages the only gradient is the auxiliary one, and it equals the gradient of
``coef * RouteInfo.aux_loss``; off by default (no term, no metric)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model, get_preset
from legorl_jax.models.params import split_model
from legorl_jax.trainer import train_step as ts
from legorl_jax.trainer.state import create_train_state
from tests.trainer import test_train_step as helpers

CONFIG = get_preset("tiny-moe", vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, moe_intermediate_size=16, initializer_range=0.3)


def _batch():
  b = helpers.make_batch(b=4, t=24, seed=3)
  b["input_ids"] = b["input_ids"] % CONFIG.vocab_size
  b["advantages"] = np.zeros_like(b["advantages"])  # no policy gradient at all
  return {k: jnp.asarray(v) for k, v in b.items()}


def _grads(coef):
  model_def, params = split_model(create_model(CONFIG, seed=0))
  cfg = helpers.make_cfg(loss="grpo")
  cfg.loss.router_aux_coef = coef
  step = ts.make_train_step(model_def, optax.sgd(1e-2), cfg)
  grads, metrics = jax.jit(step.batch_grads)(create_train_state(params, optax.sgd(1e-2)), _batch())
  return model_def, params, grads["policy"], metrics


def test_aux_gradient_equals_the_load_balancing_gradient():
  coef = 0.01
  model_def, params, grads, metrics = _grads(coef)
  batch = _batch()

  def aux(p):
    _, info = model_def.merge(p).hidden_routed(batch["input_ids"], batch["positions"],
                                               batch["segment_ids"])
    return info.aux_loss

  value, want = jax.value_and_grad(aux)(params)
  np.testing.assert_allclose(float(metrics["router_aux_loss_sum"] / metrics["tokens"]),
                             float(value), rtol=1e-5)
  routers = [k for k in grads if k.endswith("router_kernel")]
  assert routers and all(float(jnp.abs(grads[k]).max()) > 0 for k in routers)
  for k in grads:
    np.testing.assert_allclose(grads[k], coef * want[k], atol=1e-7, rtol=1e-4)


def test_off_by_default_and_checked():
  _, _, grads, metrics = _grads(0.0)
  assert "router_aux_loss_sum" not in metrics
  assert all(float(jnp.abs(g).max()) == 0 for g in grads.values())
  with pytest.raises(errors.ConfigError, match="router_aux_coef"):
    _grads(-1.0)


def test_the_coefficient_reaches_sft_from_the_command_line():
  """``loss.router_aux_coef`` has a default in the base config (so ``--config.loss.
  router_aux_coef=X`` can set it) and the SFT phase's learner config keeps it."""
  from experiments.configs import demo_tiny_moe  # pylint: disable=import-outside-toplevel
  from legorl_jax.trainer import pipeline  # pylint: disable=import-outside-toplevel
  cfg = demo_tiny_moe.get_config()
  assert cfg.loss.router_aux_coef == 0.0 and cfg.trainer.routing_replay
  cfg.loss.router_aux_coef = 1e-3
  sft = pipeline.sft_config(cfg)
  assert sft.loss.name == "reinforce" and sft.loss.router_aux_coef == 1e-3
