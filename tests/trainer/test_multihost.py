"""Single-process behaviour of ``trainer.multihost``: the global-batch updater on an 8-device
mesh against the plain single-device ``Learner.update``; the scored cap against
``train_step.scored_cap_for``; the gathers and batch alignment are identities in one process.
(The two-process run is tests/sharding/test_multihost_rl.py.)"""

import numpy as np
import pytest

from experiments.configs import common
from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.trainer import multihost, train_step as ts
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers


def _cfg(mesh: bool, trainable: str = "all"):
  c = common.base_config()
  c.trainer.micro_batches, c.trainer.rows_per_batch = 2, 8
  c.loss.entropy_coef = 0.01
  c.optim.learning_rate, c.optim.eps = 1e-3, 1e-3
  c.trainer.trainable, c.trainer.lora_rank = trainable, 4
  if trainable != "all":
    c.loss.kl_coef = 0.05  # the reference (starting trainables, frozen base) on the mesh too
  if not mesh:
    del c.mesh
  return c


@pytest.mark.parametrize("trainable", ["all", "top:1", "lora"])
def test_global_updater_on_a_mesh_matches_single_device_learner(trainable):
  batches = [helpers.make_batch(b=8, seed=3), helpers.make_batch(b=8, seed=4)]
  ref = Learner(create_model(helpers.CFG, seed=0), _cfg(mesh=False, trainable=trainable))
  assert ref.mesh is None
  m_ref = ref.update([dict(b) for b in batches])
  sharded = Learner(create_model(helpers.CFG, seed=0), _cfg(mesh=True, trainable=trainable))
  assert sharded.mesh is not None and sharded.mesh.devices.size == 8
  update = multihost.update_fn(sharded)
  m = update([dict(b) for b in batches])
  for k in ("loss/policy", "entropy"):
    np.testing.assert_allclose(m[k], m_ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert m["learner_tokens"] == m_ref["learner_tokens"]
  got, want = sharded.params_copy(), ref.params_copy()
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), atol=1e-5, err_msg=k)
  assert set(sharded.state.params) == set(ref.state.params)
  moved = "layers.0.mlp.up_kernel" if trainable != "top:1" else "layers.1.mlp.up_kernel"
  layer = int(moved.split(".")[1])
  assert not np.allclose(np.asarray(want[moved]), np.asarray(
      create_model(helpers.CFG, seed=0).layers[layer].mlp.up_kernel.value))


def test_scored_cap_from_row_counts_matches_train_step():
  for seed in range(4):
    b = helpers.make_batch(b=8, t=24, seed=seed)
    for n_micro in (1, 2, 4):
      got = multihost._scored_cap(multihost._row_scored(b), 23, n_micro)
      assert got == ts.scored_cap_for(b, n_micro)
  sparse = helpers.make_batch(b=8, seed=0)
  sparse["loss_mask"][:] = 0
  sparse["loss_mask"][0, 5] = 1
  assert multihost._scored_cap(multihost._row_scored(sparse), 23, 2) == ts.scored_cap_for(sparse, 2)


def test_single_process_is_the_single_host_path():
  r = TrialResult("t1", "task", "builtin", "failed", 0.0, group=0)
  assert multihost.gather_results([r])[0] is r and multihost.gather_objects({"a": 1}) == [{"a": 1}]
  batches = [helpers.make_batch(b=4, t=24, seed=0)]
  assert multihost.align_batches(batches, (24, 48), 4) is batches
  assert multihost.local_rows_per_batch(8, None) == 8
  m = multihost.reduce_batch_metrics({"reward_mean": 0.5, "trials_valid": 4.0}, 3)
  assert m == {"reward_mean": 0.5, "trials_valid": 4.0, "batch_updates": 3.0}
  params = {"w": np.ones(3)}
  assert multihost.local_params(params) is params
  learner = Learner(create_model(helpers.CFG, seed=0), _cfg(mesh=False))
  assert multihost.update_fn(learner) == learner.update
  with pytest.raises(errors.ShardingError, match="mesh"):
    multihost.GlobalUpdater(learner)
