"""Mesh construction on 8 host CPU devices (tests/conftest.py)."""

import jax
import pytest

from legorl_jax import errors
from legorl_jax.sharding import MESH_AXES, make_mesh, single_device_mesh


def test_eight_devices_available():
  assert jax.device_count() == 8


@pytest.mark.parametrize("args,shape", [
    ((2, 2, 2), (2, 2, 2)),
    ((1, -1, 1), (1, 8, 1)),
    ((2, -1, 2), (2, 2, 2)),
    ((-1, 1, 4), (2, 1, 4)),
    ((8, 1, 1), (8, 1, 1)),
])
def test_make_mesh_shapes(args, shape):
  mesh = make_mesh(*args)
  assert mesh.axis_names == MESH_AXES
  assert tuple(mesh.shape[a] for a in MESH_AXES) == shape
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_default_is_all_fsdp():
  assert dict(make_mesh().shape) == {"data": 1, "fsdp": 8, "tensor": 1}


def test_subset_of_devices():
  mesh = make_mesh(1, 2, 2, devices=jax.devices()[:4])
  assert mesh.devices.size == 4
  one = single_device_mesh()
  assert one.devices.size == 1 and dict(one.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("args,pattern", [
    ((-1, -1, 1), "At most one mesh axis may be -1"),
    ((3, -1, 1), "8 devices cannot be split"),
    ((2, 2, 1), r"needs 4 devices but 8 are available"),
    ((4, 2, 2), r"needs 16 devices"),
])
def test_make_mesh_errors(args, pattern):
  with pytest.raises(errors.ShardingError, match=pattern):
    make_mesh(*args)
