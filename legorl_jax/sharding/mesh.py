"""Device mesh construction with the project's three axes ``(data, fsdp, tensor)``, plus an
``expert`` axis (expert parallel) for mixture-of-experts policies when asked for."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from legorl_jax import errors

MESH_AXES = ("data", "fsdp", "tensor")
# With expert parallelism: stacked expert kernels shard over 'expert', which also splits the batch.
MOE_MESH_AXES = ("data", "fsdp", "expert", "tensor")
# Auto axes: XLA's sharding propagation places intermediates; params and batches are pinned.


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None, *,
              expert: int | None = None) -> Mesh:
  """Builds a ``(data, fsdp, tensor)`` mesh; one axis may be -1 (takes the remaining devices).

  With ``expert`` (an int, possibly -1) the mesh is ``(data, fsdp, expert, tensor)``.
  """
  devices = list(jax.devices() if devices is None else devices)
  names = MESH_AXES if expert is None else MOE_MESH_AXES
  shape = [data, fsdp, tensor] if expert is None else [data, fsdp, expert, tensor]
  if shape.count(-1) > 1:
    raise errors.ShardingError(f"At most one mesh axis may be -1, got {dict(zip(names, shape))}.")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if len(devices) % known:
      raise errors.ShardingError(
          f"{len(devices)} devices cannot be split into mesh {dict(zip(names, shape))}.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise errors.ShardingError(
        f"Mesh {dict(zip(names, shape))} needs {math.prod(shape)} devices but "
        f"{len(devices)} are available; set the axes so their product equals the device count.")
  try:
    return jax.make_mesh(tuple(shape), names, devices=devices,
                         axis_types=(AxisType.Auto,) * len(names))
  except Exception:  # Fallback for device sets make_mesh cannot lay out.
    return Mesh(np.asarray(devices).reshape(shape), names,
                axis_types=(AxisType.Auto,) * len(names))


def single_device_mesh() -> Mesh:
  return make_mesh(1, 1, 1, devices=jax.devices()[:1])
