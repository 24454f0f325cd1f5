"""Scalar metrics to ``metrics.jsonl`` and TensorBoard event files, from the host only."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Mapping

import numpy as np

log = logging.getLogger(__name__)


def _scalar(v) -> float | None:
  try:
    f = float(np.asarray(v))
  except (TypeError, ValueError):
    return None
  return f


class MetricsWriter:
  """Appends ``{"step": s, "time": t, "phase": ..., **scalars}`` lines to ``DIR/metrics.jsonl``
  and mirrors them as TensorBoard scalars under ``DIR/tb`` (``phase/name`` tags)."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._f = open(self.path, "a", buffering=1)
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tb"))
      except ImportError:
        log.warning("tensorboardX is not installed; writing metrics.jsonl only.")

  def write(self, step: int, scalars: Mapping[str, Any], phase: str = "train"):
    clean = {}
    for k, v in scalars.items():
      f = _scalar(v)
      if f is not None:
        clean[k] = f if math.isfinite(f) else None
    line = {"step": int(step), "time": time.time(), "phase": phase, **clean}
    self._f.write(json.dumps(line) + "\n")
    if self._tb is not None:
      for k, v in clean.items():
        if v is not None:
          self._tb.add_scalar(f"{phase}/{k}", v, int(step))

  def close(self):
    self._f.close()
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  out = []
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        line = line.strip()
        if line:
          try:
            out.append(json.loads(line))
          except ValueError:
            log.warning("skipping a malformed line in %s", path)
  return out
