"""Mesh construction and logical-axis sharding rules."""

from legorl_jax.sharding.mesh import MESH_AXES, MOE_MESH_AXES, make_mesh, single_device_mesh
from legorl_jax.sharding.rules import DEFAULT_RULES, batch_sharding, logical_to_spec, state_shardings
