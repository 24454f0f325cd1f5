"""The sampler's fused projections: q|k|v and gate|up of every block as one kernel each.

A decode step multiplies a few dozen rows by each weight matrix. At that size five separate
matmuls per block (q, k, v, gate, up) each pay their own pass over the activations and their
own call overhead; concatenating the kernels that read the same input makes two larger ones.
The learner keeps the separate kernels (what trains, what imports and exports), so the fused
copies live only beside the engine's parameters (``sampling.device``), rebuilt from them at
every parameter update: an exact rearrangement, the same function up to the matmul's
summation order.

Mixture-of-experts blocks keep their experts as they are (``gate_up`` is None there); their
attention is fused like any other. Each fused kernel is ``[D, N]`` in the parameters' dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx


class FusedBlock(NamedTuple):
  """One block's fused kernels.

  qkv: [D, (H + 2 Hkv) Dh]; qkv_bias: [(H + 2 Hkv) Dh] or None; gate_up: [D, 2 I], or None
  for a sparse (mixture-of-experts) block.
  """

  qkv: jax.Array
  qkv_bias: jax.Array | None
  gate_up: jax.Array | None


def fuse(graphdef, state) -> tuple[FusedBlock, ...]:
  """The fused kernels of every block of the Decoder ``nnx.merge(graphdef, state)``."""
  model = nnx.merge(graphdef, state)
  out = []
  for block in model.layers:
    a = block.attn
    qkv = jnp.concatenate([a.q_kernel[...], a.k_kernel[...], a.v_kernel[...]], axis=1)
    bias = None
    if a.config.qkv_bias:
      bias = jnp.concatenate([a.q_bias[...], a.k_bias[...], a.v_bias[...]])
    gate_up = None
    if not block.sparse:
      gate_up = jnp.concatenate([block.mlp.gate_kernel[...], block.mlp.up_kernel[...]], axis=1)
    out.append(FusedBlock(qkv, bias, gate_up))
  return tuple(out)


def nbytes(fused: tuple[FusedBlock, ...]) -> int:
  """Bytes the fused copies take beside the parameters."""
  return sum(x.nbytes for x in jax.tree.leaves(fused))


# graphdef (arg 0) is static: one executable per model shape.
FUSE = jax.jit(fuse, static_argnums=(0,))
