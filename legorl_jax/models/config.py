"""Decoder configuration and presets.

One frozen dataclass covers Llama 3, Qwen2/2.5, Qwen3 and Qwen3-MoE; the dense architecture
differences are three switches (``qkv_bias``, ``qk_norm``, ``rope_scaling``) plus free
``head_dim``; ``qwen3_moe`` adds the mixture-of-experts fields (``num_experts`` > 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from legorl_jax import errors

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_moe")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only policy.

  ``rope_scaling`` is None or a Llama-3 style dict with keys ``factor``, ``low_freq_factor``,
  ``high_freq_factor`` and ``original_max_position_embeddings``.
  """

  architecture: str = "qwen3"
  vocab_size: int = 8192
  hidden_size: int = 128
  intermediate_size: int = 512
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  rope_theta: float = 10_000.0
  rope_scaling: dict[str, Any] | None = None
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  qkv_bias: bool = False
  qk_norm: bool = True
  max_position_embeddings: int = 4096
  # Parameters are kept in param_dtype; matmuls run in dtype (e.g. bfloat16 on TPU).
  dtype: str = "float32"
  param_dtype: str = "float32"
  # Rematerialise each block in the backward pass (saves activation memory).
  remat: bool = False
  initializer_range: float = 0.02
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  pad_token_id: int | None = None
  # Mixture of experts (qwen3_moe; 0 experts = dense). A layer i is sparse when
  # i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0 (HF's rule); sparse layers
  # route each token to num_experts_per_tok of num_experts SwiGLU experts of width
  # moe_intermediate_size, dense layers keep an MLP of width intermediate_size.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  # Weight of the Switch load-balancing loss in SFT (0 = off; RL never adds it).
  router_aux_loss_coef: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    if self.architecture not in ARCHITECTURES:
      raise errors.ConfigError(
          f"model.architecture={self.architecture!r} is not supported; use one of {ARCHITECTURES}.")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position_embeddings"):
      if int(getattr(self, name)) <= 0:
        raise errors.ConfigError(f"model.{name} must be positive, got {getattr(self, name)!r}.")
    if self.num_heads % self.num_kv_heads:
      raise errors.ConfigError(
          f"model.num_heads={self.num_heads} must be a multiple of model.num_kv_heads="
          f"{self.num_kv_heads} (grouped-query attention).")
    self._check_moe()
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError as e:
        raise errors.ConfigError(f"model.{name}={getattr(self, name)!r} is not a dtype: {e}") from e

  def __hash__(self):
    # rope_scaling is a dict; hash its items so configs (and NNX graphdefs) stay hashable.
    return hash(tuple(
        tuple(sorted(v.items())) if isinstance(v, dict) else v
        for v in (getattr(self, f.name) for f in dataclasses.fields(self))))

  def _check_moe(self):
    if (self.architecture == "qwen3_moe") != (self.num_experts > 0):
      raise errors.ConfigError(
          f"model.architecture={self.architecture!r} with model.num_experts={self.num_experts}: "
          f"qwen3_moe needs num_experts > 0 and the dense architectures need num_experts=0.")
    if not self.num_experts:
      return
    if not 0 < self.num_experts_per_tok <= self.num_experts:
      raise errors.ConfigError(
          f"model.num_experts_per_tok={self.num_experts_per_tok} must be in [1, num_experts="
          f"{self.num_experts}].")
    if self.moe_intermediate_size <= 0 or self.decoder_sparse_step <= 0:
      raise errors.ConfigError(
          f"model.moe_intermediate_size={self.moe_intermediate_size} and model."
          f"decoder_sparse_step={self.decoder_sparse_step} must be positive for qwen3_moe.")

  def is_moe_layer(self, i: int) -> bool:
    """Whether block ``i`` is a sparse (mixture-of-experts) block."""
    return (self.num_experts > 0 and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """Indices of the sparse blocks, in order (``L_moe = len(moe_layers)``)."""
    return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

  @property
  def route_dtype(self):
    """Smallest signed integer dtype holding an expert id (0 .. E-1): int8 up to 128 experts."""
    return jnp.int8 if self.num_experts <= 128 else (
        jnp.int16 if self.num_experts <= 32768 else jnp.int32)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    """Parameter count (without running init)."""
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.qkv_bias else 0)
    attn += 2 * self.head_dim if self.qk_norm else 0
    dense = attn + 3 * d * f + 2 * d
    sparse = attn + 3 * d * self.moe_intermediate_size * self.num_experts + d * self.num_experts
    sparse += 2 * d
    n_moe = len(self.moe_layers)
    head = 0 if self.tie_word_embeddings else d * v
    return v * d + (self.num_layers - n_moe) * dense + n_moe * sparse + d + head


# CPU presets, sized for the bundled 8192-token tokenizer.
_TINY = ModelConfig(
    architecture="qwen3", vocab_size=8192, hidden_size=128, intermediate_size=384,
    num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10_000.0,
    tie_word_embeddings=True, qk_norm=True, max_position_embeddings=4096)
_SMALL = ModelConfig(
    architecture="qwen3", vocab_size=8192, hidden_size=512, intermediate_size=1536,
    num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, rope_theta=10_000.0,
    tie_word_embeddings=True, qk_norm=True, max_position_embeddings=4096)

# Accelerator shape presets (configs only; weights come from HF checkpoints).
_QWEN3 = dict(architecture="qwen3", vocab_size=151936, head_dim=128, rope_theta=1_000_000.0,
              rms_norm_eps=1e-6, qk_norm=True, qkv_bias=False, max_position_embeddings=40960,
              bos_token_id=None, eos_token_id=151645, pad_token_id=151643)
PRESETS: dict[str, ModelConfig] = {
    "tiny": _TINY,
    # ``tiny`` with every MLP a mixture of 8 experts, top-2, each half as wide: the same active
    # MLP parameters per token as ``tiny`` (2 x 192 = 384), for MoE pipeline tests and the
    # MoE-vs-dense benchmark (experiments/benchmarks/moe_throughput.py).
    "tiny-moe": _TINY.replace(architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=192),
    "small": _SMALL,
    "qwen3-0.6b": ModelConfig(**_QWEN3, hidden_size=1024, intermediate_size=3072, num_layers=28,
                              num_heads=16, num_kv_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": ModelConfig(**_QWEN3, hidden_size=2048, intermediate_size=6144, num_layers=28,
                              num_heads=16, num_kv_heads=8, tie_word_embeddings=True),
    "qwen3-4b": ModelConfig(**_QWEN3, hidden_size=2560, intermediate_size=9728, num_layers=36,
                            num_heads=32, num_kv_heads=8, tie_word_embeddings=True),
    "qwen3-8b": ModelConfig(**_QWEN3, hidden_size=4096, intermediate_size=12288, num_layers=36,
                            num_heads=32, num_kv_heads=8, tie_word_embeddings=False),
    "qwen2.5-coder-7b": ModelConfig(
        architecture="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, qkv_bias=True, qk_norm=False, tie_word_embeddings=False,
        max_position_embeddings=32768, eos_token_id=151645, pad_token_id=151643),
    "llama-3.2-1b": ModelConfig(
        architecture="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500_000.0,
        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
        rms_norm_eps=1e-5, qkv_bias=False, qk_norm=False, tie_word_embeddings=True,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128009),
    # Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B's shape): 48 sparse layers, 128 experts, top-8.
    "qwen3-30b-a3b": ModelConfig(
        **{**_QWEN3, "architecture": "qwen3_moe"}, hidden_size=2048, intermediate_size=6144,
        num_layers=48, num_heads=32, num_kv_heads=4, tie_word_embeddings=False, num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
    # SmolLM2-135M-Instruct's shape (weights: models.pretrained "smollm2-135m-instruct").
    "smollm2-135m": ModelConfig(
        architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100_000.0,
        rms_norm_eps=1e-5, qkv_bias=False, qk_norm=False, tie_word_embeddings=True,
        max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2),
}


def get_preset(name: str, **overrides) -> ModelConfig:
  """Returns a preset by name, with optional field overrides."""
  key = name.lower()
  if key not in PRESETS:
    raise errors.ConfigError(f"Unknown model preset {name!r}; known presets: {sorted(PRESETS)}.")
  cfg = PRESETS[key]
  return cfg.replace(**overrides) if overrides else cfg
