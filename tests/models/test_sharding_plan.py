"""The dry-run sharding plan of Qwen3-30B-A3B on a TPU slice (runs the planner, not the model)."""

import json

from jax.sharding import PartitionSpec as P

from legorl_jax.models import get_preset
from legorl_jax.models import sharding_plan

GIB = 2 ** 30


def test_qwen3_30b_a3b_plan(capsys):
  config = get_preset("qwen3-30b-a3b")
  assert config.moe_layers == tuple(range(48)) and config.route_dtype.__name__ == "int8"
  result = sharding_plan.main(["--mesh", "data=1,fsdp=8,expert=8,tensor=1",
                               "--kv_rows", "64", "--kv_len", "32768"])
  printed = json.loads(capsys.readouterr().out)
  assert result.total_params == config.num_params() == printed["params_b"]
  assert 30.4e9 < result.total_params < 30.6e9  # the published 30.5B
  assert result.specs["layers.0.mlp.gate_kernel"] == str(P("expert", "fsdp", "tensor"))
  # bf16 weights over 64 chips, Adam f32 moments, one 32K row of bf16 K/V per chip.
  assert abs(printed["params_gib_per_chip"] - 2 * 30.53e9 / 64 / GIB) < 0.05
  assert abs(printed["optimizer_gib_per_chip"] - 4 * printed["params_gib_per_chip"]) < 1e-6
  assert printed["kv_gib_per_chip"] == 2 * 48 * 32768 * 4 * 128 * 2 / GIB
  assert printed["total_gib_per_chip"] < 16  # fits a v5e chip (16 GiB HBM)


def test_plan_without_expert_axis_replicates_experts():
  result = sharding_plan.plan(get_preset("qwen3-30b-a3b"), dict(data=1, fsdp=8, tensor=1))
  assert result.specs["layers.0.mlp.gate_kernel"] == str(P(None, "fsdp", "tensor"))
