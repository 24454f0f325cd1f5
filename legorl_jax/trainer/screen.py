"""The screen: which SFT checkpoint, at which temperature, gives RL the most to work with.

The SFT checkpoint that scores best on its own is often not the best RL start (issue 44): a
policy that has converged on the demonstrations (NLL 0.0007, token entropy ~0.02 nats) writes
the same fix in every sample, so most GRPO groups are all-fail or all-pass and carry no signal.
The screen scores each saved checkpoint (``sft.save_at``) at a few temperatures on RL-pool bugs
under their *training* names (never a held-out set: choosing on it would leak into the figure
RL is judged by), ``screen.samples`` samples per bug, and reports per (checkpoint, temperature):

- ``pass@1`` and ``pass@k`` (k = samples; the unbiased estimator, ``eval_stats.pass_at_k``):
  what the policy solves now, and the headroom RL can sharpen into pass@1;
- ``mixed_share``: the share of bugs with some samples solved and some not, the bugs whose
  groups carry a GRPO signal;
- ``token_entropy``: the mean of -log p over the tokens the policy sampled, with p the
  recorded probability under the tempered distribution it sampled from: an unbiased estimate
  of its per-token entropy (nats) at that temperature (without top-k / top-p truncation).

Rows rank by most bugs mixed, then pass@k, then pass@1. Every trial of a bug's sample ``s``
uses the same seed at every checkpoint and temperature (common random numbers), so the rows
differ by the policy, not by luck of the draw. ``best_overrides`` gives the flags that start
an RL run from the top row: its checkpoint, its temperature for the sampler and the learner
alike, no SFT phase, and the screen's per-bug rates as the pass-rate sampler's priors.
``screen_run.run_screen`` runs the trials; this module holds what the pipeline and the tests
need without it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from typing import Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.rewards import status as st
from legorl_jax.trainer import eval_stats, task_sets
from legorl_jax.trainer.task_filter import task_key
from legorl_jax.utils import safe_json

CHECKPOINT_DIR = "sft_checkpoints"


@dataclasses.dataclass
class ScreenRow:
  """One (checkpoint, temperature): its figures over ``bugs`` bugs x ``samples`` samples."""

  checkpoint: str
  temperature: float
  bugs: int
  samples: int
  pass1: float
  pass_k: float
  mixed_share: float
  token_entropy: float
  sampled_tokens: int
  bug_rates: dict
  rank: int = 0


def checkpoint_dir(workdir: str, step: int) -> str:
  """Where SFT saves its policy after ``step`` steps (``sft.save_at``)."""
  return os.path.join(workdir, CHECKPOINT_DIR, f"step_{int(step)}")


def save_at_steps(cfg) -> frozenset[int]:
  """``sft.save_at`` checked: the SFT steps after which the policy is saved (empty: none)."""
  raw = cfg.sft.get("save_at", ()) or ()
  if isinstance(raw, (int, str)):
    raw = (raw,)
  try:
    steps = frozenset(int(x) for entry in raw for x in str(entry).replace(",", " ").split())
  except ValueError:
    steps = None
  if steps is None or any(x < 1 for x in steps):
    raise errors.ConfigError(f"config sft.save_at={raw!r} must be SFT step numbers >= 1, e.g. "
                             "--config.sft.save_at='(20, 40, 80, 160)'.")
  return steps


def save_if_due(learner, step: int, cfg, workdir: str, tokenizer) -> str | None:
  """After SFT step ``step`` (1-based): saves the policy to ``checkpoint_dir`` when ``step`` is
  in ``sft.save_at``; returns the directory (None when not due)."""
  if step not in save_at_steps(cfg):
    return None
  from legorl_jax.models import save_pretrained  # pylint: disable=import-outside-toplevel
  path = checkpoint_dir(workdir, step)
  save_pretrained(learner.model(), path, tokenizer=tokenizer)
  return path


def saved_checkpoints(workdir: str) -> list[str]:
  """The SFT checkpoints a run saved (``WORKDIR/sft_checkpoints/step_N``), by step."""
  found = glob.glob(os.path.join(workdir, CHECKPOINT_DIR, "step_*"))
  steps = [(int(m.group(1)), p) for p in found
           if (m := re.fullmatch(r"step_(\d+)", os.path.basename(p))) and os.path.isdir(p)]
  return [p for _, p in sorted(steps)]


def screen_tasks(cfg) -> list:
  """``screen.bugs`` RL-pool bugs, one task each under its training name (the first of its
  variants in the pool's fixed order); fewer when the pool has fewer bugs."""
  loader, _, _ = task_sets.load_tasks(cfg)
  first = {}
  for item in loader.source:
    task = loader.decode(item)
    first.setdefault(task_key(task), task)
  return list(first.values())[:int(cfg.screen.bugs)]


def _token_entropy(results) -> tuple[float, int]:
  """(mean -logp over the sampled tokens of the results' train segments, token count)."""
  total, count = 0.0, 0
  for r in results:
    if r.trajectory is None or st.is_infrastructure(r.status):
      continue
    for seg in r.trajectory.segments:
      for lp, m in zip(seg.logprobs, seg.loss_mask):
        if m:
          total -= float(lp)
          count += 1
  return (total / count if count else float("nan")), count


def score(results: Sequence, tasks: Sequence, *, checkpoint: str, temperature: float,
          samples: int) -> ScreenRow:
  """One row from the trials of one (checkpoint, temperature) on ``tasks``."""
  by_task = eval_stats.outcomes_by_task(results)
  per_task = [by_task.get(t.id, []) for t in tasks]
  scored = [v for v in per_task if v]
  p1 = [eval_stats.pass_at_k(len(v), sum(v), 1) for v in scored]
  pk = [eval_stats.pass_at_k(len(v), sum(v), min(samples, len(v))) for v in scored]
  mixed = [0 < sum(v) < len(v) for v in scored]
  entropy, n_tok = _token_entropy(results)
  return ScreenRow(checkpoint=checkpoint, temperature=float(temperature), bugs=len(scored),
                   samples=int(samples), pass1=float(np.mean(p1)) if p1 else 0.0,
                   pass_k=float(np.mean(pk)) if pk else 0.0,
                   mixed_share=float(np.mean(mixed)) if mixed else 0.0,
                   token_entropy=entropy, sampled_tokens=n_tok,
                   bug_rates={task_key(t): float(np.mean(v)) for t, v in zip(tasks, per_task) if v})


def rank(rows: list[ScreenRow]) -> list[ScreenRow]:
  """Rows best first (most bugs mixed, then pass@k, then pass@1), ``rank`` set from 1."""
  ordered = sorted(rows, key=lambda r: (-r.mixed_share, -r.pass_k, -r.pass1))
  for i, r in enumerate(ordered, start=1):
    r.rank = i
  return ordered


def format_table(rows: Sequence[ScreenRow]) -> str:
  """The screen's one table, best row first."""
  k = rows[0].samples if rows else 0
  head = (f"{'rank':>4}  {'checkpoint':<28} {'T':>4}  {'pass@1':>6}  {f'pass@{k}':>7}  "
          f"{'mixed':>9}  {'entropy':>7}")
  lines = [head, "-" * len(head)]
  for r in rows:
    name = os.path.basename(r.checkpoint.rstrip("/")) or r.checkpoint
    mixed = f"{round(r.mixed_share * r.bugs)}/{r.bugs}"
    lines.append(f"{r.rank:>4}  {name[-28:]:<28} {r.temperature:>4.2f}  {r.pass1:>6.3f}  "
                 f"{r.pass_k:>7.3f}  {mixed:>9}  {r.token_entropy:>7.4f}")
  return "\n".join(lines)


def best_overrides(best: ScreenRow, screen_json: str, demos: str = "") -> list[str]:
  """Command-line flags that start RL from ``best``: its checkpoint (no SFT phase), its
  temperature for sampler and learner, and the screen's rates as pass-rate priors (and the
  SFT demonstrations, for ``loss.demo_replay_weight``)."""
  t = f"{best.temperature:g}"
  flags = [f"--config.model.checkpoint={best.checkpoint}", "--config.model.pretrained=",
           "--config.sft.steps=0", f"--config.sampling.temperature={t}",
           f"--config.loss.temperature={t}", f"--config.rollout.pass_rate.priors={screen_json}"]
  if demos:
    flags.append(f"--config.sft.demos={demos}")
  return flags


def apply_best(cfg, screen_json: str):
  """A copy of ``cfg`` set as ``best_overrides`` of the screen in ``screen_json`` says."""
  try:
    with open(screen_json) as f:
      screen = safe_json.load(f)
    best = screen["best"]
  except (OSError, ValueError, KeyError) as e:
    raise errors.ConfigError(f"{screen_json} is not a screen's JSON with a 'best' row ({e}); run "
                             "python -m experiments.screen first.") from e
  cfg = cfg.copy_and_resolve_references()
  cfg.model.checkpoint, cfg.sft.steps = best["checkpoint"], 0
  if "pretrained" in cfg.model:
    cfg.model.pretrained = ""
  cfg.sampling.temperature = cfg.loss.temperature = float(best["temperature"])
  cfg.rollout.pass_rate.priors = screen_json
  if best.get("demos") and not cfg.sft.get("demos", ""):
    cfg.sft.demos = best["demos"]
  return cfg
