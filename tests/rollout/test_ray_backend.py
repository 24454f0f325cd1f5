"""Trials on a real multi-node Ray cluster (``rollout.backend="ray"``), on this machine.

One module-scoped cluster: a head with no CPUs (nothing runs there) and two worker nodes of one
CPU each, only one of them declaring Docker (a ``sandbox`` slot, which Docker trials need), every
one its own raylet and object store, so a trial really is scheduled onto a
node, fetches its task from the object store, reaches the proxy over TCP and sends its record
back. The scripted policy solves through the built-in harness: the Ray backend must give the
same statuses, tokens and ``trials.jsonl`` records as the thread pool for the same seeds. The
node-kill test removes a worker node (SIGKILL of its raylet) while the harness waits on the
model: the attempt must be recorded as infrastructure with that node, retried on the other
node, counted once, and leave nothing behind. It runs last (the cluster gets its node back).
"""

import dataclasses
import glob
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from legorl_jax import errors  # noqa: E402
from legorl_jax.harnesses.builtin import BuiltinAdapter  # noqa: E402
from legorl_jax.models.tokenizer import load_tokenizer  # noqa: E402
from legorl_jax.proxy import ScriptedBackend  # noqa: E402
from legorl_jax.rewards import status as st  # noqa: E402
from legorl_jax.rollout import ray_worker  # noqa: E402
from legorl_jax.rollout.ray_backend import RayOptions, RayTrialBackend  # noqa: E402
from legorl_jax.rollout.runner import TrialJob, run_trials  # noqa: E402
from legorl_jax.rollout.trial import TrialConfig  # noqa: E402
from legorl_jax.sandbox import SandboxConfig  # noqa: E402
from legorl_jax.taskgen.synthetic import generate_tasks  # noqa: E402
from legorl_jax.trainer.policy_service import scripted_proxy  # noqa: E402
from tests.reliability import faultkit  # noqa: E402

# Two trial nodes: one with Docker (a `sandbox` slot), one without.
DOCKER_NODE = dict(num_cpus=1, resources={"sandbox": 1}, object_store_memory=80 << 20)
PLAIN_NODE = dict(num_cpus=1, object_store_memory=80 << 20)
# Fields of a trials.jsonl line that differ between any two runs, or say where it ran.
VOLATILE = ("trial_id", "durations", "log_paths", "trajectory_path", "node")


@pytest.fixture(scope="module")
def cluster():
  c = Cluster(initialize_head=True, head_node_args=dict(
      num_cpus=0, include_dashboard=False, object_store_memory=80 << 20))
  c.docker_node = c.add_node(**DOCKER_NODE).node_id
  c.add_node(**PLAIN_NODE)
  ray.init(address=c.address, log_to_driver=False, logging_level="warning")
  c.wait_for_nodes()
  yield c
  ray.shutdown()
  c.shutdown()


@pytest.fixture(scope="module")
def docker_engine():
  if faultkit.docker_client() is None:
    pytest.skip("no Docker engine (`bash .ci/setup_system.sh` starts one)")


@pytest.fixture(scope="module")
def tasks():
  return generate_tasks(3, seed=11, difficulty="hinted")


@pytest.fixture(scope="module")
def policy(tasks):
  return faultkit.FaultPolicy(tasks)


@pytest.fixture(scope="module")
def proxy(policy, tmp_path_factory):
  p = scripted_proxy(load_tokenizer(), policy.reply, str(tmp_path_factory.mktemp("sock")))
  yield p
  p.stop()


def _worker_nodes(c):
  return {n.node_id for n in c.worker_nodes}


def _records(out_dir):
  with open(os.path.join(out_dir, "trials.jsonl")) as f:
    return [json.loads(line) for line in f]


def _stable(rec):
  rec = {k: v for k, v in rec.items() if k not in VOLATILE}
  rec["verifier"] = {k: v for k, v in rec["verifier"].items() if "duration" not in k}
  return rec


@ray.remote(max_retries=0)
def _crash():
  os._exit(1)


def _ancestors(pid: int) -> set[int]:
  """The parent chain of a live process (empty once it is gone)."""
  out = set()
  while pid > 1:
    try:
      with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      break
    out.add(pid)
  return out


def _ours(path: str) -> bool:
  """Whether a worker directory may belong to this test's cluster: its owner (the pid in its
  name) is gone, or descends from this process. Another Ray cluster on the same host (a
  benchmark, a second test run) makes directories of the same names; they are not ours."""
  name = os.path.basename(path)
  for prefix in (ray_worker.TRIAL_PREFIX, ray_worker.FORWARDER_PREFIX):
    if name.startswith(prefix):
      try:
        pid = int(name[len(prefix):].split("-", 1)[0])
      except ValueError:
        return True
      return not os.path.exists(f"/proc/{pid}") or os.getpid() in _ancestors(pid)
  return True


def _leftovers():
  found = (glob.glob(f"/tmp/{ray_worker.TRIAL_PREFIX}*")
           + glob.glob(f"/tmp/{ray_worker.FORWARDER_PREFIX}*"))
  return [p for p in found if _ours(p)]


@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_same_results_as_the_thread_pool(cluster, tasks, policy, proxy, tmp_path, sandbox,
                                         request):
  if sandbox == "docker":
    request.getfixturevalue("docker_engine")
  policy.arm()
  cfg = TrialConfig(harness_timeout_s=60, sandbox=SandboxConfig(backend=sandbox))
  jobs = [TrialJob(t, BuiltinAdapter(), group=i, seed=100 + i) for i, t in enumerate(tasks)]
  before = set(_leftovers())
  local = run_trials(jobs, proxy, cfg, str(tmp_path / "threads"), concurrency=2)
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1"))
  remote = run_trials(jobs, proxy, cfg, str(tmp_path / "ray"), concurrency=2, backend=backend)
  backend.close()

  assert [r.status for r in local] == [st.SOLVED] * len(tasks)
  assert [r.status for r in remote] == [r.status for r in local]
  for a, b in zip(local, remote):
    assert b.trajectory is not None and b.sampled_tokens == a.sampled_tokens > 0
    assert [c.token_ids for c in b.trajectory.calls] == [c.token_ids for c in a.trajectory.calls]
  assert {r.node for r in remote} <= _worker_nodes(cluster) and all(r.node for r in remote)
  if sandbox == "docker":  # only where Docker is declared
    assert {r.node for r in remote} == {cluster.docker_node}
  assert all(r.node == "" for r in local)

  threads, ray_lines = _records(tmp_path / "threads"), _records(tmp_path / "ray")
  key = lambda rec: rec["group"]  # noqa: E731 -- lines land in completion order
  assert [_stable(x) for x in sorted(ray_lines, key=key)] == \
      [_stable(x) for x in sorted(threads, key=key)]
  assert all(line["node"] in _worker_nodes(cluster) for line in ray_lines)
  with open(tmp_path / "ray" / "summary.json") as f, open(tmp_path / "threads" / "summary.json") as g:
    s_ray, s_thr = json.load(f), json.load(g)
  assert s_ray["n_solved"] == s_thr["n_solved"] == len(tasks)
  # The logs and the recording came back here; the worker kept nothing.
  for a, b in zip(local, remote):
    assert sorted(b.log_paths) == sorted(a.log_paths) == ["agent_log.jsonl", "stderr", "stdout"]
    assert os.path.getsize(b.log_paths["agent_log.jsonl"]) > 0
    for name, path in b.log_paths.items():
      assert path.startswith(str(tmp_path / "ray")) and os.path.isfile(path), name
    assert os.path.isfile(b.trajectory_path)
  assert set(_leftovers()) <= before  # (a trial's sweep may remove a dead worker's)
  # The listener opened for the workers serves sessions and /health only.
  host, port = backend.address_of(proxy)
  with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10) as r:
    assert r.status == 200
  with pytest.raises(urllib.error.HTTPError) as e:
    urllib.request.urlopen(f"http://{host}:{port}/v1/models", timeout=10)
  assert e.value.code == 403


def test_unreachable_proxy_fails_at_start(cluster, tasks, policy, tmp_path):
  # The proxy listens on 127.0.0.2:P but advertises 127.0.0.1:P, a port held bound (not
  # listening) here, so every worker's GET is refused.
  hold = socket.socket()
  hold.bind(("127.0.0.1", 0))
  port = hold.getsockname()[1]
  p = scripted_proxy(load_tokenizer(), policy.reply, str(tmp_path / "sock"))
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1", advertise_port=port,
                                       bind_host="127.0.0.2"))
  t0 = time.perf_counter()
  try:
    with pytest.raises(errors.ConfigError) as e:
      run_trials([TrialJob(tasks[0], BuiltinAdapter())], p, TrialConfig(), str(tmp_path / "out"),
                 backend=backend)
  finally:
    p.stop()
    hold.close()
  msg = str(e.value)
  assert "cannot reach the proxy" in msg and "advertise_host" in msg and "127.0.0.1" in msg
  assert msg.count("cannot GET") == len(_worker_nodes(cluster))  # every trial node probed
  assert not os.path.exists(tmp_path / "out" / "trials.jsonl")  # no trial ran
  assert time.perf_counter() - t0 < 30


def test_workers_without_pytest_refused_at_start(cluster, tasks, proxy, tmp_path):
  """The local sandbox grades pytest tasks with the node's python3: each trial node is asked
  (not this machine, as the thread pool's check does)."""
  venv = tmp_path / "bare"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  task = dataclasses.replace(tasks[0], verifier=dataclasses.replace(tasks[0].verifier,
                                                                    kind="pytest"))
  cfg = TrialConfig(sandbox=SandboxConfig(backend="local", env={"PATH": str(venv / "bin")}))
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1"))
  with pytest.raises(errors.ConfigError) as e:
    run_trials([TrialJob(task, BuiltinAdapter())], proxy, cfg, str(tmp_path / "out"),
               backend=backend)
  msg = str(e.value)
  assert "2 Ray node(s)" in msg and "cannot import pytest" in msg and "python3-pytest" in msg
  assert not os.path.exists(tmp_path / "out" / "trials.jsonl")


def test_unschedulable_and_lost_inputs_are_infrastructure(cluster, tasks, proxy, tmp_path):
  """An attempt that no node can take, and one whose task object is gone, end with an
  infrastructure status (never a policy failure) and say why."""
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1", schedule_timeout_s=1.0,
                                       sandbox_resource="no_such_resource"))
  backend.connect()
  job = TrialJob(tasks[0], BuiltinAdapter(), group=0)
  docker_cfg = TrialConfig(sandbox=SandboxConfig(backend="docker"))
  res = backend.run_attempt(job, proxy, docker_cfg, str(tmp_path), attempt=0, seed=None)
  assert res.status == st.SANDBOX_ERROR and res.infrastructure_failure
  assert "not scheduled within 1 s" in res.error and "no_such_resource" in res.error

  backend.close()
  # The task object cannot be had: the worker producing it crashed (a lost object takes the
  # same path: "an input argument could not be computed").
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1", schedule_timeout_s=60.0))
  backend.connect()
  ref = _crash.remote()
  backend._task_refs[id(tasks[1])] = (ref, tasks[1], tasks[1])  # noqa: SLF001
  lost = TrialJob(tasks[1], BuiltinAdapter(), group=1)
  res = backend.run_attempt(lost, proxy, TrialConfig(), str(tmp_path), attempt=0, seed=None)
  assert res.status == st.SANDBOX_ERROR and res.error.startswith("ray: "), res.error
  assert "WorkerCrashedError" in res.error
  assert proxy.sessions.get(res.trial_id) is None  # the session was closed either way
  backend.close()


def test_eval_entry_point_joins_the_cluster(cluster, tmp_path):
  """``experiments.eval --config.backend=ray --config.ray_address=HOST:PORT``, as users run it.
  (``ray://`` through Ray Client passed here too, but its per-client server process sometimes
  failed to start on this loaded 2-core host, so the suite joins by the cluster's address and
  tests the Ray Client code path, one plain task per attempt, in-process below.)"""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, "-m", "experiments.eval", "--config=experiments/configs/eval.py",
         f"--workdir={tmp_path}", "--config.tasks=synthetic:2", "--config.backend=ray",
         f"--config.ray_address={cluster.address}", "--config.advertise_host=127.0.0.1"]
  r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads(r.stdout.strip().splitlines()[-1])
  assert summary["backend"] == "ray" and summary["n_solved"] == summary["n_trials"] == 2
  assert {line["node"] for line in _records(tmp_path)} <= _worker_nodes(cluster)
  assert len(_worker_nodes(cluster)) == 2  # joined, not shut down by the eval's exit


def test_plain_task_path_as_under_ray_client(cluster, tasks, policy, proxy, tmp_path):
  """Ray Client has no streaming tasks: each attempt is then one plain task whose result names
  its node."""
  policy.arm()
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1"))
  backend.connect()
  backend._streaming = False  # noqa: SLF001 -- what connect() sets under ray://
  res = run_trials([TrialJob(tasks[0], BuiltinAdapter(), group=0, seed=1)], proxy,
                   TrialConfig(harness_timeout_s=60), str(tmp_path), backend=backend)
  backend.close()
  assert res[0].status == st.SOLVED and res[0].node in _worker_nodes(cluster)
  assert "start_s" not in res[0].durations and res[0].durations["worker_s"] > 0
  assert _records(tmp_path)[0]["node"] == res[0].node


def test_worker_node_killed_mid_trial(cluster, tasks, policy, proxy, tmp_path):
  """Runs last in this module: it removes a node (and puts one back afterwards)."""
  marker = f"ray-kill-{os.getpid()}"
  base_dir = str(tmp_path / "sandboxes")
  os.makedirs(base_dir)
  started: dict[str, str] = {}
  killed: list[str] = []

  def kill_the_trials_node():  # runs when the harness makes its first model call
    node_id = next(iter(started.values()))
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    cluster.remove_node(node, allow_graceful=False)
    killed.append(node_id)
    if node_id == cluster.docker_node:
      cluster.docker_node = None

  policy.arm(kill_the_trials_node, at=0, delay_s=2.0)
  backend = RayTrialBackend(RayOptions(advertise_host="127.0.0.1"))
  backend.on_start = lambda trial_id, node: started.setdefault(trial_id, node)
  cfg = TrialConfig(harness_timeout_s=60, sandbox=SandboxConfig(
      backend="local", base_dir=base_dir, env={faultkit.RUN_ENV: marker}))
  out = str(tmp_path / "out")
  before = set(_leftovers())
  try:
    results = run_trials([TrialJob(tasks[2], BuiltinAdapter(), group=0, seed=7)], proxy, cfg,
                         out, concurrency=1, max_retries=1, backend=backend)
  finally:
    backend.close()
    if len(cluster.worker_nodes) < 2:  # put the lost kind of node back
      node = cluster.add_node(**(DOCKER_NODE if cluster.docker_node is None else PLAIN_NODE))
      cluster.docker_node = cluster.docker_node or node.node_id
  assert policy.hook_error is None and killed
  lines = _records(out)
  assert [(line["attempt"], line["status"], line["final"]) for line in lines] == [
      (0, st.SANDBOX_ERROR, False), (1, st.SOLVED, True)]
  assert lines[0]["node"] == killed[0] and "ray: " in lines[0]["error"]
  assert lines[1]["node"] != killed[0] and lines[1]["node"]
  # The retry gets a fresh copy of the task object: pulling the old one, which lists the dead
  # node as a location, stalled its start 15-30 s (0.02 s with the fresh copy).
  assert lines[1]["durations"]["start_s"] < 12
  assert [r.status for r in results] == [st.SOLVED] and results[0].attempt == 1
  # No process of the killed trial survived its node (the parent-death signal). Its sandbox
  # directory outlives the node's raylet on this shared disk until the next trial on the
  # machine sweeps dead owners' leftovers (``ray_worker.sweep_dead_trials``), which needs the
  # dead worker reaped first (a zombie counts as alive).
  deadline = time.monotonic() + 20
  while (os.listdir(base_dir) or set(_leftovers()) - before) and time.monotonic() < deadline:
    ray_worker.sweep_dead_trials(cfg.sandbox)
    time.sleep(0.25)
  assert faultkit.leaks(marker, base_dir, docker=False) == []
  assert set(_leftovers()) - before == set()  # the dead worker's log and socket directories
