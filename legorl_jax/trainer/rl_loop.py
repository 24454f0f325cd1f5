"""Harness-native RL: rollouts through a real harness, group advantages, learner updates.

Sync mode alternates a rollout of ``tasks_per_step x samples_per_task`` trials and one update.
Async mode keeps a producer thread rolling out the next step's trials with the parameters it
has while the learner updates; a trial sampled with parameters more than ``max_staleness``
versions old is dropped, and the rest is corrected by TIS/MIS against the recorded logprobs
(``loss.is_correction``). Weight sync hands the sampler a device-side copy of the parameters.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import queue
import threading
import time
from typing import Callable, Sequence

import numpy as np

from legorl_jax.rl import advantages as adv_lib
from legorl_jax.rewards import status as st
from legorl_jax.rollout import batching, filters
from legorl_jax.rollout.runner import summarize
from legorl_jax.rollout.trial import TrialConfig, TrialResult
from legorl_jax.trainer import multihost
from legorl_jax.utils import paths

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
  if n - c < k:
    return 1.0
  return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def solve_stats(results: Sequence[TrialResult], k_values=(1,)) -> dict[str, float]:
  """Solve rate over policy outcomes plus pass@k per task."""
  by_task = collections.defaultdict(list)
  for r in results:
    if not st.is_infrastructure(r.status):
      by_task[r.task_id].append(r.status == st.SOLVED)
  out = {"solve_rate": float(np.mean([x for v in by_task.values() for x in v])) if by_task else 0.0,
         "n_tasks": len(by_task), "n_trials": sum(len(v) for v in by_task.values())}
  for k in k_values:
    vals = [pass_at_k(len(v), sum(v), k) for v in by_task.values() if len(v) >= k]
    if vals:
      out[f"pass@{k}"] = float(np.mean(vals))
  return out


def build_batches(results: Sequence[TrialResult], cfg, current_version: int
                  ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
  """Filters, group advantages and batching for one update. Returns (batches, metrics)."""
  n = int(cfg.rollout.samples_per_task)
  max_stale = cfg.trainer.get("max_staleness", None)
  stale = frozenset(
      r.trial_id for r in results
      if max_stale is not None and r.params_versions
      and current_version - min(r.params_versions) > int(max_stale))
  grouped = filters.prepare_groups(results, n, cfg.rollout, stale=stale)
  adv, mask = adv_lib.compute_advantages(cfg.advantage.name, grouped.rewards, grouped.valid,
                                         **dict(cfg.advantage.get("kwargs", {})))
  adv, mask = np.asarray(adv), np.asarray(mask)
  seqs = []
  for gi, group in enumerate(grouped.trials):
    for ti, r in enumerate(group):
      if r is None or mask[gi, ti] == 0:
        continue
      seqs += batching.sequences_from_trajectory(r.trajectory or {}, float(adv[gi, ti]), r.trial_id)
  batches, bstats = batching.make_batches(
      seqs, buckets=tuple(cfg.trainer.buckets), rows_per_batch=int(cfg.trainer.rows_per_batch),
      pack=bool(cfg.trainer.get("pack", False)))
  valid = grouped.valid
  metrics = {
      "reward_mean": float(grouped.rewards[valid].mean()) if valid.any() else 0.0,
      "trials_valid": float(valid.sum()),
      "trials_in_loss": float(mask.sum()),
      "groups_in_loss": float((mask.sum(1) > 0).sum()),
      "advantage_abs_mean": float(np.abs(adv[mask > 0]).mean()) if mask.any() else 0.0,
      "batch_sequences": float(bstats["sequences"]),
      "batch_tokens": float(bstats["tokens"]),
      "batch_truncated": float(bstats["truncated"]),
      "batch_updates": float(len(batches)),
  }
  for k, v in grouped.dropped.items():
    metrics[f"dropped_{k}"] = float(v)
  if max_stale is not None:
    ages = [current_version - min(r.params_versions) for r in results if r.params_versions]
    metrics["staleness_mean"] = float(np.mean(ages)) if ages else 0.0
    metrics["staleness_max"] = float(np.max(ages)) if ages else 0.0
    metrics["staleness_count"] = float(len(ages))
  return batches, metrics


def append_trials(path: str, results: Sequence[TrialResult], **fields) -> None:
  """Appends the final record of each trial, tagged with ``fields`` (e.g. step, phase);
  ``path`` may be remote (``gs://``)."""
  paths.append_lines(path, [json.dumps({**r.record(), **fields}) for r in results])


def rollout_metrics(results: Sequence[TrialResult], wall_s: float) -> dict[str, float]:
  s = summarize(results)
  m = {"solve_rate": s["solve_rate"], "trials": float(s["n_trials"]),
       "rollout_wall_s": wall_s, "trials_per_hour": 3600.0 * s["n_trials"] / max(wall_s, 1e-9),
       "sampled_tokens_per_s": s["sampled_tokens"] / max(wall_s, 1e-9), "mean_turns": s["mean_turns"]}
  for status, c in s["status_counts"].items():
    m[f"status_{status}"] = float(c)
  for key in ("sandbox_s", "harness_s", "verify_s", "total_s"):
    vals = [r.durations[key] for r in results if key in r.durations]
    if vals:
      m[f"trial_{key}_mean"] = float(np.mean(vals))
  return m


class RolloutSource:
  """Produces one step's trial results: ``tasks_per_step`` tasks x ``samples_per_task``.

  With several processes every host draws the same tasks and runs its share of them
  (``multihost.run_shared_trials``); ``collect`` returns this host's results only."""

  def __init__(self, loader, adapter_for: Callable, proxy, trial_cfg: TrialConfig, cfg,
               out_dir: str, progress=None):
    self.loader, self.adapter_for, self.proxy = loader, adapter_for, proxy
    self.trial_cfg, self.cfg, self.out_dir, self.progress = trial_cfg, cfg, out_dir, progress
    self.next_step = 1  # the RL step the next collected batch is for (consumed in order)

  def collect(self) -> tuple[list[TrialResult], float, dict]:
    """Runs the next step's trials; returns (results, wall seconds, loader position after)."""
    n = int(self.cfg.rollout.samples_per_task)
    tasks = self.loader.next_batch(int(self.cfg.rollout.tasks_per_step))
    position = self.loader.state_dict()  # where a resumed run continues
    # Every trial's harness, chosen on every host in the same order (a seeded chooser).
    adapters = [[self.adapter_for(task) for _ in range(n)] for task in tasks]
    t0 = time.perf_counter()
    step_dir = os.path.join(self.out_dir, f"step_{self.next_step:05d}")
    self.next_step += 1
    results = multihost.run_shared_trials(tasks, adapters, n, self.proxy, self.trial_cfg, step_dir,
                                          concurrency=int(self.cfg.rollout.concurrency),
                                          max_retries=int(self.cfg.rollout.max_retries),
                                          on_result=self.progress)
    return results, time.perf_counter() - t0, position


class AsyncRollouts:
  """Runs ``source.collect()`` on a producer thread, at most ``ahead`` steps in advance."""

  def __init__(self, source: RolloutSource, ahead: int = 1):
    self.source = source
    self._q: queue.Queue = queue.Queue(maxsize=max(1, ahead))
    self._stop = threading.Event()
    self._error: list[BaseException] = []
    self._thread = threading.Thread(target=self._run, name="legorl-rollouts", daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.is_set():
      try:
        item = self.source.collect()
      except BaseException as e:  # noqa: BLE001 -- surfaced to the learner thread
        self._error.append(e)
        self._q.put(None)
        return
      while not self._stop.is_set():
        try:
          self._q.put(item, timeout=0.5)
          break
        except queue.Full:
          continue

  def get(self):
    item = self._q.get()
    if item is None and self._error:
      raise self._error[0]
    return item

  def close(self):
    self._stop.set()
    try:
      while True:
        self._q.get_nowait()
    except queue.Empty:
      pass
    self._thread.join(timeout=600)
