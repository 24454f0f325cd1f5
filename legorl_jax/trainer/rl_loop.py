"""Harness-native RL: rollouts through a real harness, group advantages, learner updates.

Sync mode alternates a rollout of ``tasks_per_step x samples_per_task`` trials and one update.
Async mode keeps a producer thread rolling out the next step's trials with the parameters it
has while the learner updates; a trial sampled with parameters more than ``max_staleness``
versions old is dropped, and the rest is corrected by TIS/MIS against the recorded logprobs
(``loss.is_correction``). Weight sync hands the sampler a device-side copy of the parameters.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import queue
import threading
import time
from typing import Callable, Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.proxy.service import derive_seed
from legorl_jax.rl import advantages as adv_lib
from legorl_jax.rewards import status as st
from legorl_jax.rollout import filters
from legorl_jax.trainer import batching
from legorl_jax.rollout.runner import summarize
from legorl_jax.rollout.trial import TrialConfig, TrialResult
from legorl_jax.trainer import config_check, multihost, pass_rate_sampler, task_filter
from legorl_jax.trainer.eval_stats import pass_at_k, solve_stats  # noqa: F401 -- re-exported
from legorl_jax.utils import paths

log = logging.getLogger(__name__)


def grouped_then_plain(seqs, cfg) -> tuple[list[dict[str, np.ndarray]], collections.Counter]:
  """``cfg.trainer.share_prompt`` rows for the sequences that share a prompt, plain
  (``trainer.buckets``) rows for the rest; stats of both, ``shared_*`` for the first."""
  layout = config_check.share_prompt_layout(cfg.trainer.get("share_prompt", ()))
  stats = collections.Counter()
  grouped = []
  seqs = list(seqs)
  demo = any(s.demo for s in seqs)  # every batch of the call carries the same keys
  if layout is not None:
    p, l, k, rows = layout
    grouped, seqs, gstats = batching.make_grouped_batches(seqs, prefix_len=p, branch_len=l,
                                                          branches=k, rows_per_batch=rows,
                                                          with_demo=demo)
    stats["sequences"] += gstats["sequences"]
    stats["tokens"] += gstats["unshared_tokens"]
    stats.update({f"shared_{k}": v for k, v in gstats.items()})
  plain, pstats = batching.make_batches(
      seqs, buckets=tuple(cfg.trainer.buckets), rows_per_batch=int(cfg.trainer.rows_per_batch),
      pack=bool(cfg.trainer.get("pack", False)), with_demo=demo)
  stats.update(pstats)
  return grouped + plain, stats


def _zero_variance_frac(rewards: np.ndarray, valid: np.ndarray) -> float:
  """Fraction of groups (with any valid trial) whose valid rewards are all equal."""
  flat = []
  for r, v in zip(np.asarray(rewards), np.asarray(valid, bool)):
    if v.any():
      flat.append(float(np.ptp(r[v]) == 0))
  return float(np.mean(flat)) if flat else 0.0


def build_batches(results: Sequence[TrialResult], cfg, current_version: int,
                  replay: Sequence[batching.TrainSequence] = (), group_sizes: dict | None = None
                  ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
  """Filters, group advantages and batching for one update. Returns (batches, metrics).

  ``replay``: demonstration sequences (``demo_replay.DemoReplay``) laid into the same rows,
  only when some rollout sequence enters the loss (a step with nothing to learn from RL does
  not become an SFT step). ``group_sizes``: {group: trials} where a step's groups differ in
  size (``Collected.group_sizes``); default: every group has ``rollout.samples_per_task``."""
  n = int(cfg.rollout.samples_per_task)
  if group_sizes:
    n = max(n, max(int(v) for v in group_sizes.values()))
  max_stale = cfg.trainer.get("max_staleness", None)
  stale = frozenset(
      r.trial_id for r in results
      if max_stale is not None and r.params_versions
      and current_version - min(r.params_versions) > int(max_stale))
  grouped = filters.prepare_groups(results, n, cfg.rollout, stale=stale, sizes=group_sizes)
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
      if r.trajectory is not None:
        seqs += batching.sequences_from_trajectory(r.trajectory, float(adv[gi, ti]), r.trial_id)
  replayed = list(replay) if seqs else []
  batches, bstats = grouped_then_plain(seqs + replayed, cfg)
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
  if replay:
    metrics["demo_replay_sequences"] = float(len(replayed))
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
  calls = [c for r in results if r.trajectory for c in r.trajectory.calls]
  m["prompt_tokens_cached"] = float(sum(c.reused_prefix_len for c in calls))
  m["prompt_tokens_prefilled"] = float(sum(c.prefilled for c in calls))
  for key in ("sandbox_s", "harness_s", "verify_s", "total_s"):
    vals = [r.durations[key] for r in results if key in r.durations]
    if vals:
      m[f"trial_{key}_mean"] = float(np.mean(vals))
  return m


@dataclasses.dataclass
class Collected:
  """One step's rollouts: this host's ``results``, the rollout's wall seconds, the loader
  ``position`` after the step (with the difficulty filter's state under ``task_filter``: what a
  resumed run continues from) and the draw's ``metrics`` (rounds, tasks drawn, mixed groups,
  tasks passed over)."""

  results: list
  wall_s: float
  position: dict
  metrics: dict
  group_sizes: dict | None = None  # {group: trials} when some groups got more samples


def _mixed(results: Sequence[TrialResult]) -> dict[int, bool]:
  """{group: whether its policy-outcome trials' rewards differ} (a GRPO signal)."""
  by_group = collections.defaultdict(list)
  for r in results:
    if not st.is_infrastructure(r.status):
      by_group[r.group].append(float(r.reward))
  return {g: len(v) > 1 and max(v) > min(v) for g, v in by_group.items()}


def first_draw_tasks(cfg) -> int:
  """Tasks the first draw round of an RL step takes: ``rollout.draw_tasks`` (default
  ``tasks_per_step``) with dynamic sampling, else ``tasks_per_step``."""
  target = int(cfg.rollout.tasks_per_step)
  if int(cfg.rollout.get("max_draw_rounds", 1)) > 1:
    return int(cfg.rollout.get("draw_tasks", 0) or target)
  return target


class RolloutSource:
  """Produces one step's trial results: ``tasks_per_step`` tasks x ``samples_per_task``.

  Dynamic sampling (``rollout.max_draw_rounds`` > 1): a step draws ``rollout.draw_tasks``
  tasks (default ``tasks_per_step``), and while fewer than ``tasks_per_step`` of its groups
  have mixed rewards it draws again (at most that many rounds), sized by the mixed rate seen so
  far. Every trial of every round is kept and recorded; ``rollout.drop_zero_variance`` then
  leaves the uniform groups out of the update. The difficulty filter
  (``rollout.difficulty_filter``, ``task_filter.DifficultyFilter``) passes over drawn tasks
  whose recent pass rate is 0 or 1. ``rollout.sampler = "pass_rate"`` draws bugs by their
  estimated solve rate instead of the loader's order (``pass_rate_sampler``, which absorbs the
  filter); its per-bug visits and rates go to ``OUT_DIR/pass_rate.jsonl`` every step.

  Everything random in a step is a function of (``cfg.seed``, step, round), never of what this
  process did before, so a run resumed from a checkpoint samples exactly what an uninterrupted
  one would: the harness of each trial (``adapter_for(task, rng=...)`` with a per-step rng) and
  the sampling seed of each trial's proxy session (``trial_seed``). The tasks come from the
  loader, whose position (and the filter's memory) is checkpointed.

  A step directory that already exists belongs to a run stopped during that step: it is
  renamed ``step_NNNNN.interrupted[.k]`` and its trials are appended to ``trials_path`` with
  ``phase="rl_interrupted"`` (``interrupted_records``) before the step runs again. Refill
  rounds write into ``step_NNNNN/round_R``.

  With several processes every host draws the same tasks and runs its share of them
  (``multihost.run_shared_trials``); ``collect`` returns this host's results only. Dynamic
  sampling and the filter decide from results, so they are single-process only."""

  def __init__(self, loader, adapter_for: Callable, proxy, trial_cfg: TrialConfig, cfg,
               out_dir: str, progress=None, trials_path: str | None = None):
    self.loader, self.adapter_for, self.proxy = loader, adapter_for, proxy
    self.trial_cfg, self.cfg, self.out_dir, self.progress = trial_cfg, cfg, out_dir, progress
    self.trials_path = trials_path
    self.next_step = 1  # the RL step the next collected batch is for (consumed in order)
    self.max_rounds = max(1, int(cfg.rollout.get("max_draw_rounds", 1)))
    self.filter = (task_filter.DifficultyFilter(int(cfg.rollout.get("difficulty_window", 2)),
                                                int(cfg.rollout.get("difficulty_max_skips", 2)))
                   if cfg.rollout.get("difficulty_filter", False) else None)
    self.sampler = None
    kind = cfg.rollout.get("sampler", "loader")
    if kind == "pass_rate":
      if self.filter is not None:
        raise errors.ConfigError("config rollout.sampler='pass_rate' replaces the difficulty filter; "
                                 "set rollout.difficulty_filter=False.")
      pool = [loader.decode(x) for x in loader.source]
      self.sampler = pass_rate_sampler.PassRateSampler.from_config(pool, cfg)
    elif kind != "loader":
      raise errors.ConfigError(f"config rollout.sampler={kind!r} is invalid; choose 'loader' or "
                               "'pass_rate'.")
    if (self.max_rounds > 1 or self.filter or self.sampler) and multihost.multi_process():
      raise errors.ConfigError("config rollout.max_draw_rounds > 1, rollout.difficulty_filter and "
                               "rollout.sampler='pass_rate' decide from this host's results, so "
                               "they are single-process only; set them to 1 / False / 'loader' on "
                               "a multi-host run.")

  def load_state_dict(self, position: dict) -> None:
    """Continues from ``Collected.position`` (the loader's, with the filter's memory)."""
    self.loader.load_state_dict(position)
    if self.filter is not None:
      self.filter.load_state_dict(position.get("task_filter"))
    if self.sampler is not None:
      self.sampler.load_state_dict(position.get("pass_rate"))

  def _draw(self, n: int, passed: collections.Counter, step: int = 0, round_: int = 0,
            drawn: Sequence = ()) -> list:
    """``n`` tasks: from the pass-rate sampler (bugs not in ``drawn`` this step), or from the
    loader; with the filter, drawn tasks it passes over are skipped (at most ``4 n`` draws,
    then the rest are taken as they come)."""
    if self.sampler is not None:
      return self.sampler.draw(n, step, round_, exclude={task_filter.task_key(t) for t in drawn})
    if self.filter is None:
      return self.loader.next_batch(n)
    out, draws = [], 0
    while len(out) < n:
      task = self.loader.next_batch(1)[0]
      draws += 1
      verdict = self.filter.verdict(task) if draws <= 4 * n else "keep"
      if verdict == "keep":
        out.append(task)
      else:
        self.filter.passed_over(task)
        passed[verdict] += 1
    return out

  def collect(self) -> Collected:
    """Runs the next step's trials (every draw round)."""
    n = int(self.cfg.rollout.samples_per_task)
    target = int(self.cfg.rollout.tasks_per_step)
    per_round = first_draw_tasks(self.cfg)
    seed, step = int(self.cfg.seed), self.next_step
    passed = collections.Counter()
    tasks = self._draw(per_round, passed, step)
    all_tasks = list(tasks)
    step_dir = os.path.join(self.out_dir, f"step_{step:05d}")
    if os.path.isdir(step_dir):
      cut = interrupted_records(step_dir, tasks)
      log.warning("step %d was cut short by a previous run: %d of its trials set aside in %s",
                  step, len(cut), cut[0]["dir"] if cut else "-")
      if self.trials_path and cut:
        append_records(self.trials_path, cut, step=step, phase="rl_interrupted")
    self.next_step += 1
    t0 = time.perf_counter()
    results, drawn, mixed, rounds = [], 0, 0, 0
    sizes = {}  # trials per group (the pass-rate sampler gives bugs near zero more)
    while True:
      # Every trial's harness, chosen on every host in the same order from the round's rng.
      rng = np.random.default_rng(derive_seed("harness", seed, step) if rounds == 0
                                  else derive_seed("harness", seed, step, rounds))
      counts = [self.sampler.samples_for(t, n) if self.sampler else n for t in tasks]
      adapters = [[self.adapter_for(task, rng=rng) for _ in range(k)] for task, k in zip(tasks, counts)]
      offset = drawn
      sizes.update({offset + g: k for g, k in enumerate(counts)})
      res = multihost.run_shared_trials(
          tasks, adapters, n if set(counts) <= {n} else counts, self.proxy, self.trial_cfg,
          step_dir if rounds == 0 else os.path.join(step_dir, f"round_{rounds}"),
          concurrency=int(self.cfg.rollout.concurrency),
          max_retries=int(self.cfg.rollout.max_retries), on_result=self.progress,
          seed_of=lambda g, s, o=offset, ts=tasks: trial_seed(seed, step, g, ts[g - o].id, s),
          group_offset=offset)
      results += res
      drawn, rounds = drawn + len(tasks), rounds + 1
      round_mixed = _mixed(res)
      mixed += sum(round_mixed.values())
      for memory in (self.filter, self.sampler):
        if memory is None:
          continue
        for g, task in enumerate(tasks, start=offset):
          memory.record(task, [int(r.status == st.SOLVED) for r in res
                               if r.group == g and not st.is_infrastructure(r.status)])
      if mixed >= target or rounds >= self.max_rounds:
        break
      need = target - mixed
      rate = max(mixed / drawn, 1.0 / n)  # mixed groups per drawn task, so far this step
      tasks = self._draw(min(per_round, max(need, math.ceil(need / rate))), passed, step, rounds,
                         all_tasks)
      all_tasks += tasks
    position = self.loader.state_dict()
    if self.filter is not None:
      position["task_filter"] = self.filter.state_dict()
    metrics = {"draw_rounds": float(rounds), "tasks_drawn": float(drawn),
               "groups_mixed": float(mixed),
               "tasks_passed_always_solved": float(passed["always_solved"]),
               "tasks_passed_never_solved": float(passed["never_solved"])}
    if self.sampler is not None:
      position["pass_rate"] = self.sampler.state_dict()
      metrics.update(self.sampler.metrics())
      metrics["groups_boosted"] = float(sum(k > n for k in sizes.values()))
      os.makedirs(self.out_dir, exist_ok=True)
      paths.append_lines(os.path.join(self.out_dir, "pass_rate.jsonl"),
                         [json.dumps({"step": step, "bugs": self.sampler.per_bug()})])
    boosted = any(k != n for k in sizes.values())
    return Collected(results, time.perf_counter() - t0, position, metrics,
                     group_sizes=sizes if boosted else None)


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
  ``interrupted: true``. Every record gets ``interrupted: true`` and ``dir`` (the new place:
  the set-aside directory, or its ``round_R`` for a refill round's trial, whose ``task_id``
  falls back to the directory name's prefix when ``tasks``, the step's first draw, lacks it).
  """
  dest, k = step_dir + ".interrupted", 1
  while os.path.exists(dest):
    k += 1
    dest = f"{step_dir}.interrupted.{k}"
  os.rename(step_dir, dest)
  records = []
  task_ids = {t.id.replace("/", "_"): t.id for t in tasks}
  # The step's first draw writes into the step directory, refill rounds into its round_R.
  rounds = [dest] + [os.path.join(dest, d) for d in sorted(os.listdir(dest))
                     if d.startswith("round_") and os.path.isdir(os.path.join(dest, d))]
  for part in rounds:
    found = []
    try:
      with open(os.path.join(part, "trials.jsonl")) as f:
        for line in f:
          try:
            found.append(json.loads(line))
          except ValueError:  # the line being written when the process died
            continue
    except FileNotFoundError:
      pass
    written = {r.get("trial_id") for r in found}
    for name in sorted(os.listdir(part)):
      if name in written or name.startswith("round_") or not os.path.isdir(os.path.join(part, name)):
        continue
      prefix = name.rsplit(".", 1)[0]
      found.append({"trial_id": name, "task_id": task_ids.get(prefix, prefix),
                    "status": st.HARNESS_ERROR, "reward": 0.0, "final": False,
                    "error": "interrupted: the trainer stopped while this trial ran; the step "
                             "was run again"})
    for r in found:
      r["dir"] = part
    records += found
  for r in records:
    r["interrupted"] = True
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


class KLProbe:
  """KL(start policy || current policy), estimated every step on a fixed probe batch.

  The probe is the first RL step's first update batch: tokens the start policy sampled, with
  its teacher-forced logprobs taken before the first update. On them, with d = log pi_now -
  log pi_start per sampled token, ``kl_to_start_k1`` = mean(-d) and ``kl_to_start_k3`` =
  mean(exp(d) - 1 - d) are both estimates of KL(pi_start || pi_now) (k3: never negative, lower
  variance). One forward pass of one batch per step; the probe is saved beside the run
  (``path``), so a resumed run keeps measuring from the same start."""

  def __init__(self, path: str):
    self.path, self.batch, self.start_logp = path, None, None
    if os.path.exists(path):
      with np.load(path) as z:
        self.batch = {k[len("batch/"):]: z[k] for k in z.files if k.startswith("batch/")}
        self.start_logp = z["start_logp"]

  def ensure(self, learner, batches) -> None:
    """Takes ``batches[0]`` as the probe when there is none yet (call before the update)."""
    if self.batch is not None or not batches:
      return
    self.batch = dict(batches[0])
    self.start_logp = learner.logprobs(self.batch)[0]
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    tmp = self.path + ".tmp.npz"
    np.savez(tmp, start_logp=self.start_logp, **{f"batch/{k}": v for k, v in self.batch.items()})
    os.replace(tmp, self.path)

  def measure(self, learner) -> dict[str, float]:
    if self.batch is None:
      return {}
    mask = np.asarray(self.batch["loss_mask"]) > 0
    if "demo_mask" in self.batch:  # replayed demonstrations are not the policy's samples
      mask &= np.asarray(self.batch["demo_mask"]) == 0
    if not mask.any():
      return {}
    d = (learner.logprobs(self.batch)[0] - self.start_logp)[mask].astype(np.float64)
    return {"kl_to_start_k1": float(np.mean(-d)), "kl_to_start_k3": float(np.mean(np.expm1(d) - d))}
