"""Loading a checkpoint straight into its shardings: the part every format shares.

``hf_io.from_pretrained`` (safetensors) and ``gguf.from_gguf`` differ in how they find and
read a tensor, not in what they fill: the parameters of an abstract Decoder (shapes only, no
memory), each placed in its logical-axis sharding as it is read, so no full copy of the model
ever exists on one host or device. This module is that common frame.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from legorl_jax.models.build import abstract_model
from legorl_jax.models.config import ModelConfig
from legorl_jax.models.decoder import Decoder
from legorl_jax.sharding import rules as sharding_rules


def dtype_overrides(dtype, compute_dtype=None) -> dict[str, str]:
  """ModelConfig fields for loading with parameter ``dtype`` (compute: ``compute_dtype`` or it)."""
  return {"param_dtype": jnp.dtype(dtype).name, "dtype": jnp.dtype(compute_dtype or dtype).name}


class ParamSlots:
  """The parameters a checkpoint must fill for ``config``, and where each one goes.

  ``flat`` lists ``(path, abstract variable)``; ``place`` makes one parameter from a read
  callback (``make_array_from_callback``: each device reads only its slice); ``model`` merges
  the placed parameters into the Decoder.
  """

  def __init__(self, config: ModelConfig, mesh: Mesh | None = None,
               rules=sharding_rules.DEFAULT_RULES):
    self.graphdef, abstract = nnx.split(abstract_model(config))
    self.flat = list(nnx.to_flat_state(abstract))
    self._shardings = {}
    if mesh is not None:
      self._shardings = {p: v.get_value() for p, v in
                         nnx.to_flat_state(sharding_rules.state_shardings(abstract, mesh, rules))}

  def place(self, path: tuple, shape: tuple, read: Callable) -> jax.Array:
    """The parameter at ``path``, in its sharding (the first device without a mesh)."""
    sharding = self._shardings.get(path)
    if sharding is None:
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.make_array_from_callback(shape, sharding, read)

  def model(self, values: dict) -> Decoder:
    """The Decoder with ``values[path]`` for every parameter."""
    state = nnx.from_flat_state([(p, var.replace(values[p])) for p, var in self.flat])
    return nnx.merge(self.graphdef, state)
