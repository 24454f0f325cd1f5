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
import os
import queue
import threading
import time
from typing import Callable, Sequence

import numpy as np

from legorl_jax.proxy.service import derive_seed
from legorl_jax.rl import advantages as adv_lib
from legorl_jax.rewards import status as st
from legorl_jax.rollout import filters
from legorl_jax.trainer import batching
from legorl_jax.rollout.runner import summarize
from legorl_jax.rollout.trial import TrialConfig, TrialResult
from legorl_jax.trainer import config_check, multihost
from legorl_jax.trainer.eval_stats import pass_at_k, solve_stats  # noqa: F401 -- re-exported
from legorl_jax.utils import paths

log = logging.getLogger(__name__)


def grouped_then_plain(seqs, cfg) -> tuple[list[dict[str, np.ndarray]], collections.Counter]:
  """``cfg.trainer.share_prompt`` rows for the sequences that share a prompt, plain
  (``trainer.buckets``) rows for the rest; stats of both, ``shared_*`` for the first."""
  layout = config_check.share_prompt_layout(cfg.trainer.get("share_prompt", ()))
  stats = collections.Counter()
  grouped = []
  if layout is not None:
    p, l, k, rows = layout
    grouped, seqs, gstats = batching.make_grouped_batches(seqs, prefix_len=p, branch_len=l,
                                                          branches=k, rows_per_batch=rows)
    stats["sequences"] += gstats["sequences"]
    stats["tokens"] += gstats["unshared_tokens"]
    stats.update({f"shared_{k}": v for k, v in gstats.items()})
  plain, pstats = batching.make_batches(
      seqs, buckets=tuple(cfg.trainer.buckets), rows_per_batch=int(cfg.trainer.rows_per_batch),
      pack=bool(cfg.trainer.get("pack", False)))
  stats.update(pstats)
  return grouped + plain, stats


def _zero_variance_frac(rewards: np.ndarray, valid: np.ndarray) -> float:
  """Fraction of groups (with any valid trial) whose valid rewards are all equal."""
  flat = []
  for r, v in zip(np.asarray(rewards), np.asarray(valid, bool)):
    if v.any():
      flat.append(float(np.ptp(r[v]) == 0))
  return float(np.mean(flat)) if flat else 0.0


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
  kwargs = config_check.advantage_kwargs(cfg)
  # The filters already applied the group policy (broken groups, stale or dropped trials), so
  # the estimator takes ``valid`` as it is: only invalid trials are left out of the baseline.
  adv, mask = adv_lib.compute_advantages(cfg.advantage.name, grouped.rewards, grouped.valid,
                                         mask_broken_groups=False, **kwargs)
  adv, mask = np.asarray(adv), np.asarray(mask)
  seqs = []
  for gi, group in enumerate(grouped.trials):
    for ti, r in enumerate(group):
      if r is None or mask[gi, ti] == 0:
        continue
      seqs += batching.sequences_from_trajectory(r.trajectory or {}, float(adv[gi, ti]), r.trial_id)
  batches, bstats = grouped_then_plain(seqs, cfg)
  valid = grouped.valid
  metrics = {
      "reward_mean": float(grouped.rewards[valid].mean()) if valid.any() else 0.0,
      # Groups whose valid trials all scored alike carry no group-relative signal.
      "groups_zero_variance_frac": _zero_variance_frac(grouped.rewards, valid),
      "completion_tokens_mean": float(np.mean([r.sampled_tokens for r in results]))
                                if results else 0.0,
      "trials_valid": float(valid.sum()),
      "trials_in_loss": float(mask.sum()),
      "groups_in_loss": float((mask.sum(1) > 0).sum()),
      "advantage_abs_mean": float(np.abs(adv[mask > 0]).mean()) if mask.any() else 0.0,
      "batch_sequences": float(bstats["sequences"]),
      "batch_tokens": float(bstats["tokens"]),
      "batch_truncated": float(bstats["truncated"]),
      "batch_updates": float(len(batches)),
  }
  if "shared_rows" in bstats:
    metrics["batch_shared_sequences"] = float(bstats["shared_sequences"])
    metrics["batch_shared_tokens_computed"] = float(bstats["shared_tokens"])
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
  append_records(path, [r.record() for r in results], **fields)


def rollout_metrics(results: Sequence[TrialResult], wall_s: float) -> dict[str, float]:
  s = summarize(results)
  m = {"solve_rate": s["solve_rate"], "trials": float(s["n_trials"]),
       "rollout_wall_s": wall_s, "trials_per_hour": 3600.0 * s["n_trials"] / max(wall_s, 1e-9),
       "sampled_tokens_per_s": s["sampled_tokens"] / max(wall_s, 1e-9), "mean_turns": s["mean_turns"]}
  for status, c in s["status_counts"].items():
    m[f"status_{status}"] = float(c)
  # Prompt tokens of the trials' sampler calls: served from the engine's prefix cache, and
  # prefilled (every prompt token but the last, which the first decode step feeds).
  calls = [c for r in results for c in (r.trajectory or {}).get("calls", ())]
  m["prompt_tokens_cached"] = float(sum(c["reused_prefix_len"] for c in calls))
  m["prompt_tokens_prefilled"] = float(sum(max(0, len(c["prompt_ids"]) - 1 - c["reused_prefix_len"])
                                           for c in calls))
  for key in ("sandbox_s", "harness_s", "verify_s", "total_s"):
    vals = [r.durations[key] for r in results if key in r.durations]
    if vals:
      m[f"trial_{key}_mean"] = float(np.mean(vals))
  return m


class RolloutSource:
  """Produces one step's trial results: ``tasks_per_step`` tasks x ``samples_per_task``.

  Everything random in a step is a function of (``cfg.seed``, step), never of what this
  process did before, so a run resumed from a checkpoint samples exactly what an uninterrupted
  one would: the harness of each trial (``adapter_for(task, rng=...)`` with a per-step rng) and
  the sampling seed of each trial's proxy session (``trial_seed``). The tasks come from the
  loader, whose position is checkpointed.

  A step directory that already exists belongs to a run stopped during that step: it is
  renamed ``step_NNNNN.interrupted[.k]`` and its trials are appended to ``trials_path`` with
  ``phase="rl_interrupted"`` (``interrupted_records``) before the step runs again.

  With several processes every host draws the same tasks and runs its share of them
  (``multihost.run_shared_trials``); ``collect`` returns this host's results only."""

  def __init__(self, loader, adapter_for: Callable, proxy, trial_cfg: TrialConfig, cfg,
               out_dir: str, progress=None, trials_path: str | None = None):
    self.loader, self.adapter_for, self.proxy = loader, adapter_for, proxy
    self.trial_cfg, self.cfg, self.out_dir, self.progress = trial_cfg, cfg, out_dir, progress
    self.trials_path = trials_path
    self.next_step = 1  # the RL step the next collected batch is for (consumed in order)

  def collect(self) -> tuple[list[TrialResult], float, dict]:
    """Runs the next step's trials; returns (results, wall seconds, loader position after)."""
    n = int(self.cfg.rollout.samples_per_task)
    seed, step = int(self.cfg.seed), self.next_step
    tasks = self.loader.next_batch(int(self.cfg.rollout.tasks_per_step))
    position = self.loader.state_dict()  # where a resumed run continues
    # Every trial's harness, chosen on every host in the same order from the step's rng.
    rng = np.random.default_rng(derive_seed("harness", seed, step))
    adapters = [[self.adapter_for(task, rng=rng) for _ in range(n)] for task in tasks]
    step_dir = os.path.join(self.out_dir, f"step_{step:05d}")
    if os.path.isdir(step_dir):
      cut = interrupted_records(step_dir, tasks)
      log.warning("step %d was cut short by a previous run: %d of its trials set aside in %s",
                  step, len(cut), cut[0]["dir"] if cut else "-")
      if self.trials_path and cut:
        append_records(self.trials_path, cut, step=step, phase="rl_interrupted")
    self.next_step += 1
    t0 = time.perf_counter()
    results = multihost.run_shared_trials(
        tasks, adapters, n, self.proxy, self.trial_cfg, step_dir,
        concurrency=int(self.cfg.rollout.concurrency), max_retries=int(self.cfg.rollout.max_retries),
        on_result=self.progress, seed_of=lambda g, s: trial_seed(seed, step, g, tasks[g].id, s))
    return results, time.perf_counter() - t0, position


def trial_seed(seed: int, step: int, group: int, task_id: str, sample: int) -> int:
  """The proxy-session seed of sample ``sample`` of task ``task_id`` (``group``-th of the step)."""
  return derive_seed("rl", seed, step, group, task_id, sample)


def append_records(path: str, records: Sequence[dict], **fields) -> None:
  paths.append_lines(path, [json.dumps({**r, **fields}) for r in records])


def interrupted_records(step_dir: str, tasks: Sequence) -> list[dict]:
  """Sets aside the directory of a step a stopped run left behind; returns its trials.

  Attempts that finished keep the record they wrote to the step's ``trials.jsonl``; a trial
  directory without a record was running when the run stopped and is recorded as
  ``harness_error`` (an infrastructure status: never scored, never in a loss) with
  ``interrupted: true``. Every record gets ``interrupted: true`` and ``dir`` (the new place).
  """
  dest, k = step_dir + ".interrupted", 1
  while os.path.exists(dest):
    k += 1
    dest = f"{step_dir}.interrupted.{k}"
  os.rename(step_dir, dest)
  records = []
  try:
    with open(os.path.join(dest, "trials.jsonl")) as f:
      for line in f:
        try:
          records.append(json.loads(line))
        except ValueError:  # the line being written when the process died
          continue
  except FileNotFoundError:
    pass
  written = {r.get("trial_id") for r in records}
  task_ids = {t.id.replace("/", "_"): t.id for t in tasks}
  for name in sorted(os.listdir(dest)):
    if name in written or not os.path.isdir(os.path.join(dest, name)):
      continue
    prefix = name.rsplit(".", 1)[0]
    records.append({"trial_id": name, "task_id": task_ids.get(prefix, prefix),
                    "status": st.HARNESS_ERROR, "reward": 0.0, "final": False,
                    "error": "interrupted: the trainer stopped while this trial ran; the step "
                             "was run again"})
  for r in records:
    r.update(interrupted=True, dir=dest)
  return records


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
