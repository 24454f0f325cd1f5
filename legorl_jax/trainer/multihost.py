"""The RL loop across hosts: each host's share of the trials, one global batch per update.

Every process runs the same loop. For a step's (or an evaluation's) task list, which every
host draws identically from the seeded loader, process ``i`` runs the trials of
``distributed.host_share`` of the tasks: whole GRPO groups, so advantages need nothing from
the other hosts. Trial *records* (no token ids) are gathered to every host, so metrics,
solve rates and ``trials.jsonl`` (written by process 0) cover the whole step. The token rows
stay where they were sampled: each host packs its own trials into batches of its share of
``trainer.rows_per_batch``, the hosts agree on how many batches of which length the step has
(padding with empty batches), and ``GlobalUpdater`` assembles each global batch with
``jax.make_array_from_process_local_data`` and applies the sharded update.

In one process all of this reduces to the single-host path: the share is every task and the
gathers return the local values.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable, Sequence

import jax
import numpy as np

from legorl_jax import errors
from legorl_jax.trainer import batching
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.sharding import distributed
from legorl_jax.trainer import train_step as ts
from legorl_jax.trainer.learner import merge_update_metrics

_FLOAT_KEYS = ("loss_mask", "advantages", "rollout_logp", "old_logp", "demo_mask")
_TRIAL_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialResult)) - {"trajectory"}


def multi_process() -> bool:
  return jax.process_count() > 1


# -- host <-> host exchange of small host values --------------------------------------------------

def gather_objects(obj) -> list:
  """Every process's JSON-serialisable ``obj``, in process order (a collective: all processes
  must call it at the same point). One process: ``[obj]``."""
  if not multi_process():
    return [obj]
  from jax.experimental import multihost_utils
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
  buf = np.zeros(int(sizes.max()), np.uint8)
  buf[:data.size] = data
  every = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)
  return [json.loads(every[i, :sizes[i]].tobytes().decode()) for i in range(len(sizes))]


def gather_results(results: Sequence[TrialResult]) -> list[TrialResult]:
  """All hosts' trial results in process order, as records (``trajectory`` is None for the
  other hosts' trials). One process: ``results`` itself."""
  if not multi_process():
    return list(results)
  every = gather_objects([r.record() for r in results])
  mine = jax.process_index()
  out = []
  for i, records in enumerate(every):
    if i == mine:
      out += list(results)
    else:
      out += [TrialResult(**{k: v for k, v in rec.items() if k in _TRIAL_FIELDS}) for rec in records]
  return out


def reduce_batch_metrics(local: dict[str, float], n_updates: int) -> dict[str, float]:
  """``rl_loop.build_batches`` metrics of every host combined into the step's: counts add,
  means are weighted by their counts, maxima take the maximum."""
  every = gather_objects(local)
  if len(every) == 1:
    return dict(local, batch_updates=float(n_updates))
  weights = {"reward_mean": "trials_valid", "advantage_abs_mean": "trials_in_loss",
             "staleness_mean": "staleness_count"}
  keys = sorted({k for m in every for k in m})
  out = {}
  for k in keys:
    vals = [m.get(k, 0.0) for m in every]
    if k in weights:
      w = [m.get(weights[k], 0.0) for m in every]
      out[k] = float(np.dot(vals, w) / sum(w)) if sum(w) else 0.0
    elif k.endswith("_max"):
      out[k] = float(max(vals))
    else:
      out[k] = float(sum(vals))
  out["batch_updates"] = float(n_updates)
  return out


# -- the host's share of the trials ---------------------------------------------------------------

def run_shared_trials(tasks: Sequence, adapters: Sequence, samples: int | Sequence[int], proxy,
                      trial_cfg,
                      out_dir: str, *, concurrency: int, max_retries: int,
                      on_result: Callable | None = None,
                      seed_of: Callable[[int, int], int] | None = None,
                      group_offset: int = 0) -> list[TrialResult]:
  """Runs ``samples`` trials of each task (or ``samples[i]`` of ``tasks[i]``) in this host's
  share; group ids are the tasks' global positions plus ``group_offset`` (a step's later draw rounds continue the
  numbering). ``adapters[i]`` is the harness of ``tasks[i]``, or a list of one per sample (chosen on every host for every trial, so a seeded chooser stays in step across
  hosts). ``seed_of(group, sample)`` seeds each trial's proxy session. Returns this host's
  results, in job order; no collective (safe on a producer thread)."""
  def adapter(g, s):
    a = adapters[g]
    return a[s] if isinstance(a, (list, tuple)) else a

  counts = [int(samples)] * len(tasks) if isinstance(samples, int) else [int(x) for x in samples]
  jobs = [TrialJob(tasks[g], adapter(g, s), group=group_offset + g,
                   seed=None if seed_of is None else seed_of(group_offset + g, s))
          for g in distributed.host_share(len(tasks)) for s in range(counts[g])]
  return run_trials(jobs, proxy, trial_cfg, out_dir, concurrency=concurrency,
                    max_retries=max_retries, on_result=on_result)


def local_rows_per_batch(global_rows: int, mesh) -> int:
  """Rows of every global batch this host supplies (``global_rows`` in one process).

  Each host fills its rows with its own trials, so the batch axes (``data`` x ``fsdp``) must
  split the rows evenly over the hosts."""
  if not multi_process():
    return global_rows
  k = jax.process_count()
  if mesh is None:
    raise errors.ShardingError("a multi-host run needs a mesh over all hosts' devices (cfg.mesh).")
  rows = len(distributed.local_batch_rows(global_rows, mesh))
  if rows * k != global_rows:
    raise errors.ShardingError(
        f"each of the {k} hosts holds {rows} of the {global_rows} rows of a batch, so hosts "
        "cannot feed disjoint rows; put the hosts on the batch axes (mesh.data x mesh.fsdp a "
        f"multiple of {k}, tensor within a host).")
  return rows


def _empty_batch(rows: int, length: int, keys: Sequence[str],
                 template: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """An all-padding ``[rows, length]`` batch; a mixture-of-experts batch's routes
  (``template``'s ``[., T, L_moe, k]``) as -1, no route recorded."""
  out = {k: np.zeros((rows, length), np.float32 if k in _FLOAT_KEYS else np.int32) for k in keys}
  routes = None if template is None else template.get(batching.ROUTES_KEY)
  if routes is not None:
    out[batching.ROUTES_KEY] = np.full((rows, length, *routes.shape[2:]), -1, routes.dtype)
  return out


def align_batches(batches: list[dict[str, np.ndarray]], buckets: Sequence[int], rows: int
                  ) -> list[dict[str, np.ndarray]]:
  """The same number of ``[rows, T]`` batches per length ``T`` on every host, sorted by length
  (as ``batching.make_batches`` emits them); a host with fewer adds empty (all-padding) ones,
  which carry no loss. A collective; one process: ``batches`` unchanged."""
  if not multi_process():
    return batches
  lengths = sorted(int(b) for b in buckets)
  mine = [sum(b["input_ids"].shape[1] == t for b in batches) for t in lengths]
  counts = np.max(np.asarray(gather_objects(mine)), axis=0)
  keys = list(batches[0]) if batches else list(batching.KEYS)
  out = []
  for t, n in zip(lengths, counts):
    same = [b for b in batches if b["input_ids"].shape[1] == t]
    out += same + [_empty_batch(rows, t, keys, batches[0] if batches else None)
                   for _ in range(int(n) - len(same))]
  return out


def local_params(params):
  """Parameters the host's sampling engine can hold: the arrays themselves in one process;
  with several processes a full copy of every (sharded) parameter on this host (a collective:
  the sampler runs on the host's own devices, outside the global mesh)."""
  if not multi_process():
    return params
  full = distributed.gather(params)
  dev = jax.local_devices()[0]
  return {k: jax.device_put(v, dev) for k, v in full.items()}


# -- the update over a global batch ---------------------------------------------------------------

def _scored_cap(counts: np.ndarray, width: int, n_micro: int) -> int | None:
  """``train_step.scored_cap_for`` from per-row scored-token counts ``[B]`` of the global batch."""
  rows = counts.shape[0] // n_micro
  need = max(int(counts[i * rows:(i + 1) * rows].sum()) for i in range(n_micro))
  total = rows * width
  for frac in ts.SCORED_CAP_FRACTIONS:
    cap = max(1, int(total * frac))
    if need <= cap:
      return cap
  return None


def _row_scored(batch: dict[str, np.ndarray]) -> np.ndarray:
  """Scored (trained) predictions per row ``[b]`` int, as ``scored_cap_for`` counts them."""
  seg, mask = np.asarray(batch["segment_ids"]), np.asarray(batch["loss_mask"])
  return ((mask[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).sum(1)


class GlobalUpdater:
  """``Learner.update`` for a learner on a mesh (one host or many) fed with host-local rows.

  Each process passes its local batches (``[local_rows, T]`` NumPy, the same count and
  shapes on every process: ``align_batches``); the updater places them as global
  ``jax.Array`` batches and runs the learner's sharded train step. The result equals
  ``Learner.update`` on the concatenated global batches (tested with two processes).
  """

  def __init__(self, learner):
    if learner.mesh is None:
      raise errors.ShardingError("GlobalUpdater needs a learner built with a mesh.")
    self.learner, self.mesh, self.cfg = learner, learner.mesh, learner.cfg
    self._step_fn = ts.make_train_step(learner.model_def, learner.optimizer, learner.cfg,
                                       plan=learner.plan)
    self._jits: dict = {}
    self._logprob = None

  def _global(self, batch: dict[str, np.ndarray], replicated: bool) -> dict[str, jax.Array]:
    if replicated:  # every host holds the whole batch: take the rows this host feeds
      rows = distributed.local_batch_rows(batch["input_ids"].shape[0], self.mesh)
      batch = {k: np.asarray(v)[rows] for k, v in batch.items()}
    return distributed.global_batch(batch, self.mesh)

  def _cap(self, local: dict[str, np.ndarray]) -> int | None:
    if not self.cfg.trainer.get("lm_head_on_scored_only", True):
      return None
    b = local["input_ids"].shape[0]
    rows = distributed.local_batch_rows(b * jax.process_count(), self.mesh) if multi_process() \
        else np.arange(b)
    counts = np.zeros(b * jax.process_count(), np.int64)
    for r, c in gather_objects([rows.tolist(), _row_scored(local).tolist()]):
      counts[r] = c  # every host's rows, at their places in the global batch
    return _scored_cap(counts, local["input_ids"].shape[1] - 1,
                       int(self.cfg.trainer.get("micro_batches", 1)))

  def _train_step(self, gb: dict[str, jax.Array], cap):
    key = (cap, tuple(sorted((k, v.ndim) for k, v in gb.items())))
    if key not in self._jits:
      step_fn = self._step_fn
      # Explicit in_shardings rule out keyword arguments: close over the static cap instead.
      self._jits[key] = jax.jit(
          lambda state, batch, frozen: step_fn(state, batch, frozen, scored_cap=cap),
          in_shardings=(self.learner.state_sh, ts.batch_shardings(gb, self.mesh),
                        self.learner.frozen_sh),
          out_shardings=(self.learner.state_sh, None), donate_argnums=(0,),
          compiler_options=self.learner.compiler_options)
    return self._jits[key]

  def _old_logp(self, gb: dict[str, jax.Array]) -> jax.Array:
    if self._logprob is None:
      sh = distributed.batch_sharding(self.mesh, 2)
      self._logprob = jax.jit(ts.make_logprob_fn(
          self.learner.model_def, temperature=float(self.cfg.loss.get("temperature", 1.0)),
          impl=self.cfg.trainer.get("logprob_impl", None), plan=self.learner.plan,
          routing_replay=bool(self.cfg.trainer.get("routing_replay", False))),
          out_shardings=(sh, sh), compiler_options=self.learner.compiler_options)
    return self._logprob(self.learner.state.params, self.learner.frozen, gb)[0]

  def update(self, batches: list[dict[str, np.ndarray]], replicated: bool = False
             ) -> dict[str, float]:
    """One optimizer update per batch; metrics merged like ``Learner.update``.

    ``replicated``: every host passes the same whole batches (e.g. SFT on gathered
    demonstrations) instead of its own rows.
    """
    t0 = time.perf_counter()
    gbs = [self._global(b, replicated) for b in batches]
    locals_ = [{k: np.asarray(v)[distributed.local_batch_rows(v.shape[0], self.mesh)] for k, v in b.items()}
               if replicated else b for b in batches]
    if len(gbs) > 1 and "old_logp" not in gbs[0]:
      # As in Learner.update: score every batch under the parameters the step starts from.
      gbs = [dict(gb, old_logp=self._old_logp(gb)) for gb in gbs]
    merged: dict[str, float] = {}
    tokens = 0
    for i, (gb, lb) in enumerate(zip(gbs, locals_)):
      cap = self._cap(lb)
      state, m = self._train_step(gb, cap)(self.learner.state, gb, self.learner.frozen)
      self.learner.state = state
      tokens += int(np.sum(np.asarray(lb["segment_ids"]) > 0))
      merge_update_metrics(merged, m, i)
    merged["learner_tokens"] = float(sum(gather_objects(tokens)))
    merged["learner_time_s"] = time.perf_counter() - t0
    merged["learner_tokens_per_s"] = merged["learner_tokens"] / max(merged["learner_time_s"], 1e-9)
    return merged


class ReplicatedUpdates:
  """Adapter for loops that build the same whole batches on every host (``sft.run_sft``)."""

  def __init__(self, updater: GlobalUpdater):
    self.updater = updater

  def update(self, batches):
    return self.updater.update(batches, replicated=True)


def update_fn(learner) -> Callable[[list[dict[str, np.ndarray]]], dict[str, float]]:
  """How the loop applies one step's local batches: ``learner.update`` on a single device,
  ``GlobalUpdater`` when the state lives on a mesh (one host with several devices, or many)."""
  if learner.mesh is None:
    return learner.update
  return GlobalUpdater(learner).update
