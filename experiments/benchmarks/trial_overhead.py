r"""Per-trial overhead of the harness path: sandbox creation, harness run, verification.

Runs the scripted gold-patch policy through the built-in harness in the local sandbox on
synthetic tasks (the policy costs nothing, so what remains is the overhead every RL trial
pays), sequentially and with concurrency, and prints medians per phase.

  python -m experiments.benchmarks.trial_overhead --trials=24
"""

import os
import statistics
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_integer("trials", 24, "Trials per setting.")
flags.DEFINE_integer("concurrency", 4, "Concurrent trials in the second setting.")
flags.DEFINE_string("backend", "local", "Sandbox backend.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from legorl_jax.harnesses.builtin import BuiltinAdapter
  from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.rollout.runner import TrialJob, run_trials
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.taskgen import synthetic
  from legorl_jax.trainer.policy_service import scripted_proxy

  tasks = synthetic.generate_tasks(FLAGS.trials, seed=0, difficulty="hinted")
  tok = tok_lib.load_tokenizer()
  root = tempfile.mkdtemp(prefix="legorl_overhead_")
  proxy = scripted_proxy(tok, ScriptedPolicy(patches_by_instruction(tasks)).reply, root)
  cfg = TrialConfig(sandbox=SandboxConfig(backend=FLAGS.backend), keep_trajectory_files=False)
  out = {"benchmark": "trial_overhead", "backend": FLAGS.backend, "trials": FLAGS.trials,
         "load_avg_1m": common.load_avg_1m()}
  try:
    for conc in (1, FLAGS.concurrency):
      jobs = [TrialJob(t, BuiltinAdapter(), group=i) for i, t in enumerate(tasks)]
      t0 = time.perf_counter()
      res = run_trials(jobs, proxy, cfg, os.path.join(root, f"c{conc}"), concurrency=conc)
      wall = time.perf_counter() - t0
      med = {k: statistics.median(r.durations[k] for r in res if k in r.durations)
             for k in ("sandbox_s", "harness_s", "verify_s", "total_s")}
      solved = sum(r.status == "solved" for r in res)
      out[f"concurrency_{conc}"] = {**{f"median_{k}": round(v, 4) for k, v in med.items()},
                                    "solved": solved, "trials_per_minute": round(60 * len(res) / wall, 1)}
      print(f"concurrency {conc}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in med.items())
            + f"; {60 * len(res) / wall:.0f} trials/min; solved {solved}/{len(res)}")
  finally:
    proxy.stop()
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
