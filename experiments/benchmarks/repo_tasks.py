r"""Tasks built from real PyPI projects, solved by the scripted gold-patch policy (or a model).

For each task file (as ``experiments.make_tasks --pypi=NAME==VERSION --out=FILE`` writes it)
draws a seeded sample of ``--sample`` tasks and runs ``experiments.eval`` with the scripted
policy (``--policy``: or a Hugging Face checkpoint directory, e.g. a demo run's ``sft_policy``
or its ``experiments.export``) through each harness on the Docker backend. Prints one JSON line:
per project the task count, the build report's figures (when ``FILE`` minus ``.jsonl`` plus
``.json`` holds the report make_tasks printed), and per harness the solve rate and the verifier
seconds per trial (the verifier's wall time inside the trial: hidden tests copied in, suite run,
results read).

  python -m experiments.benchmarks.repo_tasks --tasks=/tmp/b/inflection.jsonl,/tmp/b/parse.jsonl \
      --harnesses=builtin,mini-swe-agent --sample=20
  python -m experiments.benchmarks.repo_tasks --tasks=... --harnesses=builtin \
      --policy=/tmp/legorl_demo/sft_policy --temperature=0.6 --sample=5
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_list("tasks", None, "Task JSONL files built by make_tasks --from_repo/--pypi.", required=True)
flags.DEFINE_list("harnesses", ["builtin", "mini-swe-agent"], "Harnesses to run the scripted policy in.")
flags.DEFINE_integer("sample", 20, "Tasks drawn per file (all when fewer).")
flags.DEFINE_integer("seed", 0, "Sample seed.")
flags.DEFINE_string("sandbox", "docker", "Sandbox backend.")
flags.DEFINE_integer("concurrency", 2, "Concurrent trials.")
flags.DEFINE_string("workdir", None, "Where eval runs write (default: a temporary directory).")
flags.DEFINE_string("policy", "scripted", "scripted (gold patches) or a Hugging Face checkpoint directory.")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature of a model policy.")
flags.DEFINE_integer("max_turns", 12, "Harness turn budget per trial.")
flags.DEFINE_integer("max_tokens", 512, "Tokens per model call (a model policy).")
FLAGS = flags.FLAGS


def _stats(xs):
  xs = sorted(xs)
  if not xs:
    return {}
  return {"n": len(xs), "median": round(statistics.median(xs), 3), "mean": round(statistics.fmean(xs), 3),
          "min": round(xs[0], 3), "max": round(xs[-1], 3)}


def main(argv):
  del argv
  root = FLAGS.workdir or tempfile.mkdtemp(prefix="legorl_repo_tasks_")
  os.makedirs(root, exist_ok=True)
  out = {"benchmark": "repo_tasks", "sandbox": FLAGS.sandbox, "sample": FLAGS.sample,
         "policy": FLAGS.policy, "temperature": FLAGS.temperature, "max_turns": FLAGS.max_turns,
         "projects": {}}
  for path in FLAGS.tasks:
    lines = [l for l in open(path) if l.strip()]
    name = os.path.basename(path).removesuffix(".jsonl")
    entry = {"tasks": len(lines)}
    report = path.removesuffix(".jsonl") + ".json"
    if os.path.isfile(report) and os.path.getsize(report):
      r = json.loads(open(report).read().strip().splitlines()[-1])  # TFDS may print before it
      entry["build"] = {k: r.get(k) for k in ("project", "version", "baseline_tests", "baseline_s", "functions",
                                              "mutations_tried", "kept", "rejected", "kept_by_family",
                                              "image_s", "mutation_phase_s", "validation_s", "wall_s",
                                              "verifier_s")}
    sample = random.Random(FLAGS.seed).sample(lines, min(FLAGS.sample, len(lines)))
    sample_path = os.path.join(root, f"{name}.sample.jsonl")
    with open(sample_path, "w") as f:
      f.writelines(sample)
    entry["harnesses"] = {}
    for harness in FLAGS.harnesses:
      wd = os.path.join(root, f"{name}.{harness}")
      t0 = time.perf_counter()
      p = subprocess.run([sys.executable, "-m", "experiments.eval", "--config=experiments/configs/eval.py",
                          f"--workdir={wd}", f"--config.harness={harness}", f"--config.policy={FLAGS.policy}",
                          f"--config.sandbox={FLAGS.sandbox}", f"--config.tasks={sample_path}",
                          f"--config.concurrency={FLAGS.concurrency}", f"--config.max_turns={FLAGS.max_turns}",
                          f"--config.temperature={FLAGS.temperature}", f"--config.max_tokens={FLAGS.max_tokens}"],
                         capture_output=True, text=True)
      res = {"wall_s": round(time.perf_counter() - t0, 1), "rc": p.returncode}
      if p.returncode != 0:
        res["error"] = p.stderr[-800:]
      else:
        summary = json.load(open(os.path.join(wd, "summary.json")))
        trials = [json.loads(l) for l in open(os.path.join(wd, "trials.jsonl"))]
        final = [t for t in trials if t.get("final", True)]
        res.update(solve_rate=summary["solve_rate"], n_trials=summary["n_trials"],
                   status_counts=summary["status_counts"],
                   verifier_s=_stats([t["verifier"]["duration_s"] for t in final if t.get("verifier")]),
                   verifier_tests_s=_stats([t["verifier"]["tests_duration_s"] for t in final if t.get("verifier")]))
      entry["harnesses"][harness] = res
    out["projects"][name] = entry
  out["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
  common.emit(out, sort_keys=True)


if __name__ == "__main__":
  app.run(main)
