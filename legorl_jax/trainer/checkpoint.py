"""Orbax checkpoints of the learner state plus host-side JSON (data position, counters).

Saves are asynchronous; ``keep`` bounds how many recent steps stay and ``best_metric`` keeps
the best one as well. Paths may be local or ``gs://``.

A save that fails (disk full, quota, permissions) raises ``CheckpointError`` — from ``save``,
or for an async save from the next ``wait``/``save``/``close`` — and its partial directory is
removed, so earlier checkpoints stay the readable latest ones and the space comes back.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from legorl_jax import errors
from legorl_jax.trainer.state import TrainState


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` with items ``state`` (pytree) and ``host`` (JSON)."""

  def __init__(self, directory: str, *, keep: int = 3, best_metric: str | None = None,
               best_mode: str = "max", async_save: bool = True):
    self.directory = epath.Path(directory)
    self.best_metric = best_metric
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        best_fn=(lambda m: float(m[best_metric])) if best_metric else None,
        best_mode=best_mode,
        keep_checkpoints_without_metrics=True,
        enable_async_checkpointing=async_save,
        create=True,
        cleanup_tmp_directories=True,  # partial saves of a killed run
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: TrainState, host: dict[str, Any] | None = None,
           metrics: dict[str, float] | None = None, force: bool = False) -> bool:
    """Starts an (async) save; returns whether a save was started."""
    if self.best_metric and (not metrics or self.best_metric not in metrics):
      metrics = None  # kept as a checkpoint without a metric
    try:
      return self._manager.save(
          step,
          args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  host=ocp.args.JsonSave(host or {})),
          metrics=metrics, force=force)
    except Exception as e:  # noqa: BLE001 -- OSError, tensorstore's ValueError, ...
      raise self._failed(step, e) from e

  def wait(self):
    """Blocks until pending async saves are on disk (raises CheckpointError if one failed)."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001
      raise self._failed(None, e) from e

  def _failed(self, step: int | None, e: Exception) -> errors.CheckpointError:
    """Removes partial save directories and names the problem and the fix."""
    removed = []
    try:
      for p in self.directory.iterdir():
        if ".orbax-checkpoint-tmp" in p.name:
          p.rmtree()
          removed.append(p.name)
    except Exception as ce:  # noqa: BLE001 -- best effort; the next manager cleans up too
      logging.warning("could not remove partial checkpoint under %s: %s", self.directory, ce)
    what = f"step {step}" if step is not None else "a pending async save"
    full = "No space left" in str(e) or "RESOURCE_EXHAUSTED" in str(e)
    return errors.CheckpointError(
        f"Could not write checkpoint {what} under {self.directory}: {type(e).__name__}: "
        f"{str(e)[:500]}. " + ("The disk is full: free space or point --workdir at a larger "
                               "volume. " if full else "") +
        f"Earlier checkpoints are intact (latest: {self.latest_step()}); partial save removed: "
        f"{removed or 'none'}.")

  def restore(self, abstract_state: TrainState, step: int | None = None,
              ) -> tuple[TrainState, dict[str, Any], int]:
    """Restores ``(state, host, step)`` into the shardings of ``abstract_state``.

    ``abstract_state`` leaves may be arrays or ``jax.ShapeDtypeStruct`` with ``sharding`` set.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise errors.CheckpointError(f"No checkpoint found under {self.directory}.")
    target = jax.tree.map(
        lambda x: x if isinstance(x, jax.ShapeDtypeStruct)
        else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        abstract_state)
    try:
      restored = self._manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                        host=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises several types for unreadable/mismatched data
      raise errors.CheckpointError(
          f"Could not restore checkpoint step {step} from {self.directory}: {e}") from e
    logging.info("Restored checkpoint step %d from %s", step, self.directory)
    return restored.state, dict(restored.host or {}), step

  def close(self):
    try:
      self.wait()
    finally:
      self._manager.close()
