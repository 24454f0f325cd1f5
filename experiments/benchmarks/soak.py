r"""Soak: many trials through the real stack, then count what was lost or left behind.

Runs ``--trials`` trials (``--concurrency`` at a time) of the built-in harness in the local
sandbox against the tiny random policy (real sampling engine behind the real proxy). The first
``--warmup`` trials warm everything up (compilation, caches, thread pools); then the process's
open file descriptors, resident memory and child processes are measured, halfway through the
rest again (to tell a plateau from a slope), and at the end. Reports lost trials (jobs without
a final line in ``trials.jsonl``), leaked processes (our descendants, or processes running as
the uid of a sandbox this process made), leftover sandbox directories, leaked file descriptors
and RSS growth.

  python -m experiments.benchmarks.soak --trials=200 --concurrency=16
"""

import collections
import gc
import json
import os
import shutil
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_integer("trials", 200, "Trials in all (warm-up included).")
flags.DEFINE_integer("concurrency", 16, "Trials running at once.")
flags.DEFINE_integer("warmup", 32, "Trials before the baseline is measured.")
flags.DEFINE_integer("tasks", 16, "Distinct synthetic tasks the trials cycle over.")
flags.DEFINE_integer("max_turns", 3, "Agent turns per trial.")
flags.DEFINE_integer("max_tokens", 32, "Sampled tokens per call (cap).")
flags.DEFINE_integer("max_len", 4096, "Engine context length.")
flags.DEFINE_string("workdir", None, "Output directory (default: a temp dir, removed).")
FLAGS = flags.FLAGS


def rss_bytes() -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  return 0


def open_fds() -> int:
  return len(os.listdir("/proc/self/fd"))


def _status(pid: str) -> dict[str, str]:
  out = {}
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        k, _, v = line.partition(":")
        out[k] = v.strip()
  except OSError:
    pass
  return out


def descendants(root: int) -> list[int]:
  """Live (non-zombie) processes whose parent chain reaches ``root``."""
  parent = {}
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      st = _status(pid)
      if st.get("PPid") and not st.get("State", "").startswith("Z"):
        parent[int(pid)] = int(st["PPid"])
  out = []
  for pid in parent:
    p = parent.get(pid)
    while p is not None and p not in (0, 1):
      if p == root:
        out.append(pid)
        break
      p = parent.get(p)
  return sorted(out)


def cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
  except OSError:
    return "?"


def measure() -> dict:
  gc.collect()
  time.sleep(1.0)  # let the kernel finish tearing down the last namespaces
  from legorl_jax.sandbox import local
  procs = sorted(set(descendants(os.getpid())) | set(local.own_sandbox_processes()))
  return {"fds": open_fds(), "rss": rss_bytes(), "procs": [cmdline(p) for p in procs]}


def main(argv):
  del argv
  from legorl_jax.harnesses.builtin import BuiltinAdapter
  from legorl_jax.models import create_model, get_preset
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer
  from legorl_jax.rollout.runner import TrialJob, run_trials
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sampling import Engine
  from legorl_jax.sandbox import SandboxConfig, local
  from legorl_jax.taskgen import synthetic

  root = FLAGS.workdir or tempfile.mkdtemp(prefix="legorl_soak_")
  os.makedirs(root, exist_ok=True)
  sock_dir = tempfile.mkdtemp(prefix="lgsoak-", dir="/tmp")
  os.chmod(sock_dir, 0o755)
  sandbox_base = os.path.join(root, "sandboxes")
  tok = tok_lib.load_tokenizer()
  cfg = get_preset("tiny").replace(max_position_embeddings=max(FLAGS.max_len, 4096))
  engine = Engine(create_model(cfg, seed=0), max_batch=FLAGS.concurrency, max_len=FLAGS.max_len,
                  prefill_buckets=(1024, FLAGS.max_len), decode_chunk=16, seed=0, decode_fn=tok)
  engine.start()
  proxy = ProxyServer(EngineBackend(engine), tok,
                      ProxyConfig(model_name="policy", force_temperature=1.0,
                                  max_tokens_cap=FLAGS.max_tokens),
                      port=None, uds=os.path.join(sock_dir, "proxy.sock")).start()
  tasks = synthetic.generate_tasks(FLAGS.tasks, seed=0, difficulty="easy")
  trial_cfg = TrialConfig(harness_timeout_s=300.0, max_turns=FLAGS.max_turns,
                          sandbox=SandboxConfig(backend="local", base_dir=sandbox_base),
                          keep_trajectory_files=False)
  adapter = BuiltinAdapter(max_tokens=FLAGS.max_tokens)
  jobs = [TrialJob(tasks[i % len(tasks)], adapter, group=i) for i in range(FLAGS.trials)]
  out_dir = os.path.join(root, "trials")
  before = measure()
  t0 = time.perf_counter()
  results = run_trials(jobs[:FLAGS.warmup], proxy, trial_cfg, out_dir,
                       concurrency=FLAGS.concurrency, max_retries=0)
  warm = measure()
  t1 = time.perf_counter()
  mid_at = FLAGS.warmup + (len(jobs) - FLAGS.warmup) // 2  # a second point shows a plateau vs a slope
  results += run_trials(jobs[FLAGS.warmup:mid_at], proxy, trial_cfg, out_dir,
                        concurrency=FLAGS.concurrency, max_retries=0)
  mid = measure()
  results += run_trials(jobs[mid_at:], proxy, trial_cfg, out_dir,
                        concurrency=FLAGS.concurrency, max_retries=0)
  t2 = time.perf_counter()
  end = measure()
  leftover_dirs = sorted(os.listdir(sandbox_base)) if os.path.isdir(sandbox_base) else []
  proxy.stop()
  engine.stop()
  shutil.rmtree(sock_dir, ignore_errors=True)

  with open(os.path.join(out_dir, "trials.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  final = [r for r in lines if r["final"]]
  statuses = collections.Counter(r["status"] for r in final)
  lost = len(jobs) - len(final) + sum(1 for r in results if not r.status)
  out = {
      "benchmark": "soak", "trials": len(jobs), "concurrency": FLAGS.concurrency,
      "warmup": FLAGS.warmup, "max_turns": FLAGS.max_turns, "max_tokens": FLAGS.max_tokens,
      "lost_trials": lost, "statuses": dict(sorted(statuses.items())),
      "leaked_processes": len(end["procs"]), "leaked_process_cmdlines": end["procs"][:10],
      "processes_after_warmup": len(warm["procs"]),
      "leftover_sandbox_dirs": len(leftover_dirs),
      "fds": {"before": before["fds"], "after_warmup": warm["fds"], "mid": mid["fds"], "end": end["fds"]},
      "leaked_fds": end["fds"] - warm["fds"],
      "rss_mb": {k: round(m["rss"] / 2**20, 1) for k, m in
                 (("before", before), ("after_warmup", warm), ("mid", mid), ("end", end))},
      "rss_growth_after_warmup": round(end["rss"] / warm["rss"] - 1.0, 4),
      "rss_growth_second_half": round(end["rss"] / mid["rss"] - 1.0, 4),
      "trials_per_min": round(60 * len(jobs) / (t2 - t0), 1),
      "trials_per_min_after_warmup": round(60 * (len(jobs) - FLAGS.warmup) / (t2 - t1), 1),
      "sampled_tokens": sum(r.sampled_tokens for r in results),
      "wall_s": round(t2 - t0, 1), "load_avg_1m": common.load_avg_1m(),
      "bwrap": local.bwrap_path() is not None,
  }
  if not FLAGS.workdir:
    shutil.rmtree(root, ignore_errors=True)
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
