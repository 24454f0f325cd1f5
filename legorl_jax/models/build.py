"""Creating a policy directly in its shardings."""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh

from legorl_jax.models.config import ModelConfig, get_preset
from legorl_jax.models.decoder import Decoder
from legorl_jax.sharding import rules as sharding_rules


def abstract_model(config: ModelConfig) -> Decoder:
  """A Decoder whose parameters are ShapeDtypeStructs (no memory allocated)."""
  return nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))


def create_model(config: ModelConfig | str, seed: int = 0, mesh: Mesh | None = None,
                 rules=sharding_rules.DEFAULT_RULES) -> Decoder:
  """Randomly initialised Decoder; with a mesh, each parameter is created in its sharding."""
  if isinstance(config, str):
    config = get_preset(config)
  if mesh is None:
    return Decoder(config, rngs=nnx.Rngs(seed))
  graphdef, abstract_state = nnx.split(abstract_model(config))
  shardings = sharding_rules.state_shardings(abstract_state, mesh, rules)

  @jax.jit
  def init():
    return nnx.split(Decoder(config, rngs=nnx.Rngs(seed)))[1]

  state = jax.jit(init, out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def shard_model(model: Decoder, mesh: Mesh, rules=sharding_rules.DEFAULT_RULES) -> Decoder:
  """Moves an existing model's parameters into their mesh shardings."""
  graphdef, state = nnx.split(model)
  shardings = sharding_rules.state_shardings(state, mesh, rules)
  return nnx.merge(graphdef, jax.device_put(state, shardings))
