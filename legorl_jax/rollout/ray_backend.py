"""Trials on a Ray cluster: ``rollout.backend = "ray"``, beside the runner's thread pool.

Why: a harness fleet needs more cores, memory and disk than the accelerator hosts have. With
this backend each trial attempt (sandbox, harness subprocess, verifier) runs as one Ray task
with declared resources on whatever node has them, while the engine, the proxy, every proxy
session and the learner stay in this (the JAX) process. ``run_trials`` keeps its thread pool,
its retry rules and its records; each pool thread submits one attempt and waits for it, so
``rollout.concurrency`` is the number of trials in flight on the cluster.

What crosses Ray, per attempt: the task (``ray.put`` once per task per run: the repository
snapshot and the hidden tests travel through the object store, never a shared filesystem),
the adapter, the trial config and the session's id and token; back comes the trial's record
and its log files (``ray_worker.run_here``). Token ids and logprobs never do: the harness's
calls reach the proxy over HTTP at its advertised address, and the proxy records them here.

Faults: whatever Ray raises instead of a result (the node or worker process died, an object
was lost, the task could not be scheduled in ``schedule_timeout_s``, no result in the trial's
own time limits plus a margin) ends the attempt with ``sandbox_error``, an *infrastructure*
status: the runner retries it (``max_retries``) on a node other than the ones that failed it
(a ``ray.io/node-id`` label selector) and it is never scored as a policy failure. Ray's own
task retries are off (``max_retries=0``): a retry needs a fresh proxy session, so every
attempt goes through the runner and is counted exactly once.

Start-up (``prepare``): connects (``ray.init()``: a local cluster when ``address`` is empty;
``"auto"`` or ``ray://HOST:10001`` joins one), checks a trial fits on some node, and has every
node that could run trials GET the proxy's ``/health`` at the advertised address, failing with
the fix named when one cannot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from typing import Any, Sequence

from legorl_jax import errors
from legorl_jax.rewards import status as st
from legorl_jax.rollout import ray_worker
from legorl_jax.rollout.trial import (TrialConfig, TrialResult, close_session, new_trial_id,
                                      open_session)
from legorl_jax.tasks import repo as repo_lib
from legorl_jax.tasks.schema import RepoSource, Task

log = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"


@dataclasses.dataclass(frozen=True)
class RayOptions:
  """How trials use the cluster (``experiments/configs/common.py``: ``rollout.ray_*``,
  ``proxy.advertise_*``).

  address: "" starts a local cluster in this process (``ray.init()``); "auto" joins the
    cluster this machine belongs to; ``ray://HOST:10001`` joins one through Ray Client.
  trial_cpus / trial_memory_mb: what each trial declares (memory 0: not declared).
  sandbox_resource: a custom resource each Docker trial takes one unit of, so those trials go
    only where Docker is (start such nodes with ``--resources='{"sandbox": N}'``); "" = none.
  local_num_cpus: logical CPUs of a local cluster (0: this machine's count; from a config,
    ``rollout.ray_num_cpus`` or else ``rollout.concurrency``, as many as the pool would run).
  advertise_host / advertise_port: where workers reach the proxy ("": this node's IP as Ray
    sees it; 0: a free port). The proxy listens on ``bind_host`` at that port.
  schedule_timeout_s: an attempt not started by then is cancelled (infrastructure).
  result_margin_s: added to the harness and verifier time limits before a started attempt
    with no result is cancelled (infrastructure).
  """

  address: str = ""
  trial_cpus: float = 1.0
  trial_memory_mb: int = 0
  sandbox_resource: str = "sandbox"
  local_num_cpus: int = 0
  advertise_host: str = ""
  advertise_port: int = 0
  bind_host: str = "0.0.0.0"
  schedule_timeout_s: float = 600.0
  probe_timeout_s: float = 60.0
  result_margin_s: float = 300.0

  @classmethod
  def from_config(cls, cfg) -> "RayOptions":
    """From a training config (``cfg.rollout.ray_*``, ``cfg.proxy.advertise_*``)."""
    r, p = cfg.rollout, cfg.get("proxy", {})
    return cls(address=str(r.get("ray_address", "")),
               trial_cpus=float(r.get("ray_trial_cpus", 1.0)),
               trial_memory_mb=int(r.get("ray_trial_memory_mb", 0)),
               # A local cluster runs as many trials at once as the thread pool would.
               local_num_cpus=int(r.get("ray_num_cpus", 0) or r.get("concurrency", 0)),
               advertise_host=str(p.get("advertise_host", "")),
               advertise_port=int(p.get("advertise_port", 0)))


def backend_from_config(cfg) -> "RayTrialBackend | None":
  """``TrialConfig.backend`` for a training config: None for ``rollout.backend="threads"``."""
  name = str(cfg.rollout.get("backend", "threads"))
  if name == "threads":
    return None
  if name == "ray":
    return RayTrialBackend(RayOptions.from_config(cfg))
  raise errors.ConfigError(f"rollout.backend={name!r}: choose 'threads' or 'ray'.")


def _import_ray():
  try:
    import ray  # noqa: PLC0415 -- an optional extra
  except ImportError:
    raise errors.ConfigError(
        "rollout.backend='ray' needs Ray: pip install -e '.[ray]' (or leave the backend at "
        "'threads').") from None
  return ray


class RayTrialBackend:
  """Runs attempts for ``run_trials(..., backend=RayTrialBackend(options))``.

  ``prepare`` once before the first attempt, ``run_attempt`` from any number of threads,
  ``close`` at the end (shuts down a local cluster this backend started; a joined cluster and
  a Ray session someone else started are left alone).
  """

  def __init__(self, options: RayOptions = RayOptions()):
    self.options = options
    self._ray = None
    self._owns_ray = False
    self._lock = threading.Lock()
    self._task_refs: dict[int, Any] = {}
    self._remote = self._remote_once = None
    self._streaming = True
    # Called as on_start(trial_id, node_id) when an attempt starts on a node (progress, tests).
    self.on_start = None

  # -- start-up -----------------------------------------------------------------------------
  def connect(self):
    """``ray.init`` unless Ray is already initialised in this process; returns ``ray``."""
    if self._ray is not None:
      return self._ray
    ray = _import_ray()
    if not ray.is_initialized():
      o = self.options
      kw: dict[str, Any] = {"address": o.address or None, "ignore_reinit_error": True}
      if not o.address:  # a local cluster: it has Docker wherever this process has
        cpus = o.local_num_cpus or os.cpu_count() or 1
        kw.update(num_cpus=cpus, include_dashboard=False,
                  resources={o.sandbox_resource: cpus} if o.sandbox_resource else None)
      try:
        ray.init(**kw)
      except (ConnectionError, RuntimeError, ValueError) as e:
        raise errors.ConfigError(
            f"Could not join the Ray cluster at {o.address!r}: {e}. Start one (`ray start "
            "--head`), pass its address (--config.rollout.ray_address=auto or "
            "ray://HOST:10001), or leave the address empty for a local cluster.") from e
      self._owns_ray = not o.address
    self._ray = ray
    self._remote = ray.remote(ray_worker.trial_stream)
    self._remote_once = ray.remote(ray_worker.run_here)
    # Ray Client (ray://) has no streaming generators: an attempt is then one plain task, so
    # the driver learns its node only from its result and waits for both phases at once.
    self._streaming = not ray.util.client.ray.is_connected()
    return ray

  def close(self):
    with self._lock:
      self._task_refs.clear()
    if self._ray is not None and self._owns_ray:
      self._ray.shutdown()
    self._ray = None

  def resources(self, config: TrialConfig) -> dict[str, Any]:
    """The Ray resources one trial declares."""
    o = self.options
    kw: dict[str, Any] = {"num_cpus": o.trial_cpus}
    if o.trial_memory_mb:
      kw["memory"] = int(o.trial_memory_mb) << 20
    if o.sandbox_resource and config.sandbox.backend == "docker":
      kw["resources"] = {o.sandbox_resource: 1}
    return kw

  def _fits(self, node: dict, config: TrialConfig) -> bool:
    need = self.resources(config)
    have = node.get("Resources", {})
    want = {"CPU": need["num_cpus"], "memory": need.get("memory", 0), **need.get("resources", {})}
    return all(have.get(k, 0) >= v for k, v in want.items() if v)

  def trial_nodes(self, config: TrialConfig) -> list[str]:
    """Ids of the live nodes one trial fits on."""
    return [n["NodeID"] for n in self._ray.nodes()
            if n.get("Alive") and self._fits(n, config)]

  def address_of(self, proxy) -> tuple[str, int]:
    """Where workers reach ``proxy``: opens its TCP listener on first use (on the first free
    port of ``advertise_port``..+15 when that is set: a proxy per evaluation mode each takes
    one, and a stopped proxy's port is taken again). The listener is the proxy's own state, so
    a new proxy never gets a stopped one's address."""
    o = self.options
    with self._lock:
      if o.advertise_port and proxy.port is None and proxy.tcp_listener is None:
        for i in range(16):
          try:
            _, port = proxy.listen_tcp(o.bind_host, o.advertise_port + i)
            break
          except errors.ConfigError:
            if i == 15:
              raise
      else:
        _, port = proxy.listen_tcp(o.bind_host, 0)
    return o.advertise_host or self._ray.util.get_node_ip_address(), port

  def prepare(self, proxies: Sequence[Any], config: TrialConfig, tasks: Sequence[Task]) -> None:
    """Connects, checks a trial fits somewhere and that every node trials may run on
    reaches every proxy; raises ``ConfigError`` naming the fix otherwise."""
    ray = self.connect()
    nodes = self.trial_nodes(config)
    need = self.resources(config)
    probe = ray.remote(ray_worker.probe_proxy)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415
    failures, seen, no_pytest = [], [], {}
    # What check_local_verifiers asks of this machine, asked of every trial node instead.
    pytest_env = (dict(config.sandbox.env) if config.sandbox.backend == "local" and any(
        t.verifier.kind == "pytest" for t in tasks) else None)
    for proxy in {id(p): p for p in proxies}.values():
      host, port = self.address_of(proxy)
      if nodes:
        refs = [probe.options(num_cpus=0, max_retries=0, scheduling_strategy=
                              NodeAffinitySchedulingStrategy(n, soft=False)).remote(
                                  host, port, pytest_env=pytest_env)
                for n in nodes]
      else:  # an autoscaling cluster may start a node for a task shaped like a trial
        refs = [probe.options(max_retries=0, **need).remote(host, port, pytest_env=pytest_env)]
      ready, pending = ray.wait(refs, num_returns=len(refs), timeout=(
          self.options.probe_timeout_s if nodes else self.options.schedule_timeout_s))
      for r in pending:
        ray.cancel(r, force=True)
      if not nodes and pending:
        raise errors.ConfigError(
            f"No node of the Ray cluster can hold a trial needing {need}: add worker nodes "
            f"with those resources (`ray start --address=HEAD:6379 --num-cpus=N"
            + (f" --resources='{{\"{self.options.sandbox_resource}\": N}}'"
               if "resources" in need else "") + "`), or lower --config.rollout.ray_trial_cpus"
            " / ray_trial_memory_mb.")
      if pending:
        failures.append(f"{len(pending)} node(s) did not answer within "
                        f"{self.options.probe_timeout_s:.0f} s")
      for r in ready:
        try:
          out = ray.get(r)
        except ray.exceptions.RayError as e:
          failures.append(f"a probe failed: {type(e).__name__}: {str(e)[:300]}")
          continue
        seen.append(out["node"])
        if out.get("pytest_missing"):
          no_pytest[out["node"]] = out["pytest_missing"]
        if not out["ok"]:
          failures.append(f"node {out['node'][:12]} cannot GET {out['url']}: {out['error']}")
    if no_pytest:
      node, exe = next(iter(no_pytest.items()))
      raise errors.ConfigError(
          f"Tasks graded with pytest would run on {len(no_pytest)} Ray node(s) whose local "
          f"sandbox python3 cannot import pytest (e.g. node {node[:12]}: {exe}). Install it "
          "there (`apt-get install python3-pytest`, as .ci/setup_system.sh does), or run these "
          "tasks on Docker (--config.sandbox.backend=docker).")
    if failures:
      raise errors.ConfigError(
          "Ray workers cannot reach the proxy: " + "; ".join(failures) + ". Set "
          "--config.proxy.advertise_host to an address of this machine that the worker nodes "
          "can reach (and --config.proxy.advertise_port to a port open to them), or open the "
          "firewall between them.")
    log.info("ray: %d node(s) can run trials and reach the proxy; trial resources %s",
             len(set(seen)), need)

  def release(self, tasks: Sequence[Task]) -> None:
    """Drops the object-store copies of ``tasks`` (``run_trials`` calls it when its jobs are
    done; a later run puts them again), so a long training run holds only the tasks in use."""
    with self._lock:
      for t in tasks:
        self._task_refs.pop(id(t), None)

  # -- one attempt --------------------------------------------------------------------------
  def _task_ref(self, task: Task, *, fresh: bool = False):
    """The task's object (one ``ray.put`` per task per run). ``fresh``: put it again, for a
    retry after a node failed: the old object may list the dead node as a location, and a
    worker pulling from there waits for Ray's timeouts (15-30 s seen here) before another."""
    with self._lock:
      entry = self._task_refs.get(id(task))  # (ref, portable task, task: keeps the id taken)
      if entry is None:
        portable = portable_task(task)
        entry = self._task_refs[id(task)] = (self._ray.put(portable), portable, task)
      elif fresh:
        entry = self._task_refs[id(task)] = (self._ray.put(entry[1]), entry[1], task)
      return entry[0]

  def run_attempt(self, job, proxy, config: TrialConfig, out_dir: str, *, attempt: int,
                  seed: int | None, avoid_nodes: Sequence[str] = ()) -> TrialResult:
    """Runs one attempt of ``job`` on the cluster; always returns a ``TrialResult``."""
    ray = self.connect()
    task = job.task
    trial_id = new_trial_id(task)
    tdir = os.path.join(out_dir, trial_id)
    os.makedirs(tdir, exist_ok=True)
    res = TrialResult(trial_id=trial_id, task_id=task.id, harness=job.adapter.name,
                      status=st.SANDBOX_ERROR, reward=0.0, group=job.group, attempt=attempt)
    t0 = time.perf_counter()
    handle = gen = None
    try:
      handle = open_session(proxy, seed)
      host, port = self.address_of(proxy)
      req = ray_worker.TrialRequest(
          trial_id=trial_id, task_id=task.id, harness=job.adapter.name, group=job.group,
          attempt=attempt, session_id=handle.session_id, token=handle.token,
          proxy_host=host, proxy_port=port)
      opts = dict(self.resources(config), max_retries=0)
      if avoid_nodes and set(self.trial_nodes(config)) - set(avoid_nodes):
        # retry elsewhere when somewhere else can run it
        opts["label_selector"] = {NODE_ID_LABEL: f"!in({','.join(sorted(set(avoid_nodes)))})"}
      args = (self._task_ref(task, fresh=bool(avoid_nodes)), job.adapter, dataclasses.replace(config, backend=None), req)
      run_limit = config.harness_timeout_s + task.verifier.timeout_s + self.options.result_margin_s
      if not self._streaming:  # Ray Client: one reply, the node id inside it
        gen = self._remote_once.options(**opts).remote(*args)
        limit = self.options.schedule_timeout_s + run_limit
        ready, _ = ray.wait([gen], timeout=limit)
        if not ready:
          res.error = f"ray: no result within {limit:.0f} s of submission"
          return res
        out, gen = ray.get(gen), None
        _fill(res, out, tdir)
        return res
      gen = self._remote.options(num_returns="streaming", **opts).remote(*args)
      ready, _ = ray.wait([gen], timeout=self.options.schedule_timeout_s)
      if not ready:
        res.error = (f"ray: not scheduled within {self.options.schedule_timeout_s:.0f} s "
                     f"(needs {self.resources(config)})")
        return res
      res.node = ray.get(next(gen))
      res.durations["start_s"] = time.perf_counter() - t0
      if self.on_start is not None:
        self.on_start(trial_id, res.node)
      ready, _ = ray.wait([gen], timeout=run_limit)
      if not ready:
        res.error = f"ray: no result within {run_limit:.0f} s of the trial's start"
        return res
      out = ray.get(next(gen))
      gen = None
      _fill(res, out, tdir)
    except ray.exceptions.RayTaskError as e:
      cause = getattr(e, "cause", None)
      if isinstance(cause, ray.exceptions.RayError):  # e.g. an argument's owner died
        res.status, res.error = st.SANDBOX_ERROR, (
            f"ray: {type(cause).__name__}: {str(cause)[:2000]}")
      else:  # ray_worker itself raised: a bug, never the policy's act
        res.status, res.error = st.HARNESS_ERROR, f"ray worker raised: {str(e)[:2000]}"
    except ray.exceptions.RayError as e:  # node/worker died, object lost, cancelled, ...
      res.status, res.error = st.SANDBOX_ERROR, f"ray: {type(e).__name__}: {str(e)[:2000]}"
    except Exception as e:  # noqa: BLE001 -- a trial never takes the run down
      res.status, res.error = st.SANDBOX_ERROR, f"{type(e).__name__}: {e}"
    finally:
      if gen is not None:  # gave up on it: free its resources on the worker
        try:
          ray.cancel(gen, force=True)
        except Exception:  # noqa: BLE001 -- already finished or gone
          pass
      if handle is not None:
        close_session(res, proxy, handle.session_id, tdir, config.keep_trajectory_files)
      res.durations["total_s"] = time.perf_counter() - t0
    return res


def _fill(res: TrialResult, out: dict[str, Any], tdir: str) -> None:
  """The worker's record into ``res``, its log files written under ``tdir`` here."""
  rec = dict(out["record"])
  for k in ("trial_id", "task_id", "harness", "group", "attempt"):
    rec.pop(k, None)
  durations = rec.pop("durations", {})
  rec.pop("log_paths", None)
  for k, v in rec.items():
    setattr(res, k, v)
  res.durations.update(durations)
  res.log_paths = {}
  for name, data in out.get("files", {}).items():
    dest = os.path.join(tdir, "harness." + name if name in ("stdout", "stderr") else name)
    with open(dest, "wb") as f:
      f.write(data)
    res.log_paths[name] = dest


def portable_task(task: Task) -> Task:
  """``task`` with its repository inline (``RepoSource(kind="archive", data=...)``), so it
  means the same on a node without this machine's files: a directory, an archive path or a
  local git repository becomes the snapshot's bytes (history squashed later anyway)."""
  r = task.repo
  if r.kind == "archive" and r.data is not None:
    return task
  with tempfile.TemporaryDirectory(prefix="legorl-snapshot-") as tmp:
    dest = os.path.join(tmp, "repo")
    repo_lib.materialize_repo(r, dest)
    data = repo_lib.archive_dir(dest)
  return dataclasses.replace(task, repo=RepoSource(kind="archive", data=data))
