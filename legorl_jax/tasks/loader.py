"""Deterministic, resumable iteration over a task dataset.

Each epoch visits every task once in an order fixed by (seed, epoch). The position
(epoch, index) is the loader's whole state: ``state_dict()`` goes into the trainer's
checkpoint and ``load_state_dict()`` resumes with the next task, not the first.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np

from legorl_jax.errors import TaskError, TaskValidationError
from legorl_jax.tasks.schema import Task

log = logging.getLogger(__name__)


class TaskLoader:
  """Batches of Tasks from a random-access source (a list of Tasks or an array_record source).

  ``decode`` turns a source item into a Task (``tfds_builder.record_to_task`` for TFDS
  records; identity for lists). Items that fail to decode are skipped and counted in
  ``errors``, so one bad record never stops a run.
  """

  def __init__(self, source: Sequence[Any], *, seed: int = 0, shuffle: bool = True,
               decode: Callable[[Any], Task] | None = None):
    if len(source) == 0:
      raise TaskError("the task source is empty")
    self.source, self.seed, self.shuffle = source, seed, shuffle
    self.decode = decode or (lambda x: x)
    self.epoch, self.index = 0, 0
    self.errors: list[str] = []
    self._order_epoch, self._order = None, None

  @classmethod
  def from_tfds(cls, dataset_dir: str, split: str = "train", **kwargs) -> "TaskLoader":
    from legorl_jax.tasks import tfds_builder
    return cls(tfds_builder.open_task_source(dataset_dir, split), decode=tfds_builder.record_to_task, **kwargs)

  def __len__(self) -> int:
    return len(self.source)

  def order(self, epoch: int) -> np.ndarray:
    """int64[len] permutation of record indices for ``epoch``."""
    if self._order_epoch != epoch:
      n = len(self.source)
      self._order = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                     else np.arange(n))
      self._order_epoch = epoch
    return self._order

  def next_batch(self, n: int) -> list[Task]:
    """The next ``n`` tasks, crossing into the next epoch when this one runs out."""
    out, attempts = [], 0
    while len(out) < n:
      if self.index >= len(self.source):
        self.epoch, self.index = self.epoch + 1, 0
      i = int(self.order(self.epoch)[self.index])
      self.index += 1
      attempts += 1
      try:
        out.append(self.decode(self.source[i]))
      except (TaskValidationError, TaskError, ValueError, KeyError) as e:
        self.errors.append(f"record {i}: {e}")
        log.warning("skipping task record %d: %s", i, e)
        if attempts > 2 * len(self.source) + n and not out:
          raise TaskError(f"no decodable task in the source; last error: {e}") from e
    return out

  def state_dict(self) -> dict[str, int]:
    return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "size": len(self.source)}

  def load_state_dict(self, state: dict[str, int]) -> None:
    if int(state.get("size", len(self.source))) != len(self.source) or int(state.get("seed", self.seed)) != self.seed:
      raise TaskError(f"loader state {state} does not match this dataset (size {len(self.source)}, "
                      f"seed {self.seed}); resume with the same dataset and seed")
    self.epoch, self.index = int(state["epoch"]), int(state["index"])
