"""Naive NumPy references for the sampler tests (float64, written for clarity, not speed)."""

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def allowed_set(logits: np.ndarray, temperature: float, top_p: float, top_k: int) -> set[int]:
  """Tokens a top-k-then-top-p sampler may draw from one row of logits [V]."""
  z = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-z, kind="stable")
  if top_k > 0:
    order = order[:top_k]
  p = np.exp(z[order] - z[order].max())
  p /= p.sum()
  if top_p >= 1.0:
    return set(order.tolist())
  n = int(np.searchsorted(np.cumsum(p), top_p)) + 1  # smallest prefix with mass >= top_p
  return set(order[:n].tolist())
