"""Dry-run sharding plan: per-chip parameter, optimizer and K/V-cache memory of a policy on a
mesh, from the logical-axis rules alone (no devices, no arrays: an ``AbstractMesh``).

The plan runs the same ``logical_to_spec`` the loader and trainer use, on the model's abstract
parameter shapes, so what it prints is what a real run places on each chip.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh

from legorl_jax import errors
from legorl_jax.models.build import abstract_model
from legorl_jax.models.config import get_preset
from legorl_jax.sharding import rules as sharding_rules

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Plan:
  """Bytes per chip (the most loaded chip; the rules shard evenly or replicate)."""
  mesh: dict
  params_bytes: int
  optimizer_bytes: int
  kv_bytes: int
  total_params: int
  specs: dict  # parameter path -> PartitionSpec (as a string)

  def summary(self) -> dict:
    return dict(mesh=self.mesh, params_b=self.total_params,
                params_gib_per_chip=self.params_bytes / GIB,
                optimizer_gib_per_chip=self.optimizer_bytes / GIB,
                kv_gib_per_chip=self.kv_bytes / GIB,
                total_gib_per_chip=(self.params_bytes + self.optimizer_bytes + self.kv_bytes) / GIB)


def _per_chip(shape, spec, mesh_shape) -> int:
  n = math.prod(shape)
  for axes in spec:
    if axes is None:
      continue
    for a in (axes,) if isinstance(axes, str) else axes:
      n //= mesh_shape[a]
  return n


def plan(config, mesh_axes: dict[str, int], *, param_dtype="bfloat16",
         optimizer_slots: int = 2, optimizer_dtype="float32", kv_rows: int = 0,
         kv_len: int = 0, kv_dtype="bfloat16", rules=sharding_rules.DEFAULT_RULES) -> Plan:
  """The per-chip memory of ``config`` (a ModelConfig) on a mesh of ``mesh_axes`` sizes.

  optimizer_slots: f32 moments per parameter (2 for Adam). K/V: ``kv_rows`` sequences of
  ``kv_len`` tokens, rows sharded over the batch axes, kv heads over ``tensor``.
  """
  if any(int(v) <= 0 for v in mesh_axes.values()):
    raise errors.ShardingError(f"mesh axes {mesh_axes} must all be positive sizes.")
  mesh = AbstractMesh(tuple(int(v) for v in mesh_axes.values()), tuple(mesh_axes))
  state = nnx.state(abstract_model(config), nnx.Param)
  p_item, o_item = jnp.dtype(param_dtype).itemsize, jnp.dtype(optimizer_dtype).itemsize
  params = opt = total = 0
  specs = {}
  for path, var in nnx.to_flat_state(state):
    spec = sharding_rules.logical_to_spec(var.get_metadata()["logical_axes"], var.shape, mesh,
                                          rules)
    n = _per_chip(var.shape, spec, mesh.shape)
    params += n * p_item
    opt += n * o_item * optimizer_slots
    total += math.prod(var.shape)
    specs[".".join(map(str, path))] = str(spec)
  kv = 0
  if kv_rows and kv_len:
    shape = (kv_rows, kv_len, config.num_kv_heads, config.head_dim)
    spec = sharding_rules.logical_to_spec(("batch", "seq", "kv_heads", "head_dim"), shape, mesh,
                                          rules)
    kv = 2 * config.num_layers * _per_chip(shape, spec, mesh.shape) * jnp.dtype(kv_dtype).itemsize
  return Plan(dict(mesh_axes), params, opt, kv, total, specs)


def main(argv=None):
  """``python -m legorl_jax.models.sharding_plan --preset qwen3-30b-a3b --mesh data=1,fsdp=8,expert=8,tensor=1``"""
  import argparse  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel

  ap = argparse.ArgumentParser(description="Per-chip memory of a policy on a mesh (dry run).")
  ap.add_argument("--preset", default="qwen3-30b-a3b")
  ap.add_argument("--mesh", default="data=1,fsdp=8,expert=8,tensor=1")
  ap.add_argument("--kv_rows", type=int, default=64)
  ap.add_argument("--kv_len", type=int, default=32768)
  args = ap.parse_args(argv)
  axes = {k: int(v) for k, v in (kv.split("=") for kv in args.mesh.split(","))}
  result = plan(get_preset(args.preset), axes, kv_rows=args.kv_rows, kv_len=args.kv_len)
  print(json.dumps(dict(preset=args.preset, **result.summary())))
  return result


if __name__ == "__main__":
  main()
