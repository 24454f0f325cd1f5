"""Scalar metrics to ``metrics.jsonl`` and TensorBoard event files, from the host only.

The workdir may be local or remote (``gs://``, see ``legorl_jax.utils.paths``). In a
multi-host run only process 0 writes (``primary=False`` elsewhere makes the writer inert).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import Any, Mapping

import numpy as np

from legorl_jax.utils import paths

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

  def __init__(self, workdir: str, tensorboard: bool = True, primary: bool = True):
    self.path = paths.join(workdir, "metrics.jsonl")
    self._f = None
    self._tb = None
    if not primary:
      return
    paths.makedirs(workdir)
    self._f = paths.AppendFile(self.path)
    if tensorboard and paths.is_remote(workdir):
      # tensorboardX writes gs:// only with extra (TensorFlow/boto) dependencies; the JSONL
      # log is the record of the run and TensorBoard can read a local copy of it later.
      log.warning("remote workdir %s: TensorBoard events are not written (metrics.jsonl is).",
                  workdir)
    elif tensorboard:
      try:
        self._tb = _summary_writer_class()(paths.join(workdir, "tb"))
      except ImportError:
        log.warning("tensorboardX is not installed; writing metrics.jsonl only.")

  def write(self, step: int, scalars: Mapping[str, Any], phase: str = "train"):
    clean = {}
    for k, v in scalars.items():
      f = _scalar(v)
      if f is not None:
        clean[k] = f if math.isfinite(f) else None
    if self._f is None:
      return
    line = {"step": int(step), "time": time.time(), "phase": phase, **clean}
    self._f.write(json.dumps(line) + "\n")
    if self._tb is not None:
      for k, v in clean.items():
        if v is not None:
          self._tb.add_scalar(f"{phase}/{k}", v, int(step))

  def close(self):
    if self._f is not None:
      self._f.close()
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  """The rows of ``DIR/metrics.jsonl``, one per (phase, step): the last one written.

  A run killed after logging a step but before checkpointing it redoes that step when it
  resumes, so the file can hold a step twice; the later row is the one the run continued from.
  Rows are returned in the order their final versions were written."""
  path = paths.join(workdir, "metrics.jsonl")
  rows: dict = {}
  if paths.exists(path):
    with paths.open_file(path) as f:
      for i, line in enumerate(f):
        line = line.strip()
        if line:
          try:
            row = json.loads(line)
          except ValueError:
            log.warning("skipping a malformed line in %s", path)
            continue
          key = (row.get("phase"), row["step"]) if isinstance(row, dict) and "step" in row else i
          rows.pop(key, None)  # re-insert: dict order becomes the order of last writes
          rows[key] = row
  return list(rows.values())


def _summary_writer_class():
  """``tensorboardX.SummaryWriter``, imported without PyTorch.

  tensorboardX imports torch at import time when it is installed (``transformers`` brings it
  here), only to accept torch tensors; we log Python floats. That import cost every run and
  every test subprocess ~0.9 CPU-s and ~180 MB (measured: 1.2 -> 0.3 CPU-s, 230 -> 48 MB peak
  for the import alone), so torch is hidden from it (``sys.modules[name] = None`` makes
  ``import torch`` raise ImportError, which tensorboardX catches) unless it is loaded already.
  torch stays importable afterwards.
  """
  hidden = "torch" not in sys.modules
  if hidden:
    sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    from tensorboardX import SummaryWriter
  finally:
    if hidden:
      del sys.modules["torch"]
  return SummaryWriter
