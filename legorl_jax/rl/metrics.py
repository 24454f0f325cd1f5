"""Masked per-step statistics that merge exactly across micro-batches.

A metrics dict is flat ``{name: f32 scalar}`` and a key's suffix says how it merges:

* ``tokens``, ``seqs``: counts, summed.
* ``*_sum``: a sum over counted tokens, summed; ``finalize_metrics`` turns ``x_sum`` into
  the exact mean ``x = x_sum / tokens``.
* ``*_max``: maxima, merged by max.
* ``*_p99``: per-micro-batch 99th percentiles, merged by max. Percentiles are observed
  values (``masked_quantile``: the lowest one with the wanted share at or below it), so the
  max over micro-batches is an upper bound of the full batch's p99 and equals it when there
  is one micro-batch. (With interpolated percentiles it is not: two halves ``[0, 1]`` have p99
  0.99 each, their union ``[0, 0, 1, 1]`` has 1.0.)

``merge_metrics`` is jittable (use it inside a scan over micro-batches);
``finalize_metrics`` runs once per step before logging.
"""

from typing import Dict, Mapping

import jax
import jax.numpy as jnp

Array = jax.Array
Metrics = Dict[str, Array]

_COUNTS = ("tokens", "seqs")


def _is_max(key: str) -> bool:
  return key.endswith("_max") or key.endswith("_p99")


def masked_sum(x: Array, mask: Array) -> Array:
  """Scalar: sum of x [B, T] over mask > 0."""
  return jnp.sum(jnp.where(mask > 0, x, 0.0))


def masked_max(x: Array, mask: Array) -> Array:
  """Scalar: max of x over mask > 0 (-inf when nothing is counted)."""
  return jnp.max(jnp.where(mask > 0, x, -jnp.inf))


def masked_quantile(x: Array, mask: Array, q: float) -> Array:
  """Scalar: q-quantile of x over mask > 0, NumPy's ``method="higher"`` (the order statistic
  at index ``ceil(q (n - 1))``, never an interpolation); -inf when empty."""
  flat = jnp.where(mask > 0, x, jnp.nan).reshape(-1).astype(jnp.float32)
  out = jnp.nanquantile(flat, q, method="higher")
  return jnp.where(jnp.any(mask > 0), out, -jnp.inf)


def merge_metrics(a: Mapping[str, Array], b: Mapping[str, Array]) -> Metrics:
  """Merges two metrics dicts with the same keys (see module docstring for the rules)."""
  out = {}
  for k in a:
    out[k] = jnp.maximum(a[k], b[k]) if _is_max(k) else a[k] + b[k]
  return out


def finalize_metrics(m: Mapping[str, Array]) -> Metrics:
  """Turns ``x_sum`` entries into token means ``x``; keeps counts, maxima and p99 as is."""
  out = {}
  tokens = jnp.maximum(m["tokens"], 1.0) if "tokens" in m else 1.0
  for k, v in m.items():
    if k.endswith("_sum"):
      out[k[:-len("_sum")]] = v / tokens
    else:
      out[k] = v
  return out
