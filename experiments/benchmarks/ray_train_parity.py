"""The same training run with trials on the thread pool and on a local Ray cluster.

Runs ``experiments.train`` twice as child processes with one seed and one small tiny-preset
configuration (SFT, evaluations and ``--steps`` GRPO steps in the built-in harness, local
sandbox), once with ``rollout.backend=threads`` and once with ``rollout.backend=ray`` (a local
cluster started by the run). Ray moves where a trial runs, not what it samples: the policy's
tokens come from the same engine either way. Compares, per phase and step, the solve rates of
``summary.json`` and ``metrics.jsonl``, and every final ``trials.jsonl`` record (task, group,
status, reward, turns, token counts); timings and the Ray ``node`` are not compared. Prints
one JSON line: the figures of both runs, the records that differ and ``same``.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.ray_train_parity --steps 2
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from absl import app, flags

from experiments.benchmarks import common
from experiments.configs import demo_tiny
from legorl_jax.utils import safe_json

flags.DEFINE_integer("steps", 2, "GRPO steps of each run.")
flags.DEFINE_integer("seed", 0, "The runs' seed.")
flags.DEFINE_string("workdir", None, "Where the two runs go (default: a temporary directory).")
FLAGS = flags.FLAGS

# What a trial record must agree on (not timings, paths or the node it ran on).
FIELDS = ("task_id", "group", "status", "reward", "turns", "prompt_tokens", "sampled_tokens",
          "harness_status", "phase", "step", "mode", "final")


def _jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [safe_json.loads(line, what=path) for line in f if line.strip()]


def _run(workdir: str, backend: str, steps: int, seed: int) -> tuple[dict, float]:
  cmd = [sys.executable, "-m", "experiments.train", "--config=experiments/configs/demo_tiny.py",
         f"--workdir={workdir}", f"--config.trainer.steps={steps}", f"--config.seed={seed}",
         f"--config.rollout.backend={backend}", *demo_tiny.SMALL_RUN]
  with common.Timer() as t:
    r = subprocess.run(cmd, cwd=common.REPO, env=common.child_env(), capture_output=True,
                       text=True)
  if r.returncode != 0:
    raise RuntimeError(f"the {backend} run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
  return _figures(workdir), t.wall


def _figures(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = safe_json.load(f)
  metrics = _jsonl(os.path.join(workdir, "metrics.jsonl"))
  trials = [r for r in _jsonl(os.path.join(workdir, "trials.jsonl")) if r.get("final", True)]
  rates = {k: v for k, v in summary.items() if "solve" in k and isinstance(v, (int, float))}
  train = [m.get("solve_rate") for m in metrics if m.get("phase") == "train"]
  keyed = sorted((tuple(str(r.get(k)) for k in FIELDS) for r in trials))
  return dict(summary_rates=rates, train_solve_rates=train, records=keyed,
              nodes=sorted({r.get("node", "") for r in trials}))


def main(argv):
  del argv
  args = FLAGS
  root = args.workdir or tempfile.mkdtemp(prefix="ray_parity_")
  out = {}
  for backend in ("threads", "ray"):
    out[backend], out[f"{backend}_wall_s"] = _run(os.path.join(root, backend), backend,
                                                  args.steps, args.seed)
  a, b = out["threads"], out["ray"]
  differ = sorted(set(a["records"]) ^ set(b["records"]))
  common.emit(dict(
      benchmark="ray_train_parity", steps=args.steps, seed=args.seed,
      records=len(a["records"]), records_ray=len(b["records"]), records_differing=len(differ),
      first_differing=[list(d) for d in differ[:4]],
      summary_rates_threads=a["summary_rates"], summary_rates_ray=b["summary_rates"],
      train_solve_rates_threads=a["train_solve_rates"],
      train_solve_rates_ray=b["train_solve_rates"], ray_nodes=b["nodes"],
      wall_s_threads=round(out["threads_wall_s"], 1), wall_s_ray=round(out["ray_wall_s"], 1),
      same=(not differ and a["summary_rates"] == b["summary_rates"]
            and a["train_solve_rates"] == b["train_solve_rates"]),
      load_avg_1m=common.load_avg_1m()))


if __name__ == "__main__":
  app.run(main)
