"""The sweep: short RL arms from one saved SFT start, ranked by what a long run needs (issue 44).

Each arm is the run's config with a few fields changed (``ARM``: ``"NAME key=value ..."``, e.g.
``"lr1e-4 optim.learning_rate=1e-4"``, ``"top8 trainer.trainable=top:8"``, ``"t08
temperature=0.8"``; ``temperature`` sets the sampler's and the learner's together), started
from the same SFT checkpoint with no SFT phase, for ``sweep.steps`` RL steps. Arms rank by

1. ``mixed_share``: the share of the groups the arm drew that had mixed rewards, over its steps
   (the groups that carry a GRPO signal: ``groups_mixed / tasks_drawn``; a run without dynamic
   sampling logs no draws and falls back to ``1 - groups_zero_variance_frac``; with it, every
   group kept for the loss is mixed by construction, so that figure would read 1.0);
2. ``train_solve_rate``: its mean training solve rate over the steps;
3. ``gain``: the paired held-out gain of the main set over the arm's own evaluation before RL
   (``val_solve_rate_delta_rl``, with its clustered SE and z).

An arm the KL guard stops (``trainer.max_kl``) is recorded as stopped, with the guard's message,
and ranks after every arm that finished; the sweep goes on to the next arm. An arm whose
``summary.json`` or ``stopped.json`` exists is not run again (an interrupted sweep continues where
it left off; an interrupted arm resumes from its checkpoints).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.trainer import run_state
from legorl_jax.utils import safe_json

STOPPED = "stopped.json"  # an arm the KL guard stopped: {"reason": the guard's message}


@dataclasses.dataclass
class Arm:
  name: str
  overrides: dict


def parse_arm(spec: str) -> Arm:
  """``"NAME key=value key=value"`` -> Arm (values read as Python literals where they parse,
  else kept as strings: ``trainer.trainable=top:8``)."""
  parts = str(spec).split()
  if not parts or "=" in parts[0]:
    raise errors.ConfigError(f"sweep arm {spec!r} must start with a name: 'NAME key=value ...', "
                             "e.g. 'lr1e-4 optim.learning_rate=1e-4'.")
  out = {}
  for p in parts[1:]:
    key, eq, raw = p.partition("=")
    if not eq or not key:
      raise errors.ConfigError(f"sweep arm {spec!r}: {p!r} is not key=value.")
    try:
      out[key] = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      out[key] = raw
  return Arm(parts[0], out)


def arm_config(cfg, start: str, arm: Arm, steps: int):
  """A copy of ``cfg`` that runs ``arm``: RL only, from checkpoint ``start``, ``steps`` steps."""
  c = cfg.copy_and_resolve_references()
  c.model.checkpoint = start
  if "pretrained" in c.model:
    c.model.pretrained = ""
  c.sft.steps = 0
  c.trainer.steps = int(steps)
  for key, value in arm.overrides.items():
    if key == "temperature":
      c.sampling.temperature = c.loss.temperature = float(value)
      continue
    *path, leaf = key.split(".")
    node = c
    for part in path:
      if part not in node:
        raise errors.ConfigError(f"sweep arm {arm.name!r}: config has no section {part!r} ({key}).")
      node = node[part]
    if leaf not in node:
      raise errors.ConfigError(f"sweep arm {arm.name!r}: config has no key {key!r}.")
    current = node[leaf]
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    if isinstance(current, tuple) and isinstance(value, list):
      value = tuple(value)
    node[leaf] = value
  return c


def arm_figures(workdir: str) -> dict:
  """An arm's figures from its ``metrics.jsonl`` (RL steps) and ``summary.json``."""
  train = []
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      train = [m for m in (safe_json.loads(l, what=path) for l in f if l.strip()) if m.get("phase") == "train"]
  zero = [m["groups_zero_variance_frac"] for m in train if m.get("groups_zero_variance_frac") is not None]
  drawn = [(m["groups_mixed"], m["tasks_drawn"]) for m in train
           if m.get("tasks_drawn") and m.get("groups_mixed") is not None]
  if drawn:
    mixed_share = float(sum(g for g, _ in drawn) / sum(t for _, t in drawn))
  else:
    mixed_share = float(1.0 - np.mean(zero)) if zero else None
  solve = [m["solve_rate"] for m in train if m.get("solve_rate") is not None]
  stopped = None
  if os.path.exists(os.path.join(workdir, STOPPED)):
    with open(os.path.join(workdir, STOPPED)) as f:
      stopped = safe_json.load(f).get("reason")
  summary = {}
  if os.path.exists(os.path.join(workdir, "summary.json")):
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = safe_json.load(f)
  return {"steps": len(train), "stopped": stopped,
          "mixed_share": mixed_share,
          "train_solve_rate": float(np.mean(solve)) if solve else None,
          "gain": summary.get("val_solve_rate_delta_rl"),
          "gain_se": summary.get("val_solve_rate_delta_se_rl"),
          "gain_z": summary.get("val_solve_rate_delta_z_rl"),
          "before": summary.get("val_solve_rate_before_rl"),
          "after": summary.get("val_solve_rate_after_rl")}


def rank_arms(rows: Sequence[dict]) -> list[dict]:
  """Rows (each an arm's figures with ``name``) best first, ``rank`` set from 1; a missing
  figure ranks last on its key."""
  def key(r):
    return (bool(r.get("stopped")),) + tuple(-(r.get(k) if r.get(k) is not None else -np.inf)
                                             for k in ("mixed_share", "train_solve_rate", "gain"))
  out = sorted(rows, key=key)
  for i, r in enumerate(out, start=1):
    r["rank"] = i
  return out


def format_table(rows: Sequence[dict]) -> str:
  """The sweep's one table, best arm first."""
  def f(x, fmt):
    return "-" if x is None else format(x, fmt)
  head = f"{'rank':>4}  {'arm':<16} {'mixed':>6}  {'train':>6}  {'before':>6}  {'after':>6}  {'gain':>7}  {'SE':>6}  {'z':>5}"
  lines = [head, "-" * len(head)]
  for r in rows:
    lines.append(f"{r['rank']:>4}  {r['name'][:16]:<16} {f(r['mixed_share'], '6.3f')}  "
                 f"{f(r['train_solve_rate'], '6.3f')}  {f(r['before'], '6.3f')}  "
                 f"{f(r['after'], '6.3f')}  {f(r['gain'], '+7.3f')}  {f(r['gain_se'], '6.3f')}  "
                 f"{f(r['gain_z'], '5.2f')}")
    if r.get("stopped"):
      lines.append(f"      stopped after {r['steps']} steps: {r['stopped'].split(';')[0]}")
  return "\n".join(lines)


# Overrides that change only the RL phase: an arm made of these evaluates before RL exactly as
# the config does (same checkpoint, temperature, tasks and seeds), so it can share that result.
_RL_ONLY_SECTIONS = ("optim.", "loss.", "sweep.", "rollout.pass_rate.")
_RL_ONLY_KEYS = frozenset({
    "trainer.steps", "trainer.max_kl", "trainer.updates_per_batch", "trainer.rows_per_batch",
    "trainer.micro_batches", "trainer.buckets", "trainer.pack", "trainer.share_prompt",
    "trainer.accumulate", "rollout.tasks_per_step", "rollout.samples_per_task",
    "rollout.sampler", "rollout.difficulty_filter", "rollout.difficulty_window",
    "rollout.difficulty_max_skips", "rollout.drop_zero_variance", "rollout.max_draw_rounds",
    "rollout.draw_tasks"})


def shares_before_eval(arm: Arm) -> bool:
  """Whether ``arm``'s evaluation before RL is the config's own: every override is RL-only
  (``loss.temperature`` is not: it moves with the sampler's; ``trainer.trainable`` is unless it
  adds LoRA adapters, which change the forward pass's arithmetic)."""
  for key, value in arm.overrides.items():
    if key == "trainer.trainable":
      if str(value).startswith("lora"):
        return False
    elif key == "loss.temperature" or not (key in _RL_ONLY_KEYS or key.startswith(_RL_ONLY_SECTIONS)):
      return False
  return True


def _before_result(arm_dir: str) -> str:
  return os.path.join(arm_dir, *run_state.BEFORE_RL_RESULT)


def share_before_eval(donor_dir: str, arm_dir: str) -> bool:
  """Seeds ``arm_dir`` with ``donor_dir``'s evaluation before RL (its result, its step-0 eval
  metrics line and its ``eval_before_rl`` trial records), which the run then reuses as it does
  on resume: ~6 minutes an arm on 2 cores for 32 bugs x 8 samples. False (nothing written)
  when the arm already has one or the donor has none."""
  if os.path.exists(_before_result(arm_dir)) or not os.path.exists(_before_result(donor_dir)):
    return False
  os.makedirs(os.path.dirname(_before_result(arm_dir)), exist_ok=True)
  for name, keep in (("metrics.jsonl", lambda r: r.get("phase") == "eval" and r.get("step") == 0),
                     ("trials.jsonl", lambda r: r.get("phase") == "eval_before_rl")):
    src = os.path.join(donor_dir, name)
    if os.path.exists(src):
      with open(src) as f:
        lines = [l for l in f if l.strip() and keep(safe_json.loads(l, what=src))]
      with open(os.path.join(arm_dir, name), "a") as f:
        f.writelines(lines)
  with open(_before_result(donor_dir)) as f:
    result = f.read()
  with open(_before_result(arm_dir), "w") as f:
    f.write(result)
  return True


def run_sweep(cfg, workdir: str, start: str, arms: Sequence[str], steps: int) -> dict:
  """Runs every arm (``pipeline.run`` into ``WORKDIR/ARM``) from checkpoint ``start``; writes
  ``WORKDIR/sweep.json`` and ``sweep.txt``; returns the JSON (with ``table``)."""
  from legorl_jax.trainer import pipeline  # pylint: disable=import-outside-toplevel
  if not arms:
    raise errors.ConfigError("config sweep.arms is empty; give arms as 'NAME key=value ...', e.g. "
                             "--config.sweep.arms=\"('base', 'lr3e-5 optim.learning_rate=3e-5')\".")
  if not os.path.isdir(start):
    raise errors.ConfigError(f"sweep start {start!r} is not a checkpoint directory; pass an SFT "
                             "checkpoint (WORKDIR/sft_checkpoints/step_N) or a screen's JSON.")
  parsed = [parse_arm(a) for a in arms]
  if len({a.name for a in parsed}) != len(parsed):
    raise errors.ConfigError(f"sweep arm names must differ: {[a.name for a in parsed]}.")
  rows, donor = [], None
  for arm in parsed:
    arm_dir = os.path.join(workdir, arm.name)
    c = arm_config(cfg, start, arm, steps)
    if not any(os.path.exists(os.path.join(arm_dir, n)) for n in ("summary.json", STOPPED)):
      print(f"[sweep] arm {arm.name}: {arm.overrides or 'the config as it is'}", flush=True)
      if donor and shares_before_eval(arm) and share_before_eval(donor, arm_dir):
        print(f"[sweep] arm {arm.name}: evaluation before RL shared from {donor}", flush=True)
      try:
        pipeline.run(c, arm_dir)
      except errors.KLBoundError as e:  # a finding about the arm, not a failure of the sweep
        print(f"[sweep] arm {arm.name} stopped: {e}", flush=True)
        with open(os.path.join(arm_dir, STOPPED), "w") as f:
          json.dump({"reason": str(e)}, f)
    if donor is None and shares_before_eval(arm) and os.path.exists(_before_result(arm_dir)):
      donor = arm_dir
    rows.append({"name": arm.name, "overrides": arm.overrides, "workdir": arm_dir,
                 **arm_figures(arm_dir)})
  rows = rank_arms(rows)
  out = {"start": start, "steps": int(steps), "rows": rows}
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "sweep.json"), "w") as f:
    json.dump(out, f, indent=2)
  out["table"] = format_table(rows)
  with open(os.path.join(workdir, "sweep.txt"), "w") as f:
    f.write(out["table"] + "\n")
  return out
