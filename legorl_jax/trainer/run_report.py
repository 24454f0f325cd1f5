"""A finished (or running) RL run's figures as Markdown tables, read back from its workdir.

Why: the tables a reader wants from a run (the per-step RL curve in numbers, and every held-out
evaluation of every set with its paired gain over the before-RL evaluation) live spread over
``metrics.jsonl`` and ``trials.jsonl``. This module rebuilds them from those two files alone,
so a figure quoted in BENCHMARKS.md can be reproduced from the run directory with one command
(``python -m experiments.report --workdir=DIR``), including the evaluations held every
``eval.every`` steps, which ``summary.json`` does not carry.

The held-out figures are recomputed from the trial records (status per trial) with the same
statistics the pipeline uses (``eval_stats``): per task, the last ``eval.samples`` sampled
records and the last greedy record of an evaluation count, so an evaluation redone after a
resume counts once. Standard errors are clustered as the pipeline clusters them: by the
``cluster`` (bug) an evaluation record carries, else by task.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Sequence

from legorl_jax.rewards import status as status_lib
from legorl_jax.taskgen.synthetic.generator import family_of_bug_key
from legorl_jax.trainer import eval_stats
from legorl_jax.utils import safe_json

# (column heading, metrics key, format) of the per-step table.
STEP_COLUMNS = (
    ("training solve rate", "solve_rate", "{:.1%}"),
    ("trials", "trials", "{:.0f}"),
    ("draw rounds", "draw_rounds", "{:.0f}"),
    ("tasks drawn", "tasks_drawn", "{:.0f}"),
    ("mixed groups", "groups_mixed", "{:.0f}"),
    ("passed over never / always", ("tasks_passed_never_solved", "tasks_passed_always_solved"),
     "{:.0f} / {:.0f}"),
    ("KL to start (k3)", "kl_to_start_k3", "{:.4f}"),
    ("entropy", "entropy", "{:.3f}"),
    ("clip frac", ("clip_low_frac", "clip_high_frac"), "{:.3f} / {:.3f}"),
    ("rollout s", "rollout_wall_s", "{:.0f}"),
    ("learner s", "learner_time_s", "{:.0f}"),
)


@dataclasses.dataclass(frozen=True)
class _Outcome:
  """What ``eval_stats`` reads of a trial: its task and status."""
  task_id: str
  status: str
  cluster: str | None = None


def _jsonl(path: str) -> list[dict]:
  """The records of a JSONL file (none if it is absent); a bad line raises InvalidJSONError
  naming the file and line."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [safe_json.loads(line, what=f"{path} line {i}")
            for i, line in enumerate(f, 1) if line.strip()]


def step_rows(metrics: Sequence[dict]) -> list[dict]:
  """The last ``train`` record of each RL step (a step redone after a resume counts once),
  in step order."""
  by_step = {}
  for m in metrics:
    if m.get("phase") == "train":
      by_step[int(m["step"])] = m
  return [by_step[s] for s in sorted(by_step)]


def _cell(row: dict, key, fmt: str) -> str:
  keys = key if isinstance(key, tuple) else (key,)
  if any(row.get(k) is None for k in keys):
    return "-"
  return fmt.format(*(float(row[k]) for k in keys))


def step_table(rows: Sequence[dict]) -> str:
  """Markdown: one line per RL step."""
  head = "| step | " + " | ".join(c[0] for c in STEP_COLUMNS) + " |"
  lines = [head, "|" + "---|" * (len(STEP_COLUMNS) + 1)]
  for r in rows:
    lines.append(f"| {int(r['step'])} | " + " | ".join(_cell(r, k, f) for _, k, f in STEP_COLUMNS)
                 + " |")
  return "\n".join(lines)


def _eval_point(phase: str) -> tuple[str, str] | None:
  """(set, when) of an evaluation phase name, or None for a trial outside the evaluations:
  ``eval_before_rl[_MODE]``, ``eval_after_rl[_MODE]``, and ``eval[_MODE]`` (every
  ``eval.every`` steps: the main set, and the others with ``eval.every_all_sets``)."""
  for when in ("before_rl", "after_rl"):
    stem = f"eval_{when}"
    if phase == stem:
      return "", when
    if phase.startswith(stem + "_"):
      return phase[len(stem) + 1:], when
  if phase == "eval":
    return "", "step"
  if phase.startswith("eval_"):
    return phase[len("eval_"):], "step"
  return None


def evaluations(trials: Sequence[dict], samples: int) -> dict[str, dict[int, dict]]:
  """{set ('' = main): {step: {"sampled": [_Outcome], "greedy": [_Outcome]}}} from the trial
  records; the before-RL evaluation is step 0. Per task, the last ``samples`` sampled records
  and the last greedy one are kept."""
  raw: dict = collections.defaultdict(lambda: collections.defaultdict(
      lambda: {"sampled": collections.OrderedDict(), "greedy": collections.OrderedDict()}))
  for t in trials:
    point = _eval_point(str(t.get("phase", "")))
    if point is None:
      continue
    name, when = point
    step = 0 if when == "before_rl" else int(t.get("step", 0))
    mode = "greedy" if float(t.get("temperature", 1.0)) == 0.0 else "sampled"
    raw[name][step][mode].setdefault(t["task_id"], []).append(
        _Outcome(t["task_id"], t["status"], t.get("cluster")))
  out: dict[str, dict[int, dict]] = {}
  for name, by_step in raw.items():
    out[name] = {}
    for step, modes in sorted(by_step.items()):
      out[name][step] = {
          "sampled": [o for v in modes["sampled"].values() for o in v[-samples:]],
          "greedy": [o for v in modes["greedy"].values() for o in v[-1:]]}
  return out


def evaluation_rows(evals: dict[str, dict[int, dict]], samples: int, main: str = "main"
                    ) -> list[dict]:
  """One row per (set, evaluation): sampled solve rate and its SE, pass@SAMPLES, tasks mixed,
  greedy solve rate, and the paired gain over the same set's step-0 evaluation. ``main``
  names the main held-out set in the rows."""
  rows = []
  for name in sorted(evals, key=lambda n: (n != "", n)):
    by_step = evals[name]
    base = eval_stats.outcomes_by_task(by_step[0]["sampled"]) if 0 in by_step else None
    clusters = {o.task_id: o.cluster for ev in by_step.values() for o in ev["sampled"] if o.cluster}
    for step, ev in by_step.items():
      stats = eval_stats.solve_stats(ev["sampled"], k_values=sorted({1, samples}),
                                     cluster_of=clusters)
      row = {"set": name or main, "step": step, "n_trials": stats["n_trials"],
             "solve_rate": stats["solve_rate"], "solve_rate_se": stats["solve_rate_se"],
             f"pass@{samples}": stats.get(f"pass@{samples}"),
             "n_tasks_mixed": stats["n_tasks_mixed"],
             "greedy_solve_rate": (eval_stats.solve_stats(ev["greedy"])["solve_rate"]
                                   if ev["greedy"] else None)}
      if base is not None and step != 0:
        paired = eval_stats.paired_difference(base, eval_stats.outcomes_by_task(ev["sampled"]),
                                              clusters)
        row.update(delta=paired["delta"], delta_se=paired["delta_se"], z=paired["z"])
      rows.append(row)
  return rows


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.1f}%"


def evaluation_table(rows: Sequence[dict], samples: int) -> str:
  """Markdown: one line per held-out set and evaluation step (0 = before RL)."""
  lines = [f"| set | after step | trials | sampled (SE) | paired gain (SE, z) | greedy | "
           f"pass@{samples} | tasks mixed |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    gain = "-"
    if r.get("delta") is not None:
      z = "-" if r.get("z") is None else f"{r['z']:.2f}"
      gain = f"{100 * r['delta']:+.1f} ({100 * r['delta_se']:.1f}, z {z})"
    lines.append(f"| {r['set']} | {r['step']} | {r['n_trials']} | {_pct(r['solve_rate'])} "
                 f"({100 * r['solve_rate_se']:.1f}) | {gain} | {_pct(r['greedy_solve_rate'])} | "
                 f"{_pct(r[f'pass@{samples}'])} | {r['n_tasks_mixed']} |")
  return "\n".join(lines)


def pool_table(records: Sequence[dict], min_visits: int = 10) -> str:
  """Markdown: the RL pool after the last step of ``rollouts/pass_rate.jsonl`` (pass-rate
  sampling): one line per bug, most visited first, with its visits and solve-rate estimate, and
  a headline saying how many bugs in reach (estimate in [0.05, 0.95]) were visited at least
  ``min_visits`` times (issue 44: in a 40-step run each bug RL can move, >= 10)."""
  if not records:
    return ""
  last = records[-1]
  bugs = sorted(last["bugs"].items(), key=lambda kv: (-kv[1]["visits"], kv[0]))
  reach = [v for _, v in bugs if 0.05 <= v["rate"] <= 0.95]
  head = (f"After step {last['step']}: {sum(v['visits'] > 0 for _, v in bugs)} of {len(bugs)} "
          f"bugs visited; {sum(v['visits'] >= min_visits for v in reach)} of the {len(reach)} in "
          f"reach (estimate 0.05-0.95) visited >= {min_visits} times.")
  lines = [head, "", "| bug | visits | estimate |", "|---|---|---|"]
  lines += [f"| {k} | {v['visits']} | {v['rate']:.2f} |" for k, v in bugs]
  return "\n".join(lines)


def reach_rows(evals: dict[str, dict[int, dict]]) -> list[dict]:
  """Where a held-out set is out of reach: per set, at its first and last evaluation, one row
  per bug family (``generator.family_of_bug_key`` of a record's cluster; ``"other"`` for any
  other task) with the bugs it holds, the bugs solved at least once, and the sampled solve rate
  (``solved``/``trials``). A family no sample solves at either point is one RL cannot move
  (GRPO learns only from mixed groups), which bounds the gain a run can show."""
  rows = []
  for name in sorted(evals, key=lambda n: (n != "", n)):
    by_step = evals[name]
    for step in sorted({min(by_step), max(by_step)}):
      solved_by_bug: dict = collections.defaultdict(collections.Counter)  # family -> bug -> solves
      trials: dict = collections.Counter()  # family -> policy-outcome trials
      for o in by_step[step]["sampled"]:
        if status_lib.is_infrastructure(o.status):  # says nothing about the policy
          continue
        family = family_of_bug_key(o.cluster) or "other"
        bug = o.cluster or o.task_id
        solved_by_bug[family][bug] += o.status == status_lib.SOLVED  # a failure adds the bug
        trials[family] += 1
      for family in sorted(solved_by_bug):
        bugs = solved_by_bug[family]
        rows.append({"set": name, "step": step, "family": family, "bugs": len(bugs),
                     "bugs_solved": sum(v > 0 for v in bugs.values()),
                     "solved": sum(bugs.values()), "trials": trials[family]})
  return rows


def reach_table(rows: Sequence[dict], main: str = "main") -> str:
  """Markdown: ``reach_rows``, one line per (set, evaluation, bug family)."""
  lines = ["| set | after step | bug family | bugs solved at least once | solved / trials |",
           "|---|---|---|---|---|"]
  lines += [f"| {r['set'] or main} | {r['step']} | {r['family']} | {r['bugs_solved']} of "
            f"{r['bugs']} | {r['solved']} / {r['trials']} |" for r in rows]
  return "\n".join(lines)


def _config(workdir: str) -> dict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return safe_json.load(f, what=path)


def report(workdir: str) -> str:
  """Both tables of the run in ``workdir``, as Markdown; ``eval.samples`` and the main set's
  name (``tasks.held_out``) come from its ``config.json``."""
  cfg = _config(workdir)
  samples = int(cfg.get("eval", {}).get("samples", 1))
  main = f"{cfg.get('tasks', {}).get('held_out') or 'main'} (main)"
  steps = step_rows(_jsonl(os.path.join(workdir, "metrics.jsonl")))
  evals = evaluations(_jsonl(os.path.join(workdir, "trials.jsonl")), samples)
  parts = [f"## RL steps ({len(steps)})", "", step_table(steps), "",
           "## Held-out evaluations (step 0: before RL; gains paired against it)", "",
           evaluation_table(evaluation_rows(evals, samples, main), samples)]
  parts += ["", "## Reach: held-out bugs by family (first and last evaluation)", "",
            reach_table(reach_rows(evals), main)]
  pool = pool_table(_jsonl(os.path.join(workdir, "rollouts", "pass_rate.jsonl")))
  if pool:
    parts += ["", "## RL pool (pass-rate sampling)", "", pool]
  return "\n".join(parts) + "\n"
