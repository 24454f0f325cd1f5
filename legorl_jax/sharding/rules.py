"""Logical-axis sharding rules: one small table from parameter axis names to mesh axes."""

from __future__ import annotations

import logging
from typing import Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from legorl_jax import errors

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp", "expert")),
    ("vocab", "tensor"),
    ("embed", ("fsdp", "expert")),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("seq", None),
    # Mixture of experts: stacked expert kernels [E, ...] shard E over the 'expert' mesh axis
    # (expert parallel; the axis also splits the batch, so it composes with data/fsdp/tensor);
    # the router's [D, E] output axis stays whole on every device. Other parameters' embed axis
    # shards over fsdp x expert (ZeRO over both); in an expert kernel, 'expert' is already
    # taken by E, so its embed axis shards over fsdp alone.
    ("experts", "expert"),
    ("router", None),
)

_warned: set = set()


def _mesh_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  return size


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules=DEFAULT_RULES) -> P:
  """Maps logical axis names to a PartitionSpec for an array of ``shape`` on ``mesh``.

  A dimension that the mesh axes do not divide is replicated (logged once), so any HF
  checkpoint loads on any mesh; a mesh axis is used at most once per array.
  """
  table = dict(rules)
  if len(logical_axes) != len(shape):
    raise errors.ShardingError(
        f"logical axes {tuple(logical_axes)} do not match array shape {tuple(shape)}.")
  used, spec = set(), []
  for name, dim in zip(logical_axes, shape):
    if name is not None and name not in table:
      raise errors.ShardingError(
          f"No sharding rule for logical axis {name!r}; add it to the rules table "
          f"(known: {sorted(table)}).")
    axes = table.get(name) if name is not None else None
    if axes is not None:
      tup = (axes,) if isinstance(axes, str) else tuple(axes)
      tup = tuple(a for a in tup if a in mesh.shape and a not in used)
      axes = tup if tup else None
    size = _mesh_size(mesh, axes)
    if axes is not None and dim % size:
      key = (name, dim, size)
      if key not in _warned:
        _warned.add(key)
        logging.info("Replicating axis %r of size %d: not divisible by mesh axes %s (size %d).",
                     name, dim, axes, size)
      axes = None
    if axes is not None:
      used.update(axes)
      axes = axes[0] if len(axes) == 1 else axes
    spec.append(axes)
  return P(*spec)


def state_shardings(state, mesh: Mesh, rules=DEFAULT_RULES):
  """NamedShardings for an (abstract) ``nnx.State``, from each Variable's ``logical_axes``.

  Variables without ``logical_axes`` (e.g. optimizer counters) are replicated.
  """

  def one(var):
    axes = var.get_metadata().get("logical_axes")
    shape = var.shape
    spec = logical_to_spec(axes, shape, mesh, rules) if axes is not None else P()
    return var.replace(NamedSharding(mesh, spec))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=DEFAULT_RULES) -> NamedSharding:
  """Sharding for a ``[B, ...]`` batch: leading axis over the batch mesh axes."""
  batch_axes = dict(rules)["batch"]
  batch_axes = tuple(a for a in batch_axes if a in mesh.shape)
  return NamedSharding(mesh, P(batch_axes, *([None] * (ndim - 1))))
