r"""What running trials on Ray costs on one host: scripted trials per minute, thread pool vs a
local Ray cluster at the same concurrency, and the trial-start latency Ray adds.

The scripted gold-patch policy solves synthetic tasks through the built-in harness in the local
sandbox (the policy costs nothing, so what remains is the per-trial overhead every RL trial
pays). Both sides run the same jobs, alternating thread pool and Ray for ``--rounds`` rounds
(load on a shared host shifts between minutes; alternating spreads it over both), after one
warm-up round each (Ray starts its worker processes on first use). The Ray side is a local
cluster (``ray.init(num_cpus=concurrency)``) with every trial declaring one CPU, so Ray runs
``concurrency`` trials at once like the pool; the proxy is reached over TCP through each
trial's forwarder, as on a real cluster.

  python -m experiments.benchmarks.ray_trials --trials=16 --concurrency=8 --rounds=2

Prints one JSON line: trials per minute of each side (median over rounds), their ratio
(``ray_vs_threads``: 0.9 means Ray gives 90% of the pool's rate), the median ``start_s`` of
Ray attempts (submission to the trial running on its worker), the cluster's start-up seconds,
and solved counts (all must be solved on both sides).
"""

import os
import shutil
import statistics
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_integer("trials", 16, "Trials per round and side.")
flags.DEFINE_integer("concurrency", 8, "Trials in flight, both sides.")
flags.DEFINE_integer("rounds", 2, "Measured rounds per side (after one warm-up round each).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  import ray

  from legorl_jax.harnesses.builtin import BuiltinAdapter
  from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.rollout.ray_backend import RayOptions, RayTrialBackend
  from legorl_jax.rollout.runner import TrialJob, run_trials
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.taskgen import synthetic
  from legorl_jax.trainer.policy_service import scripted_proxy

  conc = FLAGS.concurrency
  tasks = synthetic.generate_tasks(FLAGS.trials, seed=0, difficulty="hinted")
  root = tempfile.mkdtemp(prefix="legorl_ray_bench_")
  proxy = scripted_proxy(tok_lib.load_tokenizer(), ScriptedPolicy(patches_by_instruction(tasks)).reply,
                         root)
  cfg = TrialConfig(sandbox=SandboxConfig(backend="local"), keep_trajectory_files=False)
  jobs = [TrialJob(t, BuiltinAdapter(), group=i, seed=i) for i, t in enumerate(tasks)]
  t0 = time.perf_counter()
  backend = RayTrialBackend(RayOptions(local_num_cpus=conc, advertise_host="127.0.0.1"))
  backend.connect()
  cluster_start_s = time.perf_counter() - t0
  rates = {"threads": [], "ray": []}
  starts, solved = [], {"threads": 0, "ray": 0}
  out = {"benchmark": "ray_trials", "trials": FLAGS.trials, "concurrency": conc,
         "rounds": FLAGS.rounds, "load_avg_1m_before": common.load_avg_1m()}
  try:
    for rnd in range(FLAGS.rounds + 1):
      for side in ("threads", "ray"):
        t1 = time.perf_counter()
        res = run_trials(jobs, proxy, cfg, os.path.join(root, f"{side}{rnd}"), concurrency=conc,
                         backend=backend if side == "ray" else None)
        wall = time.perf_counter() - t1
        if rnd == 0:  # warm-up: Ray's worker processes start here
          continue
        rates[side].append(60 * len(res) / wall)
        solved[side] += sum(r.status == "solved" for r in res)
        if side == "ray":
          starts += [r.durations["start_s"] for r in res if "start_s" in r.durations]
        common.note({"round": rnd, "side": side, "trials_per_minute": round(rates[side][-1], 1)})
  finally:
    backend.close()
    proxy.stop()
    shutil.rmtree(root, ignore_errors=True)
  thr, ray_rate = statistics.median(rates["threads"]), statistics.median(rates["ray"])
  out.update({
      "threads_trials_per_minute": round(thr, 1), "ray_trials_per_minute": round(ray_rate, 1),
      "ray_vs_threads": round(ray_rate / thr, 3),
      "rates_by_round": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
      "ray_median_start_s": round(statistics.median(starts), 4) if starts else None,
      "ray_cluster_start_s": round(cluster_start_s, 2),
      "solved": solved, "measured_trials_per_side": FLAGS.trials * FLAGS.rounds,
      "load_avg_1m_after": common.load_avg_1m(), "ray_version": ray.__version__})
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
