r"""Faults of trials on a Ray cluster: a worker node killed mid-step, and Docker trials on a
cluster where some nodes have no Docker. Real parts throughout: a local multi-node cluster
(``ray.cluster_utils.Cluster``: one raylet and object store per node), the built-in harness,
local (bubblewrap) or Docker sandboxes, the scripted policy behind the proxy.

  python -m experiments.benchmarks.ray_faults --jobs=12 --nodes=4

``node_death``: ``--jobs`` trials at concurrency ``--nodes // 2``; when the harnesses have made
``--kill_at`` model calls (that reply held 3 s), every node with a trial in flight loses its
raylet (SIGKILL; the calling harness's node is one of them); the other nodes take the retries.
(No node is added meanwhile: ``Cluster.add_node`` from the proxy's thread hung here, with the
retries waiting for a node, for minutes.) Every job must end with exactly one final record;
an attempt on the killed node either finished before its worker died or is ``sandbox_error``
(infrastructure) and retried elsewhere (at least one must be); every non-final record is such
a failure; no process or sandbox directory may outlive the run. ``no_docker`` (when a Docker engine is up): Docker
trials on a cluster where one node of ``--nodes`` declares a ``sandbox`` slot all run there.

Prints one JSON line with both scenarios' counts and ``ok``.
"""

import collections
import json
import os
import shutil
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_integer("jobs", 12, "Trials in the node-death scenario.")
flags.DEFINE_integer("nodes", 4, "Worker nodes of one CPU each; trials run nodes // 2 at a time, "
                     "so the nodes that survive the kill can take the retries.")
flags.DEFINE_integer("kill_at", 4, "Model calls before the node is killed.")
FLAGS = flags.FLAGS


def _records(out_dir):
  with open(os.path.join(out_dir, "trials.jsonl")) as f:
    return [json.loads(line) for line in f]


def node_death(cluster, proxy, policy, tasks, root):
  from legorl_jax.harnesses.builtin import BuiltinAdapter
  from legorl_jax.rollout import ray_worker
  from legorl_jax.rollout.ray_backend import RayOptions, RayTrialBackend
  from legorl_jax.rollout.runner import TrialJob, run_trials
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from tests.reliability import faultkit

  marker = f"ray-faults-{os.getpid()}"
  base_dir = os.path.join(root, "sandboxes")
  os.makedirs(base_dir)
  inflight, killed = {}, []  # trial id -> node, for attempts started and not yet returned

  def kill():  # every node with an attempt in flight: the calling harness's is one of them
    doomed = set(inflight.values())
    for node in [n for n in cluster.worker_nodes if n.node_id in doomed]:
      cluster.remove_node(node, allow_graceful=False)
      killed.append(node.node_id)

  policy.arm(kill, at=FLAGS.kill_at, delay_s=3.0)
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1"))
  backend.on_start = lambda trial_id, node: inflight.__setitem__(trial_id, node)
  run_attempt = backend.run_attempt

  def tracked(*args, **kwargs):
    res = run_attempt(*args, **kwargs)
    inflight.pop(res.trial_id, None)
    return res

  backend.run_attempt = tracked
  cfg = TrialConfig(harness_timeout_s=120, sandbox=SandboxConfig(
      backend="local", base_dir=base_dir, env={faultkit.RUN_ENV: marker}))
  jobs = [TrialJob(t, BuiltinAdapter(), group=i, seed=i) for i, t in enumerate(tasks)]
  out = os.path.join(root, "node_death")
  t0 = time.perf_counter()
  try:
    results = run_trials(jobs, proxy, cfg, out, concurrency=FLAGS.nodes // 2, max_retries=2,
                         backend=backend)
  finally:
    backend.close()
  wall = time.perf_counter() - t0
  lines = _records(out)
  finals = collections.Counter(line["group"] for line in lines if line["final"])
  on_killed = [line for line in lines if line["node"] in killed]
  # An attempt on the killed node either finished before its worker died (a normal record:
  # the worker sends its result straight to the driver) or is infrastructure and retried;
  # every attempt that is not final is such a failure.
  died = [line for line in on_killed if line["status"] == "sandbox_error"]
  infra_retried = bool(died) and all(not line["final"] for line in died) and all(
      line["status"] == "sandbox_error" and line["node"] in killed
      for line in lines if not line["final"])
  deadline = time.monotonic() + 20  # the next trial on the machine would sweep; do it here
  while os.listdir(base_dir) and time.monotonic() < deadline:
    ray_worker.sweep_dead_trials(cfg.sandbox)
    time.sleep(0.25)
  leaked = faultkit.leaks(marker, base_dir, docker=False)
  lost = sum(1 for g in range(len(jobs)) if finals[g] == 0)
  doubled = sum(1 for g in range(len(jobs)) if finals[g] > 1)
  statuses = collections.Counter(r.status for r in results)
  ok = (bool(killed) and policy.hook_error is None and lost == 0 and doubled == 0
        and infra_retried and not leaked
        and statuses == {"solved": len(jobs)})
  return {"jobs": len(jobs), "attempts": len(lines), "killed_nodes": len(killed),
          "attempts_on_killed_node": len(on_killed), "died_with_the_node": len(died),
          "all_infrastructure_and_retried": infra_retried,
          "lost": lost, "double_counted": doubled, "final_statuses": dict(statuses),
          "leaked": leaked, "wall_s": round(wall, 2), "ok": ok}


def no_docker(cluster, proxy, policy, tasks, root):
  from legorl_jax.harnesses.builtin import BuiltinAdapter
  from legorl_jax.rollout.ray_backend import RayOptions, RayTrialBackend
  from legorl_jax.rollout.runner import TrialJob, run_trials
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig

  policy.arm()
  docker_nodes = {n["NodeID"] for n in __import__("ray").nodes()
                  if n["Alive"] and n["Resources"].get("sandbox")}
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1"))
  cfg = TrialConfig(harness_timeout_s=120, sandbox=SandboxConfig(backend="docker"))
  jobs = [TrialJob(t, BuiltinAdapter(), group=i) for i, t in enumerate(tasks)]
  try:
    results = run_trials(jobs, proxy, cfg, os.path.join(root, "no_docker"),
                         concurrency=FLAGS.nodes // 2, backend=backend)
  finally:
    backend.close()
  nodes = {r.node for r in results}
  solved = sum(r.status == "solved" for r in results)
  return {"jobs": len(jobs), "docker_nodes": len(docker_nodes), "solved": solved,
          "ran_only_on_docker_nodes": nodes <= docker_nodes,
          "ok": nodes <= docker_nodes and solved == len(jobs)}


def main(argv):
  del argv
  import ray
  from ray.cluster_utils import Cluster

  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.taskgen import synthetic
  from legorl_jax.trainer.policy_service import scripted_proxy
  from tests.reliability import faultkit

  tasks = synthetic.generate_tasks(FLAGS.jobs, seed=3, difficulty="hinted")
  root = tempfile.mkdtemp(prefix="legorl_ray_faults_")
  policy = faultkit.FaultPolicy(tasks)
  proxy = scripted_proxy(tok_lib.load_tokenizer(), policy.reply, root)
  plain = dict(num_cpus=1, object_store_memory=80 << 20)
  cluster = Cluster(initialize_head=True, head_node_args=dict(
      num_cpus=0, include_dashboard=False, object_store_memory=80 << 20))
  cluster.add_node(num_cpus=1, resources={"sandbox": 1}, object_store_memory=80 << 20)
  for _ in range(FLAGS.nodes - 1):
    cluster.add_node(**plain)
  ray.init(address=cluster.address, log_to_driver=False, logging_level="warning")
  cluster.wait_for_nodes()
  out = {"benchmark": "ray_faults", "nodes": FLAGS.nodes, "load_avg_1m": common.load_avg_1m()}
  try:
    if faultkit.docker_client() is not None:
      out["no_docker"] = no_docker(cluster, proxy, policy, tasks[:FLAGS.nodes], root)
    else:
      out["no_docker"] = {"skipped": "no Docker engine"}
    out["node_death"] = node_death(cluster, proxy, policy, tasks, root)
  finally:
    proxy.stop()
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(root, ignore_errors=True)
  out["ok"] = all(v.get("ok", True) for k, v in out.items() if isinstance(v, dict))
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
