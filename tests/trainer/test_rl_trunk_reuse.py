"""``trainer.reuse_trunk``: an RL update with several passes over a frozen trunk (``top:K``)
computes the trunk's states once per batch instead of once per pass. The result must be the
update without it: the same parameters after mu=2 passes with step-start scoring, and the same
logprobs from the trunk states as from the whole model."""

import numpy as np
import pytest

from legorl_jax.models import create_model
from legorl_jax.trainer import train_step as ts
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers


def _learner(reuse, trainable="top:1", mu=2, accumulate=True):
  c = helpers.make_cfg(loss="grpo")
  c.trainer.trainable = trainable
  c.trainer.accumulate = accumulate
  c.trainer.updates_per_batch = mu
  c.trainer.reuse_trunk = reuse
  c.optim.eps = 1.0  # an update ~linear in the gradient: rounding does not become a full step
  return Learner(create_model(helpers.CFG, seed=0), c)


def _params(learner):
  return {k: np.asarray(v) for k, v in learner.params_copy().items()}


@pytest.mark.parametrize("accumulate", [True, False])
def test_reused_trunk_gives_the_same_update(accumulate):
  batches = [helpers.make_batch(b=4, seed=1), helpers.make_batch(b=4, seed=2)]
  on, off = _learner(True, accumulate=accumulate), _learner(False, accumulate=accumulate)
  assert on._reuse_trunk(batches, 3) and not off._reuse_trunk(batches, 3)
  m_on, m_off = on.update(batches), off.update(batches)
  assert m_on["optimizer_updates"] == m_off["optimizer_updates"] == (2 if accumulate else 4)
  got, want = _params(on), _params(off)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=1e-6, err_msg=k)
  assert max(np.abs(got[k] - _params(_learner(True))[k]).max() for k in got) > 1e-5  # it moved
  np.testing.assert_allclose(m_on["loss/policy"], m_off["loss/policy"], atol=1e-6)


def test_logprobs_from_trunk_states_equal_the_whole_model():
  learner = _learner(True)
  batch = helpers.make_batch(b=4, seed=3)
  whole = learner.logprobs(batch)
  from_trunk = learner.logprobs(dict(batch, **{ts.TRUNK_KEY: learner.trunk_states(batch)}))
  for a, b in zip(whole, from_trunk):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_not_used_where_it_cannot_help():
  batch = [helpers.make_batch(b=4, seed=1)]
  assert not _learner(True, trainable="all")._reuse_trunk(batch, 3)  # no frozen trunk
  assert not _learner(True)._reuse_trunk(batch, 1)  # one forward: nothing to share
