"""Dequantization of GGUF tensor data to float32, in vectorised numpy (no torch, no llama.cpp).

GGUF stores a tensor as a run of fixed-size blocks, each holding ``block_size`` values in
``type_size`` bytes (``gguf.GGML_QUANT_SIZES``). Each function here takes the blocks as a
``uint8 [n_blocks, type_size]`` array and returns ``float32 [n_blocks, block_size]``, following
the block layouts of ggml (``ggml-quants.c``):

- Q8_0 (32 values): f16 scale ``d``, 32 int8 ``q``; ``x = d * q``.
- Q4_0 (32): f16 ``d``, 16 bytes of nibbles (low nibbles are values 0-15, high ones 16-31);
  ``x = d * (q - 8)``.
- Q4_1 (32): f16 ``d``, f16 ``m``, 16 bytes of nibbles; ``x = d * q + m``.
- Q4_K (256): f16 ``d``, f16 ``dmin``, 12 bytes packing eight 6-bit (scale, min) pairs, 128
  bytes of nibbles in four 64-value chunks (low nibbles first); ``x = d*sc*q - dmin*mn``.
- Q6_K (256): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one per
  16 values), f16 ``d``; ``x = d * sc * (q - 32)``.

F32 / F16 / BF16 are plain element arrays. ``gguf.quants.dequantize`` is the reference the
tests compare against; it is not used here so the import does not depend on its internals.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from legorl_jax import errors

Q = GGMLQuantizationType


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
  """The f16 at byte ``start`` of each block, as float32 ``[n, 1]``."""
  return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _q8_0(blocks):
  d = _f16(blocks, 0)
  return d * blocks[:, 2:].view(np.int8).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
  """``uint8 [n, 16]`` -> values ``[n, 32]``: the low nibbles, then the high ones."""
  return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)


def _q4_0(blocks):
  return _f16(blocks, 0) * (_nibbles(blocks[:, 2:18]) - 8.0)


def _q4_1(blocks):
  return _f16(blocks, 0) * _nibbles(blocks[:, 4:20]) + _f16(blocks, 2)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """12 packed bytes -> eight 6-bit scales and eight 6-bit mins, each ``[n, 8]``.

  Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales and mins 4-7 take
  their low 4 bits from bytes 8-11 (low / high nibble) and their top 2 bits from the spare top
  bits of bytes 0-3 (scales) and 4-7 (mins).
  """
  a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
  scales = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
  mins = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
  return scales.astype(np.float32), mins.astype(np.float32)


def _q4_k(blocks):
  n = blocks.shape[0]
  d, dmin = _f16(blocks, 0), _f16(blocks, 2)
  sc, mn = _k_scales(blocks[:, 4:16])
  qs = blocks[:, 16:144].reshape(n, 4, 1, 32)
  q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
  out = (d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]
  return out.reshape(n, 256)


_Q6_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)


def _q6_k(blocks):
  n = blocks.shape[0]
  ql = blocks[:, 0:128].reshape(n, 2, 2, 32)  # [half, first/second 32 bytes, 32]
  qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
  sc = blocks[:, 192:208].view(np.int8).astype(np.float32)  # one scale per 16 values
  d = _f16(blocks, 208)
  # Each 128-value half: values 0-63 are the low nibbles of its 64 ql bytes, 64-127 the high
  # nibbles; value group k (of 32) takes its top two bits from bits 2k..2k+1 of the qh bytes.
  low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [n, 2, 4, 32]
  high = (qh >> _Q6_SHIFTS) & 3
  q = ((low | (high << 4)).astype(np.int16) - 32).reshape(n, 16, 16).astype(np.float32)
  return (d[:, :, None] * sc[:, :, None] * q).reshape(n, 256)


def _bf16(blocks):
  return (blocks.copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)


_BLOCK_FNS = {Q.Q8_0: _q8_0, Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q4_K: _q4_k, Q.Q6_K: _q6_k,
              Q.BF16: _bf16}
SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")


def dequantize(data: np.ndarray, qtype: GGMLQuantizationType | int, shape: tuple[int, ...],
               name: str = "tensor") -> np.ndarray:
  """GGUF tensor data -> float32 array of numpy ``shape`` (GGUF's dims reversed).

  Args:
    data: what ``gguf.GGUFReader`` exposes as ``tensor.data``: float32 / float16 elements for
      F32 / F16, raw ``uint8`` bytes for BF16 and the block-quantized types.
    qtype: the tensor's ``GGMLQuantizationType``.
    shape: the numpy shape, e.g. ``(out_features, in_features)`` for a linear weight.
    name: tensor name, for error messages.
  """
  qtype = Q(int(qtype))
  if qtype == Q.F32:
    return np.asarray(data, dtype=np.float32).reshape(shape)
  if qtype == Q.F16:
    return np.asarray(data).view(np.float16).astype(np.float32).reshape(shape)
  fn = _BLOCK_FNS.get(qtype)
  if fn is None:
    raise errors.CheckpointError(
        f"GGUF tensor {name!r} is quantized as {qtype.name}, which this importer does not read; "
        f"supported types: {', '.join(SUPPORTED)}. Re-quantize the file with llama.cpp's "
        "llama-quantize (e.g. to Q8_0 or Q4_K_M) or convert the original checkpoint instead.")
  block_size, type_size = GGML_QUANT_SIZES[qtype]
  raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
  n_values = int(np.prod(shape))
  if n_values % block_size or raw.size != n_values // block_size * type_size:
    raise errors.CheckpointError(
        f"GGUF tensor {name!r} ({qtype.name}, shape {shape}) holds {raw.size} bytes; expected "
        f"{n_values // block_size * type_size} ({type_size} per block of {block_size} values). "
        "The file is truncated or corrupt.")
  return fn(raw.reshape(-1, type_size)).reshape(shape)
