"""Logical-axis rules -> PartitionSpecs / NamedShardings on an 8-device (2, 2, 2) mesh."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from legorl_jax import errors
from legorl_jax.models import abstract_model, get_preset
from legorl_jax.sharding import (DEFAULT_RULES, batch_sharding, logical_to_spec, make_mesh,
                                 state_shardings)


@pytest.fixture(scope="module")
def mesh():
  return make_mesh(2, 2, 2)


@pytest.mark.parametrize("axes,shape,expected", [
    (("vocab", "embed"), (64, 32), P("tensor", "fsdp")),
    (("embed", "heads"), (32, 64), P("fsdp", "tensor")),
    (("mlp", "embed"), (96, 32), P("tensor", "fsdp")),
    (("norm",), (32,), P(None)),
    (("head_dim",), (16,), P(None)),
    (("batch", "seq"), (8, 5), P(("data", "fsdp"), None)),
    ((None, "embed"), (3, 32), P(None, "fsdp")),
    # A mesh axis is used at most once per array: the second 'tensor' user is replicated.
    (("heads", "mlp"), (64, 96), P("tensor", None)),
    # Dimensions the mesh axes do not divide are replicated.
    (("vocab", "embed"), (151, 32), P(None, "fsdp")),
    (("embed", "kv_heads"), (33, 6), P(None, "tensor")),
    (("batch",), (6,), P(None)),
    # ...which frees the axis for a later dimension.
    (("heads", "mlp"), (3, 96), P(None, "tensor")),
])
def test_logical_to_spec(mesh, axes, shape, expected):
  assert logical_to_spec(axes, shape, mesh) == expected


def test_rules_ignore_axes_missing_from_mesh():
  only_tensor = Mesh(np.asarray(jax.devices()[:2]), ("tensor",))
  assert logical_to_spec(("vocab", "embed"), (64, 32), only_tensor) == P("tensor", None)
  assert logical_to_spec(("batch",), (4,), only_tensor) == P(None)


def test_custom_rules(mesh):
  rules = (("embed", ("fsdp", "tensor")), ("vocab", None))
  assert logical_to_spec(("vocab", "embed"), (64, 32), mesh, rules) == P(None, ("fsdp", "tensor"))


def test_unknown_axis_and_rank_mismatch(mesh):
  with pytest.raises(errors.ShardingError, match=r"No sharding rule for logical axis 'channels'"):
    logical_to_spec(("channels", "embed"), (4, 32), mesh)
  with pytest.raises(errors.ShardingError, match=r"do not match array shape \(4,\)"):
    logical_to_spec(("vocab", "embed"), (4,), mesh)


def test_state_shardings_follow_logical_axes(mesh):
  config = get_preset("tiny", vocab_size=512, num_layers=1, tie_word_embeddings=False)
  state = nnx.state(abstract_model(config))
  shardings = dict(nnx.to_flat_state(state_shardings(state, mesh)))
  spec = lambda *p: shardings[p].get_value().spec  # noqa: E731
  assert spec("embed") == P("tensor", "fsdp")
  assert spec("lm_head") == P("fsdp", "tensor")
  assert spec("layers", 0, "attn", "k_kernel") == P("fsdp", "tensor")
  assert spec("layers", 0, "attn", "o_kernel") == P("tensor", "fsdp")
  assert spec("layers", 0, "mlp", "down_kernel") == P("tensor", "fsdp")
  assert spec("layers", 0, "attn", "q_norm", "weight") == P(None)
  assert spec("final_norm", "weight") == P(None)
  assert all(isinstance(v.get_value(), NamedSharding) for _, v in shardings.items())
  # Every rule in the default table is reachable from the model or the batch.
  used = {a for _, v in nnx.to_flat_state(state) for a in v.get_metadata()["logical_axes"]}
  moe = nnx.state(abstract_model(get_preset(
      "tiny", vocab_size=512, num_layers=1, architecture="qwen3_moe", num_experts=4,
      num_experts_per_tok=2, moe_intermediate_size=64)))
  used |= {a for _, v in nnx.to_flat_state(moe) for a in v.get_metadata()["logical_axes"]}
  assert used | {"batch", "seq"} == {name for name, _ in DEFAULT_RULES}


def test_batch_sharding(mesh):
  s = batch_sharding(mesh, ndim=3)
  assert s.spec == P(("data", "fsdp"), None, None) and s.mesh == mesh
