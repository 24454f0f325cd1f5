"""The learner's state: one pytree that crosses jit, sharding and checkpoint boundaries."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from legorl_jax.models.params import ModelDef, Params


@flax.struct.dataclass
class TrainState:
  """``step`` int32 []; ``params`` flat dict of the *trainable* parameters (every parameter,
  the top blocks, or LoRA adapters: ``trainer.trainable``; the frozen rest lives outside the
  state); ``opt_state`` optax; ``rng`` uint32 key data [2]; ``value_head`` None or
  ``{"kernel": [D, 1], "bias": [1]}`` (PPO critic on the policy trunk); ``ref_params`` None or
  the reference policy's trainables (their values at the start of the phase, with the same
  frozen base), for a KL term (``loss.kl_coef > 0``). It is checkpointed with the state, so a
  resumed run keeps the reference it started with."""

  step: jax.Array
  params: Params
  opt_state: Any
  rng: jax.Array
  value_head: Any = None
  ref_params: Any = None

  def trainable(self):
    return {"policy": self.params, "value_head": self.value_head}


def init_value_head(hidden_size: int) -> dict[str, jax.Array]:
  return {"kernel": jnp.zeros((hidden_size, 1), jnp.float32), "bias": jnp.zeros((1,), jnp.float32)}


def create_train_state(params: Params, optimizer: optax.GradientTransformation, seed: int = 0,
                       value_head=None, ref_params=None) -> TrainState:
  trainable = {"policy": params, "value_head": value_head}
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(trainable),
                    rng=jax.random.key_data(jax.random.key(seed)), value_head=value_head,
                    ref_params=ref_params)


def state_shardings(state: TrainState, model_def: ModelDef, mesh: Mesh) -> TrainState:
  """Shardings for every leaf: params by their logical axes; optimizer moments follow the
  parameter they belong to (matched by shape within the same key path); the rest (LoRA
  adapters, which are small, included) replicated."""
  replicated = NamedSharding(mesh, P())
  param_sh = model_def.shardings(mesh)
  own = {k: param_sh.get(k, replicated) for k in state.params}

  def opt_leaf(path, leaf):
    # optax moment trees mirror {"policy": params, "value_head": ...}; find the param key.
    keys = [getattr(k, "key", None) for k in path]
    if "policy" in keys:
      name = keys[keys.index("policy") + 1]
      if name in param_sh and getattr(leaf, "shape", None) == model_def.shapes()[name].shape:
        return param_sh[name]
    return replicated

  return TrainState(
      step=replicated,
      params=own,
      opt_state=jax.tree_util.tree_map_with_path(opt_leaf, state.opt_state),
      rng=replicated,
      value_head=jax.tree.map(lambda _: replicated, state.value_head),
      ref_params=None if state.ref_params is None else dict(own),
  )
