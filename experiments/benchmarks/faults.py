r"""Fault injection: every fault scenario of ``tests/reliability`` injected into real runs.

Each scenario runs real trials (built-in harness, Codex, the tiny policy in a real engine;
local bubblewrap and Docker sandboxes), the real learner or the whole ``experiments.train``
pipeline, injects one fault, and checks that every trial is accounted for in ``trials.jsonl``
with a status, that no sandbox dir, container or process is left behind, and that
checkpoints stay readable / the resumed run matches.
Prints a table, then one JSON line with ``lost_trials``, ``leaked`` and per-fault outcomes.

  python -m experiments.benchmarks.faults                  # everything available here
  python -m experiments.benchmarks.faults --skip=trainer_kill,engine_raises
  python -m experiments.benchmarks.faults --only=pipeline_kill   # ~4 minutes on 2 cores

Needs root for the tmpfs (disk full) scenario and a Docker engine for the Docker ones
(``bash .ci/setup_system.sh``); unavailable ones are reported as skipped. The Docker restart
scenario restarts the host's dockerd (SIGTERM, then starts it again the way the setup script
does).
"""

import os
import shutil
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_list("skip", [], "Scenario names to skip.")
flags.DEFINE_list("only", [], "Run only these scenario names.")
flags.DEFINE_string("root", None, "Scratch directory (default: a new temp dir, removed after).")
FLAGS = flags.FLAGS


def _scenarios(fk, env, docker: bool, tiny):
  """(name, backend, thunk) for every scenario; thunk() -> Outcome."""
  from legorl_jax.harnesses.codex import CodexAdapter
  from tests.reliability import killkit as kk
  from tests.reliability import proxykit as pk

  out = []
  backends = ["local"] + (["docker"] if docker else [])
  for b in backends:
    out += [("harness_sigkill", b, lambda b=b: fk.harness_sigkill(env, b)),
            ("harness_hang", b, lambda b=b: fk.harness_hang(env, b)),
            ("harness_flood", b, lambda b=b: fk.harness_flood(env, b)),
            ("sandbox_oom", b, lambda b=b: fk.sandbox_oom(env, b)),
            ("sandbox_tiny_memory", b, lambda b=b: fk.sandbox_tiny_memory(env, b)),
            ("verifier_crash", b, lambda b=b: fk.verifier_crash(env, b)),
            ("verifier_hang", b, lambda b=b: fk.verifier_hang(env, b))]
  codex = CodexAdapter()
  if codex.executable() is not None:
    out.append(("harness_sigkill_codex", "local", lambda: fk.harness_sigkill(
        env, "local", codex, match=fk.is_codex, workdir_prefix="/workspace", timeout_s=240.0)))
  if docker:
    out += [("container_removed", "docker", lambda: fk.container_removed(env)),
            ("docker_restart", "docker", lambda: fk.docker_restart(env))]
  out.append(("proxy_bad_bodies", "local", lambda: pk.proxy_bad_bodies(env)))
  out.append(("engine_raises", "local", lambda: pk.engine_raises(env, tiny().engine, tiny().proxy)))

  def disk_full(async_save):
    disk = os.path.join(env.root, f"disk-{int(async_save)}")
    os.makedirs(disk)
    why = kk.mount_small_disk(disk)
    if why:
      raise _Skip(why)
    try:
      return kk.checkpoint_disk_full(disk, async_save)
    finally:
      kk.unmount(disk)

  out += [("checkpoint_disk_full", "sync", lambda: disk_full(False)),
          ("checkpoint_disk_full", "async", lambda: disk_full(True))]

  def trainer():
    d = os.path.join(env.root, "trainer")
    os.makedirs(d)
    return kk.trainer_kill(d)

  out.append(("trainer_kill", "sync", trainer))

  def pipeline():
    d = os.path.join(env.root, "pipeline")
    os.makedirs(d)
    return kk.pipeline_kill(d)

  out.append(("pipeline_kill", "local", pipeline))
  return out


class _Skip(Exception):
  pass


def main(argv):
  del argv
  import functools
  import types

  from legorl_jax.models import create_model, get_preset
  from legorl_jax.models.tokenizer import load_tokenizer
  from legorl_jax.proxy import EngineBackend, ProxyConfig, ScriptedBackend
  from legorl_jax.sampling import Engine
  from legorl_jax.taskgen.synthetic import generate_tasks
  from tests.harnesses.conftest import start_proxy, stop_proxy
  from tests.reliability import faultkit as fk

  root = FLAGS.root or tempfile.mkdtemp(prefix="legorl_faults_")
  tasks = generate_tasks(2, seed=21, difficulty="easy")
  tok = load_tokenizer()
  policy = fk.FaultPolicy(tasks)
  proxy = start_proxy(ScriptedBackend(tok, policy.reply), tok, ProxyConfig(model_name="policy"))
  env = fk.FaultEnv(tasks, proxy, policy, root)
  docker = fk.docker_client() is not None
  made = []

  @functools.lru_cache(maxsize=1)
  def tiny():
    model = create_model(get_preset("tiny").replace(max_position_embeddings=4096), seed=0)
    engine = Engine(model, max_batch=2, max_len=4096, prefill_buckets=(512, 2048),
                    prefill_rows=(1,), decode_rows=(2,), attn_buckets=(2048, 4096),
                    decode_chunk=16, seed=0, decode_fn=tok).start()
    p = start_proxy(EngineBackend(engine), tok, ProxyConfig(
        model_name="policy", force_temperature=1.0, max_tokens_cap=32))
    made.append((engine, p))
    return types.SimpleNamespace(engine=engine, proxy=p)

  rows, skipped = [], []
  t0 = time.perf_counter()
  try:
    for name, backend, thunk in _scenarios(fk, env, docker, tiny):
      if name in FLAGS.skip or (FLAGS.only and name not in FLAGS.only):
        continue
      try:
        o = thunk()
      except _Skip as e:
        skipped.append({"fault": name, "backend": backend, "why": str(e)})
        continue
      except Exception as e:  # noqa: BLE001 -- a scenario that crashes is a failed scenario
        o = fk.Outcome(fault=name, backend=backend, harness="-", attempts=[], final=[], lost=0,
                       leaked=[], ok=False, detail=f"scenario raised {type(e).__name__}: {e}")
      o.fault = name
      rows.append(o)
      print(f"{name:24s} {backend:7s} {'ok' if o.ok else 'FAIL':5s} {o.wall_s:7.1f}s  "
            f"attempts={','.join(o.attempts) or '-'}  lost={o.lost} leaked={len(o.leaked)}"
            + (f"\n    {o.detail[:400]}" if not o.ok else ""), flush=True)
  finally:
    for engine, p in made:
      stop_proxy(p)
      engine.stop()
    stop_proxy(proxy)
    if not FLAGS.root:
      shutil.rmtree(root, ignore_errors=True)

  print()
  print(f"{'fault':24s} {'backend':7s} {'result':6s} {'wall_s':>7s}  {'lost':>4s} {'leaked':>6s}  attempts")
  for o in rows:
    print(f"{o.fault:24s} {o.backend:7s} {'ok' if o.ok else 'FAIL':6s} {o.wall_s:7.1f}  "
          f"{o.lost:4d} {len(o.leaked):6d}  {' -> '.join(o.attempts) or '-'}")
  for s in skipped:
    print(f"{s['fault']:24s} {s['backend']:7s} skipped: {s['why']}")
  out = {
      "benchmark": "faults",
      "scenarios": len(rows),
      "passed": sum(o.ok for o in rows),
      "lost_trials": sum(o.lost for o in rows),
      "leaked": sum(len(o.leaked) for o in rows),
      "wall_s": round(time.perf_counter() - t0, 1),
      "faults": [{"fault": o.fault, "backend": o.backend, "harness": o.harness, "ok": o.ok,
                  "attempts": o.attempts, "final": o.final, "lost": o.lost,
                  "leaked": len(o.leaked), "wall_s": o.wall_s} for o in rows],
      "skipped": skipped,
  }
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
