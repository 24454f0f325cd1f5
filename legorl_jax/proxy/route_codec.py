"""Routed experts in trajectories: compact and JSON-safe.

A trajectory is JSON (``trajectory.json``, and the dict the learner batches), and the routes of
a mixture-of-experts segment are ``[T, L_moe, k]`` small integers (``Completion.routes``): as
nested JSON lists that is 3-5 bytes per id plus brackets, for Qwen3-30B-A3B's 384 ids per token
about 1.5 KiB per token. Here they are the array's raw little-endian bytes in base64 with their
dtype and shape: 1.33 bytes per int8 id (512 B per token for Qwen3-30B-A3B, ~16 MiB for a
32K-token trajectory). -1 marks a token without a recorded route (``sampling.params``).
"""

from __future__ import annotations

import base64

import numpy as np

from legorl_jax import errors

DTYPES = ("int8", "int16", "int32")


def encode(routes: np.ndarray) -> dict:
  """int ``[T, L_moe, k]`` -> ``{"dtype", "shape", "data"}`` (base64 of the raw bytes)."""
  a = np.asarray(routes)
  if a.ndim != 3 or a.dtype.name not in DTYPES:
    raise errors.RolloutError(f"routes must be an {DTYPES} array [T, L_moe, k]; got "
                              f"{a.dtype} of shape {a.shape}.")
  data = np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
  return {"dtype": a.dtype.name, "shape": list(a.shape), "data": base64.b64encode(data).decode()}


def decode(obj, where: str = "routed_experts") -> np.ndarray:
  """``encode``'s dict -> the int array ``[T, L_moe, k]``; a malformed record raises
  RolloutError naming ``where`` (e.g. the segment it came from)."""
  def bad(why):
    raise errors.RolloutError(f"{where}: {why}; it must be the dict route_codec.encode writes "
                              "({'dtype', 'shape', 'data'}), or absent.")
  if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "data"}:
    bad("not a routes record")
  if obj["dtype"] not in DTYPES:
    bad(f"dtype {obj['dtype']!r} is not one of {DTYPES}")
  shape = obj["shape"]
  if (not isinstance(shape, list) or len(shape) != 3
      or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
    bad(f"shape {shape!r} is not three non-negative ints [T, L_moe, k]")
  if not isinstance(obj["data"], str):
    bad("data is not a base64 string")
  try:
    raw = base64.b64decode(obj["data"], validate=True)
  except ValueError:
    bad("data is not valid base64")
  dtype = np.dtype(obj["dtype"]).newbyteorder("<")
  if len(raw) != int(np.prod(shape)) * dtype.itemsize:
    bad(f"data holds {len(raw)} bytes, shape {shape} of {obj['dtype']} needs "
        f"{int(np.prod(shape)) * dtype.itemsize}")
  return np.frombuffer(raw, dtype).astype(obj["dtype"]).reshape(shape)
