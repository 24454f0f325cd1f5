"""Expert parallelism: a qwen3_moe policy on an 8-device (data, fsdp, expert, tensor) mesh
computes the same logits, routes and gradients as on one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from legorl_jax.models import get_preset
from legorl_jax.models.build import create_model, shard_model
from legorl_jax.sharding import MOE_MESH_AXES, batch_sharding, make_mesh

CONFIG = get_preset("tiny", architecture="qwen3_moe", vocab_size=96, hidden_size=32,
                    intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                    mlp_only_layers=(1,), initializer_range=0.3)
IDS = np.random.RandomState(0).randint(0, 96, (8, 10)).astype(np.int32)


def _run(model, ids):
  graphdef, state = nnx.split(model)

  def loss(state, ids):
    h, info = nnx.merge(graphdef, state).hidden_routed(ids)
    logits = nnx.merge(graphdef, state).logits_from_hidden(h)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0]) + 0.01 * info.aux_loss, (logits, info)

  (_, (logits, info)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state, ids)
  return logits, info.experts, grads


@pytest.mark.parametrize("axes", [dict(data=1, fsdp=2, expert=2, tensor=2),
                                  dict(data=2, fsdp=1, expert=4, tensor=1)])
def test_expert_mesh_equals_one_device(axes):
  ref_logits, ref_routes, ref_grads = _run(create_model(CONFIG, seed=0), jnp.asarray(IDS))
  mesh = make_mesh(axes["data"], axes["fsdp"], axes["tensor"], expert=axes["expert"])
  assert mesh.axis_names == MOE_MESH_AXES
  model = shard_model(create_model(CONFIG, seed=0), mesh)
  kernel = model.layers[0].mlp.gate_kernel[...]
  assert kernel.sharding.spec[0] == "expert"
  assert {s.data.shape[0] for s in kernel.addressable_shards} == {8 // axes["expert"]}
  ids = jax.device_put(jnp.asarray(IDS), batch_sharding(mesh))
  assert ids.sharding.spec[0] == ("data", "fsdp", "expert")
  logits, routes, grads = _run(model, ids)
  np.testing.assert_array_equal(routes, ref_routes)
  # float32 sums in another order (the sharded reductions), compiled at the suite's LLVM level
  # (tests/conftest.py): up to ~4e-6 relative on logits of magnitude ~3.
  np.testing.assert_allclose(logits, ref_logits, atol=1e-5, rtol=1e-5)
  flat_ref = dict(nnx.to_flat_state(ref_grads))
  for p, g in nnx.to_flat_state(grads):
    np.testing.assert_allclose(np.asarray(g[...]), np.asarray(flat_ref[p][...]), atol=1e-5,
                               err_msg=str(p))
