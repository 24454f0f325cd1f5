r"""End-to-end RL throughput: trials per hour and learner utilisation, sync vs async.

Runs the demo configuration's RL phase (built-in harness, local sandbox, tiny policy; no SFT,
no held-out evaluation) twice in this process's children, once per mode, with the same seed and
step count, and reports the async/sync ratio from this one run.

It also reports each mode's CPU use during RL (the trainer process and its reaped trial
processes, over wall time x cores). Async mode gains only where sync mode leaves cores idle:
with about the same CPU work per trial, async can be at most ``1 / sync cpu_utilisation`` times
faster on this host (``async_bound_from_idle_cpu``), however well the two phases overlap.

  python -m experiments.benchmarks.end_to_end --steps=4
"""

import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags

from experiments.benchmarks import common
from legorl_jax.utils import cpu_time

flags.DEFINE_integer("steps", 4, "RL steps per mode.")
flags.DEFINE_integer("tasks_per_step", 4, "Tasks per step.")
flags.DEFINE_integer("samples_per_task", 4, "Samples per task.")
flags.DEFINE_string("workdir", None, "Where to keep the two runs (default: a temp dir).")
FLAGS = flags.FLAGS


def run_mode(mode: str, workdir: str) -> dict:
  args = [sys.executable, "-m", "experiments.train", f"--workdir={workdir}",
          "--config=experiments/configs/demo_tiny.py", f"--config.trainer.mode={mode}",
          f"--config.trainer.steps={FLAGS.steps}", "--config.sft.steps=0",
          "--config.eval.before_after=False",
          f"--config.rollout.tasks_per_step={FLAGS.tasks_per_step}",
          f"--config.rollout.samples_per_task={FLAGS.samples_per_task}",
          "--config.checkpoint.every=1000"]
  r = subprocess.run(args, capture_output=True, text=True)
  if r.returncode:
    raise SystemExit(f"{mode} run failed:\n{r.stderr[-4000:]}")
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  trials = 0
  with open(os.path.join(workdir, "trials.jsonl")) as f:
    trials = sum(1 for line in f if '"phase": "rl"' in line)
  return {"trials": trials, "rl_s": summary["rl_s"],
          "trials_per_hour": 3600.0 * trials / summary["rl_s"],
          "learner_utilisation": summary["learner_utilisation"],
          "rl_cpu_s": summary["rl_cpu_s"],
          "cpu_utilisation": summary["rl_cpu_s"] / (summary["rl_s"] * cpu_time.usable_cores())}


def main(argv):
  del argv
  root = FLAGS.workdir or tempfile.mkdtemp(prefix="legorl_e2e_")
  res = {m: run_mode(m, os.path.join(root, m)) for m in ("sync", "async")}
  print(f"{'mode':6} {'trials':>7} {'seconds':>8} {'trials/h':>9} {'learner util':>13} {'CPU util':>9}")
  for m, r in res.items():
    print(f"{m:6} {r['trials']:7d} {r['rl_s']:8.1f} {r['trials_per_hour']:9.0f} "
          f"{r['learner_utilisation']:13.2%} {r['cpu_utilisation']:9.2%}")
  out = {"benchmark": "end_to_end", "steps": FLAGS.steps, "tasks_per_step": FLAGS.tasks_per_step,
         "samples_per_task": FLAGS.samples_per_task, "cores": cpu_time.usable_cores(),
         "load_avg_1m": common.load_avg_1m(), **res,
         "async_over_sync_trials_per_hour": res["async"]["trials_per_hour"] / res["sync"]["trials_per_hour"],
         "async_bound_from_idle_cpu": 1.0 / res["sync"]["cpu_utilisation"]}
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
