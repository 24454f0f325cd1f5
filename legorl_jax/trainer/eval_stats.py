"""Evaluation figures and their uncertainty: solve rate, pass@k, headroom, paired differences.

Trials of one task are not independent draws of the policy's skill (a task is easy or hard for
every sample), so standard errors here are clustered: by task by default, or by any grouping
of tasks given as ``cluster_of`` (``{task id: cluster}``), e.g. by bug, when a held-out set
shows one bug under several names (``clustered_se``: the cluster-robust standard error of a
weighted mean; with one task per cluster and equal sample counts it is the standard deviation
of the per-task solve rates over the square root of the number of tasks). A before/after
comparison is paired: the same tasks, each sample with the same seed at both evaluations
(common random numbers), so its standard error is that of the per-task differences, clustered
the same way.
"""

from __future__ import annotations

import collections
import math
from typing import Mapping, Sequence

import numpy as np

from legorl_jax.rewards import status as st


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
  if n - c < k:
    return 1.0
  return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def outcomes_by_task(results: Sequence) -> dict[str, list[int]]:
  """{task id: [1 solved / 0 not, per policy-outcome trial, in result order]}; infrastructure
  failures say nothing about the policy and are left out."""
  by_task: dict[str, list[int]] = collections.OrderedDict()
  for r in results:
    if not st.is_infrastructure(r.status):
      by_task.setdefault(r.task_id, []).append(int(r.status == st.SOLVED))
  return by_task


def task_se(rates: Sequence[float]) -> float:
  """Standard error of a mean over tasks (ddof=1); 0.0 for fewer than two tasks."""
  rates = np.asarray(rates, np.float64)
  return float(rates.std(ddof=1) / math.sqrt(len(rates))) if len(rates) > 1 else 0.0


def clustered_se(values: Sequence[float], weights: Sequence[float], clusters: Sequence) -> float:
  """Cluster-robust (CR1) standard error of the weighted mean ``sum(w x) / sum(w)``.

  Args:
    values: per-unit figures x (e.g. a task's solve rate, or its after - before difference).
    weights: per-unit weights w (e.g. the task's trial count: the mean is then over trials).
    clusters: per-unit cluster labels (e.g. the task's bug); units of one cluster are not
      independent, so their residuals add up before squaring.
  Returns:
    ``sqrt(G / (G - 1) * sum_g (sum_{i in g} w_i (x_i - mean))^2) / sum(w)`` with G clusters;
    0.0 for fewer than two clusters.
  """
  x, w = np.asarray(values, np.float64), np.asarray(weights, np.float64)
  labels = list(clusters)
  groups = sorted(set(labels), key=labels.index)
  if len(groups) < 2 or w.sum() <= 0:
    return 0.0
  mean = float(np.sum(w * x) / np.sum(w))
  resid = {g: 0.0 for g in groups}
  for xi, wi, g in zip(x, w, labels):
    resid[g] += wi * (xi - mean)
  g_count = len(groups)
  var = g_count / (g_count - 1) * sum(r * r for r in resid.values()) / float(np.sum(w)) ** 2
  return float(np.sqrt(var))


def solve_stats(results: Sequence, k_values=(1,),
                cluster_of: Mapping[str, str] | None = None) -> dict[str, float]:
  """Solve rate over policy outcomes, its clustered standard error (by task, or by
  ``cluster_of[task id]``: ``clustered_se``), pass@k per task, and headroom: ``n_tasks_mixed``,
  the tasks solved by some samples and not others (the only ones whose group carries a GRPO
  signal), and ``n_clusters``."""
  by_task = outcomes_by_task(results)
  flat = [x for v in by_task.values() for x in v]
  labels = [(cluster_of or {}).get(t, t) for t in by_task]
  out = {"solve_rate": float(np.mean(flat)) if flat else 0.0,
         "solve_rate_se": clustered_se([np.mean(v) for v in by_task.values()],
                                       [len(v) for v in by_task.values()], labels),
         "n_clusters": len(set(labels)),
         "n_tasks": len(by_task), "n_trials": len(flat),
         "n_tasks_mixed": sum(1 for v in by_task.values() if 0 < sum(v) < len(v))}
  for k in k_values:
    vals = [pass_at_k(len(v), sum(v), k) for v in by_task.values() if len(v) >= k]
    if vals:
      out[f"pass@{k}"] = float(np.mean(vals))
  return out


def set_figures(results: Sequence, *, greedy: bool, samples: int, prefix: str = "",
                cluster_of: Mapping[str, str] | None = None) -> dict:
  """The figures one evaluation reports for one held-out set and mode, under ``prefix``
  (``""`` for the main set, ``"MODE/"`` for another): greedy gives ``greedy_solve_rate``;
  sampled gives ``solve_rate``, ``solve_rate_se`` (clustered by ``cluster_of``, default by
  task), ``pass@SAMPLES``, ``n_trials`` and ``n_tasks_mixed``."""
  if greedy:
    return {f"{prefix}greedy_solve_rate": solve_stats(results)["solve_rate"]}
  stats = solve_stats(results, k_values=sorted({1, samples}), cluster_of=cluster_of)
  return {f"{prefix}solve_rate": stats["solve_rate"],
          f"{prefix}solve_rate_se": stats["solve_rate_se"],
          f"{prefix}pass@{samples}": stats.get(f"pass@{samples}", stats["solve_rate"]),
          f"{prefix}n_trials": stats["n_trials"],
          f"{prefix}n_tasks_mixed": stats["n_tasks_mixed"]}


def paired_difference(before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]],
                      cluster_of: Mapping[str, str] | None = None) -> dict[str, float]:
  """after - before on the tasks both evaluated: the difference of solve rates (trials weighted
  alike), its paired standard error (per-task differences, clustered by ``cluster_of[task]``,
  default by task: ``clustered_se``), and ``z`` = difference / SE (None where the SE is 0;
  every figure None without a common task: summary.json stays plain JSON)."""
  common = [t for t in before if t in after and before[t] and after[t]]
  if not common:
    return {"delta": None, "delta_se": None, "z": None, "n_tasks": 0, "n_clusters": 0}
  b = np.array([np.mean(before[t]) for t in common])
  a = np.array([np.mean(after[t]) for t in common])
  w = np.array([len(before[t]) for t in common], np.float64)
  delta = float(np.sum((a - b) * w) / np.sum(w))
  labels = [(cluster_of or {}).get(t, t) for t in common]
  se = clustered_se(a - b, w, labels)
  return {"delta": delta, "delta_se": se, "z": delta / se if se > 0 else None,
          "n_tasks": len(common), "n_clusters": len(set(labels))}


def paired_figures(before: Mapping, now: Mapping, modes: Sequence[str]) -> dict:
  """An evaluation's paired gain over the evaluation before RL, per held-out set (``""``: the
  main one; figures ``[MODE/]solve_rate_delta``, ``..._delta_se``, ``..._delta_z``), for the
  metrics of the evaluations along the run. Sets missing from either evaluation are skipped."""
  out = {}
  for mode in modes:
    b = (before.get("outcomes") or {}).get(mode)
    a = (now.get("outcomes") or {}).get(mode)
    if not (a and b):
      continue
    p = paired_difference(b, a, (before.get("clusters") or {}).get(mode))
    key = f"{mode}/" if mode else ""
    out.update({f"{key}solve_rate_delta": p["delta"], f"{key}solve_rate_delta_se": p["delta_se"],
                f"{key}solve_rate_delta_z": p["z"]})
  return out


def gain_sentence(summary: Mapping, mode: str = "", z_needed: float = 2.0) -> str | None:
  """The paired held-out gain of ``summary.json`` in words, and plainly whether it is
  significant (``z >= z_needed``); None without a paired gain (no evaluation before or after)."""
  pre = f"val_{mode}_" if mode else "val_"
  delta, se, z = (summary.get(f"{pre}solve_rate_delta{k}_rl") for k in ("", "_se", "_z"))
  if delta is None:
    return None
  name = f"held-out set {mode!r}" if mode else "main held-out set"
  if z is None:
    return (f"{name}: paired gain {100 * delta:+.1f} points, SE 0 (every task moved alike): "
            "no z, so not a significant result.")
  verdict = ("significant" if z >= z_needed else "NOT significant") + f" at z >= {z_needed:g}"
  return (f"{name}: paired gain {100 * delta:+.1f} points (SE {100 * se:.1f}, z {z:.2f}) "
          f"over {summary.get('val_tasks', '?')} tasks: {verdict}.")


def guard_sentence(summary: Mapping, mode: str = "names_demo", max_drop: float = 0.05
                   ) -> str | None:
  """Whether the guard set (``names_demo``: the bugs SFT taught) fell by more than
  ``max_drop`` (issue 44: 5 points), in words; None when it was not evaluated before and after."""
  delta = summary.get(f"val_{mode}_solve_rate_delta_rl")
  if delta is None:
    return None
  ok = delta >= -max_drop
  return (f"guard {mode}: {100 * delta:+.1f} points, "
          + ("within" if ok else "BEYOND") + f" the {100 * max_drop:.0f}-point bound.")


SUMMARY_FIGURES = ("solve_rate", "solve_rate_se", "greedy_solve_rate", "pass@{n}", "n_tasks_mixed")


def summary_fields(before: Mapping, after: Mapping, modes: Sequence[str], samples: int) -> dict:
  """``summary.json``'s evaluation figures: ``val_FIGURE_{before,after}_rl`` for the main set
  and ``val_MODE_FIGURE_{before,after}_rl`` for each other set (``modes``), with the paired
  gain of the sampled solve rate: ``val[_MODE]_solve_rate_delta_rl``, ``..._delta_se_rl`` and
  ``..._delta_z_rl`` (None where either evaluation is missing)."""
  out = {}
  for mode in ("", *modes):
    pre_key, pre_name = (f"{mode}/", f"val_{mode}_") if mode else ("", "val_")
    for figure in SUMMARY_FIGURES:
      figure = figure.format(n=samples)
      out[f"{pre_name}{figure}_before_rl"] = before.get(f"{pre_key}{figure}")
      out[f"{pre_name}{figure}_after_rl"] = after.get(f"{pre_key}{figure}")
    b = (before.get("outcomes") or {}).get(mode)
    a = (after.get("outcomes") or {}).get(mode)
    clusters = (before.get("clusters") or {}).get(mode)
    paired = paired_difference(b, a, clusters) if a and b else {}
    out[f"{pre_name}solve_rate_delta_rl"] = paired.get("delta")
    out[f"{pre_name}solve_rate_delta_se_rl"] = paired.get("delta_se")
    out[f"{pre_name}solve_rate_delta_z_rl"] = paired.get("z")
  return out
