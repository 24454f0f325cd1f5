"""trainer.accumulate: one optimizer update over several batches equals one update over their
rows concatenated into a single batch (the exact gradient of the step's global loss mean);
trainer.updates_per_batch (mu) makes that many updates, every pass's ratios against the
logprobs the step started from."""

import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.trainer import config_check
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers


def _cfg(accumulate, mu=1, aggregation="token-mean"):
  c = helpers.make_cfg(loss="grpo", aggregation=aggregation)
  c.trainer.trainable = "all"
  c.trainer.accumulate = accumulate
  c.trainer.updates_per_batch = mu
  # Adam's first step is lr * g / (|g| + eps): with the default eps a near-zero gradient entry
  # turns float rounding into a full-size step; eps=1 keeps the update ~linear in g.
  c.optim.eps = 1.0
  return c


def _params(learner):
  return {k: np.asarray(v) for k, v in learner.params_copy().items()}


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_accumulated_update_equals_one_update_of_the_concatenated_batch(aggregation):
  model = create_model(helpers.CFG, seed=0)
  a, b = helpers.make_batch(b=4, seed=1), helpers.make_batch(b=4, seed=2)
  both = {k: np.concatenate([a[k], b[k]]) for k in a}
  acc = Learner(model, _cfg(True, aggregation=aggregation))
  one = Learner(model, _cfg(False, aggregation=aggregation))
  per_batch = Learner(model, _cfg(False, aggregation=aggregation))
  m = acc.update([a, b])
  one.update([both])
  per_batch.update([a, b])
  assert m["optimizer_updates"] == 1 and int(acc.state.step) == 1
  got, want, other = _params(acc), _params(one), _params(per_batch)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=1e-6, err_msg=k)
  assert max(np.abs(other[k] - want[k]).max() for k in want) > 1e-4  # two updates differ


def test_passes_make_mu_updates_against_the_start_logprobs():
  model = create_model(helpers.CFG, seed=0)
  a = helpers.make_batch(b=4, seed=1)
  mu2 = Learner(model, _cfg(True, mu=2))
  m = mu2.update([a])
  assert m["optimizer_updates"] == 2 and int(mu2.state.step) == 2
  # The second pass's ratio is off 1 (moved parameters vs the step-start logprobs).
  mu1 = Learner(model, _cfg(True, mu=1))
  m1 = mu1.update([a])
  assert m1["optimizer_updates"] == 1
  assert max(np.abs(_params(mu2)[k] - _params(mu1)[k]).max() for k in _params(mu1)) > 1e-4


def test_bad_mu_is_a_config_error():
  from experiments.configs import demo_tiny
  cfg = demo_tiny.get_config()
  cfg.trainer.updates_per_batch = 0
  with pytest.raises(errors.ConfigError, match="updates_per_batch"):
    config_check.validate(cfg)
