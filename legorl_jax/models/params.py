"""Flat parameter dicts: the form params take across jit, optax and orbax boundaries.

An NNX model splits into a static ``ModelDef`` (graph + abstract variables with their
``logical_axes``) and ``params``: ``{"layers.0.attn.q_kernel": Array, ...}``. Flat string keys
keep checkpoints, optimizer state and HF name mapping simple and stable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from legorl_jax.sharding import rules as sharding_rules

Params = dict[str, jax.Array]


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def _key(path) -> str:
  parts = []
  for k in path:
    parts.append(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))))
  return ".".join(parts)


def flatten_state(state) -> dict[str, nnx.Variable]:
  """``nnx.State`` -> ``{dotted path: Variable}``."""
  leaves = jax.tree_util.tree_leaves_with_path(state, is_leaf=_is_var)
  return {_key(p): v for p, v in leaves}


@dataclasses.dataclass(frozen=True, eq=False)
class ModelDef:
  """Static half of a split model: rebuilds a module from a flat params dict."""

  graphdef: Any
  template: Any  # abstract nnx.State (ShapeDtypeStruct values)

  def merge(self, params: Params):
    """Rebuilds the module; works under jit (params may be tracers)."""
    leaves = jax.tree_util.tree_leaves_with_path(self.template, is_leaf=_is_var)
    treedef = jax.tree_util.tree_structure(self.template, is_leaf=_is_var)
    new = [v.replace(params[_key(p)]) for p, v in leaves]
    return nnx.merge(self.graphdef, jax.tree_util.tree_unflatten(treedef, new))

  def logical_axes(self) -> dict[str, tuple]:
    return {k: v.get_metadata().get("logical_axes") for k, v in flatten_state(self.template).items()}

  def shardings(self, mesh: Mesh, rules=sharding_rules.DEFAULT_RULES) -> dict[str, Any]:
    """``{name: NamedSharding}`` from each parameter's logical axes."""
    shard_state = sharding_rules.state_shardings(self.template, mesh, rules)
    return {k: v.get_value() for k, v in flatten_state(shard_state).items()}

  def shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: v.get_value() for k, v in flatten_state(self.template).items()}


def split_model(model) -> tuple[ModelDef, Params]:
  """Module -> (ModelDef, flat params). Only ``nnx.Param`` leaves are params."""
  graphdef, state = nnx.split(model)
  template = jax.tree.map(
      lambda v: v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype)), state, is_leaf=_is_var)
  params = {k: v.get_value() for k, v in flatten_state(state).items()}
  return ModelDef(graphdef, template), params
