"""Low-rank adapters over a Decoder's projection kernels, as pure functions of flat params.

A targeted kernel ``W [D_in, D_out]`` gets ``A [D_in, r]`` and ``B [r, D_out]``; the policy uses
``W + (alpha / r) * A @ B``. ``B`` starts at zero, so before the first update the merged kernel
is ``W`` exactly (``A @ 0`` is exactly 0 in IEEE arithmetic) and the policy is the base model.

Two ways to apply them, with the same result up to float rounding:
  * merged (``merged_kernels``): the kernel itself becomes ``W + s A @ B``. The sampler always
    serves merged weights, and the weight sync and the Hugging Face export send them;
  * low-rank (``LowRankKernel``), in the learner's step: ``x @ W + s (x @ A) @ B``. Autodiff
    then never forms the ``[D_in, D_out]`` weight gradient of a frozen kernel (a merged kernel
    would need it, to project it onto A and B), which is a third of a block's backward
    matmuls. The Decoder needs no change: it multiplies ``x @ kernel[...].astype(dtype)``,
    and ``LowRankKernel`` implements exactly those three operations.

Adapter names extend the kernel's flat name: ``layers.3.attn.q_kernel.lora_a`` / ``.lora_b``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from legorl_jax import errors

# Projection short names -> the kernel's name inside a block (``layers.{i}.<this>``).
TARGETS = {"q": "attn.q_kernel", "k": "attn.k_kernel", "v": "attn.v_kernel",
           "o": "attn.o_kernel", "gate": "mlp.gate_kernel", "up": "mlp.up_kernel",
           "down": "mlp.down_kernel"}
SUFFIX_A, SUFFIX_B = ".lora_a", ".lora_b"


def target_kernels(param_names, targets) -> list[str]:
  """The flat names of the kernels named by ``targets`` (short names, see ``TARGETS``) in
  every block, in layer order."""
  bad = [t for t in targets if t not in TARGETS]
  if bad or not targets:
    raise errors.ConfigError(
        f"config trainer.lora_targets={tuple(targets)!r} must name one or more of "
        f"{list(TARGETS)}; e.g. --config.trainer.lora_targets='(\"q\", \"v\")'.")
  suffixes = tuple("." + TARGETS[t] for t in targets)
  out = [n for n in param_names if n.startswith("layers.") and n.endswith(suffixes)]
  return sorted(out, key=lambda n: (int(n.split(".")[1]), n))


def init_adapters(shapes: dict[str, tuple[int, int]], rank: int, seed: int) -> dict[str, jax.Array]:
  """Fresh float32 adapters for kernels of ``shapes`` ``{name: (D_in, D_out)}``: ``A`` uniform
  in ``±1/sqrt(D_in)`` (a fan-in scale, so ``x @ A`` stays O(|x|)), ``B`` zeros."""
  out = {}
  key = jax.random.key(seed)
  for i, (name, (d_in, d_out)) in enumerate(sorted(shapes.items())):
    bound = 1.0 / float(d_in) ** 0.5
    out[name + SUFFIX_A] = jax.random.uniform(jax.random.fold_in(key, i), (d_in, rank),
                                              jnp.float32, -bound, bound)
    out[name + SUFFIX_B] = jnp.zeros((rank, d_out), jnp.float32)
  return out


def merge_kernel(w: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """``W + scale * A @ B`` in float32, cast back to ``W``'s dtype: ``[D_in, D_out]``."""
  delta = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32),
                  precision=jax.lax.Precision.HIGHEST)
  return (w.astype(jnp.float32) + scale * delta).astype(w.dtype)


def merged_kernels(base: dict[str, jax.Array], adapters: dict[str, jax.Array], kernels,
                   scale: float) -> dict[str, jax.Array]:
  """``{kernel: merged}`` for each of ``kernels`` (flat names present in ``base``)."""
  return {k: merge_kernel(base[k], adapters[k + SUFFIX_A], adapters[k + SUFFIX_B], scale)
          for k in kernels}


@jax.tree_util.register_pytree_node_class
class LowRankKernel:
  """A kernel ``W [D_in, D_out]`` with a low-rank adapter, applied as ``x @ W + s (x @ A) @ B``.

  Stands in for an array inside the Decoder (``kernel[...]``, ``.astype(dtype)``,
  ``x @ kernel``; ``jax.Array.__matmul__`` defers to ``__rmatmul__`` for a non-array operand).
  A pytree (children W, A, B), so it passes through ``nnx.merge`` / ``jax.checkpoint``.
  """

  def __init__(self, w, a, b, scale: float):
    self.w, self.a, self.b, self.scale = w, a, b, scale

  def tree_flatten(self):
    return (self.w, self.a, self.b), self.scale

  @classmethod
  def tree_unflatten(cls, scale, children):
    return cls(*children, scale)

  @property
  def shape(self):
    return self.w.shape

  @property
  def dtype(self):
    return self.w.dtype

  def __getitem__(self, index):
    if index is not Ellipsis:
      raise TypeError("a LowRankKernel supports kernel[...] only")
    return self

  def astype(self, dtype):
    return LowRankKernel(self.w.astype(dtype), self.a.astype(dtype), self.b.astype(dtype), self.scale)

  def __rmatmul__(self, x):
    return x @ self.w + self.scale * ((x @ self.a) @ self.b)


def low_rank_kernels(base: dict[str, jax.Array], adapters: dict[str, jax.Array], kernels,
                     scale: float) -> dict[str, LowRankKernel]:
  """``{kernel: LowRankKernel}`` for each of ``kernels`` (see ``merged_kernels``)."""
  return {k: LowRankKernel(base[k], adapters[k + SUFFIX_A], adapters[k + SUFFIX_B], scale)
          for k in kernels}
