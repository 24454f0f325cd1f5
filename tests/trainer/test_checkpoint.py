"""Checkpoints: clear errors, keep-last-and-best, restores. A learner SIGKILLed mid-run (at
start-up, right at a save, inside the async save) and resumed is
``tests/reliability/test_trainer_kill.py``: it ends bit-identical to an uninterrupted run for
every ``trainer.trainable`` form."""

import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.trainer import checkpoint


def test_restore_without_checkpoint_is_a_clear_error(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "empty"), async_save=False)
  with pytest.raises(errors.CheckpointError, match="No checkpoint"):
    ckpt.restore({"x": jnp.zeros(2)})


def test_keep_last_and_best(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), keep=2, best_metric="solve_rate",
                                 async_save=False)
  for step, rate in [(1, 0.9), (2, 0.1), (3, 0.2), (4, 0.3)]:
    ckpt.save(step, {"w": jnp.full((3,), step, jnp.float32)}, host={"pos": step},
              metrics={"solve_rate": rate})
  ckpt.wait()
  steps = ckpt.all_steps()
  assert 1 in steps and 4 in steps and len(steps) <= 3  # best kept beside the latest
  state, host, step = ckpt.restore({"w": jnp.zeros(3)})
  assert step == 4 and host == {"pos": 4} and np.allclose(state["w"], 4)
  ckpt.close()


def test_a_resumed_learner_lowers_the_same_update_as_a_fresh_one(tmp_path):
  """A resumed run compiles nothing a fresh run compiled: the update lowers to the same program
  from a restored state as from a fresh one (a restored array is committed to its device; an
  uncommitted fresh one would lower without a sharding, a different program and a compile-cache
  miss, ~5 s per resumed test learner at -O0)."""
  import jax

  from legorl_jax.models import create_model
  from legorl_jax.trainer.learner import Learner
  from tests.trainer import test_accumulate, test_train_step as helpers

  cfg = test_accumulate._cfg(False)  # noqa: SLF001
  model = create_model(helpers.CFG, seed=0)
  batch = {k: jax.numpy.asarray(v) for k, v in helpers.make_batch(b=4, seed=1).items()}

  def update_hlo(learner):
    return learner._step.lower(learner.state, batch, learner.frozen,  # noqa: SLF001
                               scored_cap=None, shared_prefix=None).as_text()

  fresh = Learner(model, cfg)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), async_save=False)
  ckpt.save(0, fresh.state, host={})
  ckpt.wait()
  resumed = Learner(model, cfg)
  resumed.state, _, _ = ckpt.restore(resumed.state)
  ckpt.close()
  assert update_hlo(resumed) == update_hlo(fresh)
