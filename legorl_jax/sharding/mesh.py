"""Device mesh construction with the project's three axes ``(data, fsdp, tensor)``."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from legorl_jax import errors

MESH_AXES = ("data", "fsdp", "tensor")
# Auto axes: XLA's sharding propagation places intermediates; params and batches are pinned.
_AUTO = (AxisType.Auto,) * len(MESH_AXES)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
  """Builds a ``(data, fsdp, tensor)`` mesh; one axis may be -1 (takes the remaining devices)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = [data, fsdp, tensor]
  if shape.count(-1) > 1:
    raise errors.ShardingError(f"At most one mesh axis may be -1, got {dict(zip(MESH_AXES, shape))}.")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if len(devices) % known:
      raise errors.ShardingError(
          f"{len(devices)} devices cannot be split into mesh {dict(zip(MESH_AXES, shape))}.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise errors.ShardingError(
        f"Mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices but "
        f"{len(devices)} are available; set the axes so their product equals the device count.")
  try:
    return jax.make_mesh(tuple(shape), MESH_AXES, devices=devices, axis_types=_AUTO)
  except Exception:  # Fallback for device sets make_mesh cannot lay out.
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=_AUTO)


def single_device_mesh() -> Mesh:
  return make_mesh(1, 1, 1, devices=jax.devices()[:1])
