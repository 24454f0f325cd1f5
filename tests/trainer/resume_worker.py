"""A learner process for the kill-and-resume test: trains a small policy on batches drawn
from the data position, checkpointing every step; resumes from the latest checkpoint.

``python -m tests.trainer.resume_worker WORKDIR TOTAL_STEPS OUT.npz [TRAINABLE]``: TRAINABLE is
a ``trainer.trainable`` value ("all" by default, "top:1", "lora"); the checkpoint holds the
trainables only, the frozen base is rebuilt from the seeded model, and OUT holds the merged
policy parameters. ``top:1+trunk_cache``: ``top:1`` on three batches in turn (epochs), each
step fed the frozen trunk's states from a ``TrunkCache`` filled at every start (as SFT fills
it), so only the top block and the head run in the step."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from legorl_jax.models import create_model
from legorl_jax.models.params import split_model
from legorl_jax.trainer import checkpoint, optimizer as opt_lib, state as state_lib, train_step as ts
from legorl_jax.trainer import trainable as trainable_lib
from legorl_jax.trainer import trunk_cache
from tests.trainer import test_train_step as helpers

CACHED = "+trunk_cache"


def initial(trainable: str = "all"):
  """(model_def, plan, frozen, fresh TrainState, optimizer, cfg) of the worker's run."""
  cfg = helpers.make_cfg(micro=2)
  cfg.optim.learning_rate, cfg.optim.max_grad_norm = 3e-3, 1.0
  cfg.trainer.trainable = trainable.removesuffix(CACHED)
  cfg.trainer.lora_rank, cfg.trainer.lora_alpha = 4, 8.0
  model_def, base = split_model(create_model(helpers.CFG, seed=0))
  plan = trainable_lib.plan_for(cfg.trainer, base)
  frozen, params = plan.split(base, seed=5)
  opt = opt_lib.make_optimizer(cfg.optim)
  return model_def, plan, frozen, state_lib.create_train_state(params, opt, seed=1), opt, cfg


def main(workdir: str, total_steps: int, out: str, trainable: str = "all"):
  cached = trainable.endswith(CACHED)
  model_def, plan, frozen, state, opt, cfg = initial(trainable)
  # Committed, as the learner's is (``Learner.__init__``): a resumed worker then lowers the same
  # update program as a fresh one, and takes it from the session's compile cache.
  state = jax.device_put(state, jax.devices()[0])
  step_fn = jax.jit(ts.make_train_step(model_def, opt, cfg, plan=plan), donate_argnums=(0,))
  data = lambda position: helpers.make_batch(seed=100 + position)  # noqa: E731
  if cached:
    trunk_fn = jax.jit(ts.make_trunk_fn(model_def, plan))
    params = jax.tree.map(jnp.copy, state.params)
    cache = trunk_cache.TrunkCache(
        lambda b: np.asarray(trunk_fn(params, frozen, jax.tree.map(jnp.asarray, b))), 64.0)
    epoch = [helpers.make_batch(seed=100 + i) for i in range(3)]
    cache.fill(epoch)
    data = lambda position: cache.attach(epoch[position % 3])  # noqa: E731
  ckpt = checkpoint.Checkpointer(workdir, keep=2, async_save=True)
  position = 0
  if ckpt.latest_step() is not None:
    state, host, _ = ckpt.restore(state)
    position = host["data_position"]
    print(f"resumed {int(state.step)} position {position}", flush=True)
  while int(state.step) < total_steps:
    batch = jax.tree.map(jnp.asarray, data(position))
    state, _ = step_fn(state, batch, frozen)
    position += 1
    ckpt.save(int(state.step), state, host={"data_position": position})
    print(f"saved {int(state.step)}", flush=True)
  ckpt.close()
  np.savez(out, **{k: np.asarray(v) for k, v in plan.merge(frozen, state.params).items()})
  print("done", flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:5])
