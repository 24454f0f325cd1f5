"""Runs the screen (``trainer.screen``): every SFT checkpoint at every temperature, one pool of
trials per checkpoint on its own sampling engine, then the ranked table and its JSON.

Apart from ``trainer.screen`` because it builds policies the way a run does
(``pipeline.build_policy``), and the pipeline itself saves the screen's checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Sequence

from legorl_jax import errors
from legorl_jax.metrics.progress import PhaseProgress
from legorl_jax.proxy.service import derive_seed
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.trainer import pipeline
from legorl_jax.trainer.policy_service import PolicyService
from legorl_jax.trainer.screen import (CHECKPOINT_DIR, best_overrides, format_table, rank, score,
                                       screen_tasks)
from legorl_jax.trainer.task_filter import task_key


def run_screen(cfg, workdir: str, checkpoints: Sequence[str], *, out_dir: str | None = None
               ) -> dict:
  """Scores every checkpoint at every ``screen.temperatures`` on ``screen_tasks``; writes
  ``OUT_DIR/screen.json`` (rows, best, overrides) and ``screen.txt`` (the table); returns the
  JSON. ``OUT_DIR`` defaults to ``WORKDIR/screen``; trial directories go under it."""
  from legorl_jax.harnesses import registry  # pylint: disable=import-outside-toplevel
  from legorl_jax.rollout.trial import TrialConfig  # pylint: disable=import-outside-toplevel
  from legorl_jax.sandbox import SandboxConfig  # pylint: disable=import-outside-toplevel

  if not checkpoints:
    raise errors.ConfigError(f"no SFT checkpoints to screen: none in {workdir}/{CHECKPOINT_DIR} "
                             "(run SFT with --config.sft.save_at='(20, 40, 80, 160)') and none in "
                             "screen.checkpoints.")
  temps = [float(t) for t in cfg.screen.temperatures]
  if not temps or any(t <= 0 for t in temps):
    raise errors.ConfigError(f"config screen.temperatures={tuple(temps)} must be positive "
                             "temperatures (the screen samples; greedy has no spread).")
  n = int(cfg.screen.samples)
  if n < 2:
    raise errors.ConfigError(f"config screen.samples={n} must be >= 2 (mixed results need two).")
  out_dir = out_dir or os.path.join(workdir, "screen")
  os.makedirs(out_dir, exist_ok=True)
  tasks = screen_tasks(cfg)
  adapter = registry.get_adapter(cfg.harness.get("eval_name", "") or cfg.harness.name.split(":")[0])
  adapter.check_installed()
  trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s),
                          max_turns=int(cfg.harness.max_turns),
                          sandbox=SandboxConfig(backend=cfg.sandbox.backend))
  rows = []
  for ci, ckpt in enumerate(checkpoints):
    c = cfg.copy_and_resolve_references()
    c.model.checkpoint = ckpt
    if "pretrained" in c.model:
      c.model.pretrained = ""
    model, tokenizer = pipeline.build_policy(c)
    service = PolicyService(model, tokenizer, c, os.path.join(out_dir, "sockets"))
    try:
      jobs, owner = [], []
      for ti, temp in enumerate(temps):
        proxy = service.proxy(f"screen_{ti}", temp)
        part = os.path.join(out_dir, f"ckpt_{ci}", f"T{temp:g}")
        for g, task in enumerate(tasks):
          for s in range(n):
            jobs.append(TrialJob(task, adapter, group=g, proxy=proxy, out_dir=part,
                                 seed=derive_seed("screen", int(cfg.seed), task.id, s)))
            owner.append(ti)
      progress = PhaseProgress(f"screen {os.path.basename(ckpt.rstrip('/'))}", len(jobs),
                               unit="trials", every=max(1, len(jobs) // 10))
      lock = threading.Lock()

      def on_result(_r):
        with lock:
          progress.step()

      res = run_trials(jobs, None, trial_cfg, os.path.join(out_dir, f"ckpt_{ci}"),
                       concurrency=int(cfg.rollout.concurrency),
                       max_retries=int(cfg.rollout.max_retries), on_result=on_result)
      progress.finish()
    finally:
      service.close()
    for ti, temp in enumerate(temps):
      rows.append(score([r for r, o in zip(res, owner) if o == ti], tasks, checkpoint=ckpt,
                        temperature=temp, samples=n))
  rows = rank(rows)
  path = os.path.join(out_dir, "screen.json")
  demos = os.path.join(workdir, "sft_demos", "demos.jsonl")
  demos = demos if os.path.exists(demos) else ""
  best = dict(checkpoint=rows[0].checkpoint, temperature=rows[0].temperature, demos=demos)
  out = {"rows": [dataclasses.asdict(r) for r in rows], "best": best,
         "overrides": best_overrides(rows[0], path, demos), "bugs": [task_key(t) for t in tasks],
         "samples": n, "temperatures": temps}
  with open(path, "w") as f:
    json.dump(out, f, indent=2)
  table = format_table(rows)
  with open(os.path.join(out_dir, "screen.txt"), "w") as f:
    f.write(table + "\n")
  out["table"] = table
  return out
