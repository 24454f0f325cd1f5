"""Rotary position embeddings (RoPE) of the decoder family, with Llama 3's frequency scaling.

The frequencies are a NumPy constant computed at trace time from the config; the rotation
runs in float32 whatever the compute dtype, with the half-split convention of Hugging Face's
implementations (so imported checkpoints need no permutation).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from legorl_jax.models.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """Inverse RoPE frequencies ``[D_head // 2]`` float32, with optional Llama-3 scaling."""
  d = config.head_dim
  inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
  sc = config.rope_scaling
  if sc:
    factor = float(sc["factor"])
    lo, hi = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old = float(sc["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    inv = np.where(medium, smoothed, scaled)
  return inv.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotates ``x [B, T, H, Dh]`` by ``positions [B, T]`` (half-split convention, as HF)."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, Dh/2]
  cos = jnp.cos(freqs)[:, :, None, :]
  sin = jnp.sin(freqs)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
