"""What runs on a Ray worker node: one trial's sandbox, harness and verifier, and nothing else.

The driver (the JAX process, ``rollout.ray_backend``) keeps the engine, the proxy and every
proxy session; a worker gets a task (through Ray's object store), a harness adapter, the trial
config and a session's id and token, and returns the trial's record plus its log files as
bytes. Token ids and logprobs never come through here: the proxy records them where they are
sampled.

How the sandbox reaches a proxy on another machine: sandboxes only know how to reach a proxy
through a Unix socket (``SandboxConfig.proxy_socket``; the relay inside serves it on the
sandbox's loopback). ``ProxyForwarder`` is that socket on the worker, forwarding each
connection byte for byte to the proxy's advertised TCP address, so both sandbox backends work
unchanged.

Nothing is left on the worker: the trial's directory (logs, the forwarder's socket) is a
temporary directory removed before the result is returned; the sandbox removes its own.

This module imports no JAX and no Ray at import time: Ray workers import it to run a trial,
and the import is part of every worker process's start-up.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from legorl_jax.rewards import status as st
from legorl_jax.rollout.trial import TrialResult, execute_trial
from legorl_jax.sandbox.relay import pump

# A log file larger than this comes back as its last bytes only (the harness's own output is
# already bounded by the sandbox's OutputSink; this guards the Ray reply size).
MAX_LOG_BYTES = 8 << 20
# Temporary directories of a trial (logs) and of its forwarder (the socket), named with the
# worker's pid so that a sweep can tell those of dead workers.
TRIAL_PREFIX = "legorl-ray-trial-"
FORWARDER_PREFIX = "lgrf-"


@dataclasses.dataclass(frozen=True)
class TrialRequest:
  """What the driver tells a worker about one attempt (small, pickled by value)."""

  trial_id: str
  task_id: str
  harness: str
  group: int
  attempt: int
  session_id: str
  token: str
  proxy_host: str
  proxy_port: int


def node_id() -> str:
  import ray  # noqa: PLC0415 -- only ever called inside a Ray worker or driver
  return ray.get_runtime_context().get_node_id()


class ProxyForwarder:
  """A Unix socket whose connections are forwarded to ``host:port`` (the proxy over TCP).

  ``start()`` makes a private directory with ``proxy.sock`` in it (mode 0666: the sandbox's
  unprivileged user connects to it, and session tokens still guard every session); ``stop()``
  closes every connection and removes the directory.
  """

  def __init__(self, host: str, port: int, parent_dir: str | None = None):
    self.host, self.port = host, int(port)
    self._parent = parent_dir
    self._dir: str | None = None
    self._srv: socket.socket | None = None
    self._conns: set[socket.socket] = set()
    self._lock = threading.Lock()
    self._thread: threading.Thread | None = None

  @property
  def path(self) -> str:
    assert self._dir is not None, "start() first"
    return os.path.join(self._dir, "proxy.sock")

  def start(self) -> "ProxyForwarder":
    # Short path under /tmp: a Unix socket path may not exceed 107 bytes.
    self._dir = tempfile.mkdtemp(prefix=f"{FORWARDER_PREFIX}{os.getpid()}-",
                                 dir=self._parent or "/tmp")
    os.chmod(self._dir, 0o755)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(self.path)
    os.chmod(self.path, 0o666)
    srv.listen(64)
    self._srv = srv
    self._thread = threading.Thread(target=self._accept, name="legorl-forwarder", daemon=True)
    self._thread.start()
    return self

  def _accept(self):
    while True:
      try:
        client, _ = self._srv.accept()
      except OSError:  # closed by stop()
        return
      threading.Thread(target=self._serve, args=(client,), daemon=True).start()

  def _serve(self, client: socket.socket):
    try:
      upstream = socket.create_connection((self.host, self.port), timeout=10)
      upstream.settimeout(None)
      upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
      client.close()  # the harness sees a refused call: a harness_error, as with a dead proxy
      return
    with self._lock:
      self._conns.update((client, upstream))
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    with self._lock:
      self._conns.difference_update((client, upstream))
    client.close()
    upstream.close()

  def stop(self):
    if self._srv is not None:
      try:
        self._srv.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      self._srv.close()
      self._srv = None
    with self._lock:
      for c in list(self._conns):
        try:
          c.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass
    if self._thread is not None:
      self._thread.join(timeout=5)
    if self._dir is not None:
      shutil.rmtree(self._dir, ignore_errors=True)
      self._dir = None


def probe_proxy(host: str, port: int, timeout_s: float = 5.0,
                pytest_env: dict[str, str] | None = None) -> dict[str, Any]:
  """GET ``/health`` of the proxy from here: ``{"node", "ok", "error", "url", "seconds"}``;
  with ``pytest_env`` (the local sandbox's env) also ``"pytest_missing"``: the python3 a local
  sandbox on this node would grade pytest tasks with, if it cannot import pytest, else ""."""
  t0 = time.perf_counter()
  url = f"http://{host}:{int(port)}/health"
  try:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 -- our own proxy
      ok, err = r.status == 200, "" if r.status == 200 else f"HTTP {r.status}"
  except (urllib.error.URLError, OSError) as e:
    ok, err = False, f"{type(e).__name__}: {getattr(e, 'reason', e)}"
  out = {"node": node_id(), "ok": ok, "error": err, "url": url,
         "seconds": time.perf_counter() - t0, "pytest_missing": ""}
  if pytest_env is not None:
    from legorl_jax.sandbox import runtime_check  # noqa: PLC0415
    exe, missing = runtime_check.missing_python_modules(["pytest"], pytest_env)
    out["pytest_missing"] = (exe or "no python3 on the sandbox PATH") if missing else ""
  return out


_last_docker_sweep = [0.0]


def sweep_dead_trials(sandbox_config) -> list[str]:
  """Removes what trials of dead processes on this node left (a worker killed with its node's
  raylet, a SIGKILLed worker): this module's temporary directories, sandbox directories and
  containers whose owner process is gone.
  The sandbox backends do this once per process; a long-lived Ray worker does it before every
  trial (Docker at most every 30 s: listing containers costs a round trip to the engine)."""
  from legorl_jax.sandbox import local  # noqa: PLC0415
  removed = _sweep_own_dirs()
  try:
    if sandbox_config.backend == "local":
      removed += local.reap_local(sandbox_config.base_dir)
    elif time.monotonic() - _last_docker_sweep[0] > 30.0:
      _last_docker_sweep[0] = time.monotonic()
      from legorl_jax.sandbox import docker_sandbox  # noqa: PLC0415
      import docker  # noqa: PLC0415
      removed += docker_sandbox.reap_docker(docker.from_env(timeout=30))
  except Exception:  # noqa: BLE001 -- a sweep never fails a trial
    pass
  return removed


def _pid_gone(pid: int) -> bool:
  """True when ``pid`` no longer runs here (a zombie, which nobody reaped yet, counts as gone)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[-1].split()[:1] == [b"Z"]
  except OSError:
    return True


def _sweep_own_dirs() -> list[str]:
  """This module's temporary directories whose worker process is gone."""
  removed = []
  tmp = tempfile.gettempdir()
  for name in os.listdir(tmp):
    for prefix in (TRIAL_PREFIX, FORWARDER_PREFIX):
      pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
      if pid.isdigit() and _pid_gone(int(pid)):
        shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        removed.append(os.path.join(tmp, name))
  return removed


def run_here(task, adapter, config, req: TrialRequest) -> dict[str, Any]:
  """Runs one attempt on this node; returns ``{"record": TrialResult.record(), "files":
  {name: bytes}}`` and leaves nothing behind. Never raises for a trial's failure."""
  res = TrialResult(trial_id=req.trial_id, task_id=req.task_id, harness=req.harness,
                    status=st.SANDBOX_ERROR, reward=0.0, group=req.group, attempt=req.attempt)
  t0 = time.perf_counter()
  root = tempfile.mkdtemp(prefix=f"{TRIAL_PREFIX}{os.getpid()}-")
  forwarder = None
  files: dict[str, bytes] = {}
  try:
    res.node = node_id()
    sweep_dead_trials(config.sandbox)
    forwarder = ProxyForwarder(req.proxy_host, req.proxy_port).start()
    tdir = os.path.join(root, req.trial_id)
    os.makedirs(tdir)
    execute_trial(res, task, adapter, config, tdir, proxy_socket=forwarder.path,
                  session_id=req.session_id, token=req.token)
    for name, path in res.log_paths.items():
      files[name] = _read_tail(path)
  except Exception as e:  # noqa: BLE001 -- the record still gets back to the driver
    res.status, res.error = st.SANDBOX_ERROR, f"ray worker: {type(e).__name__}: {e}"
  finally:
    if forwarder is not None:
      forwarder.stop()
    shutil.rmtree(root, ignore_errors=True)
  res.durations["worker_s"] = time.perf_counter() - t0
  return {"record": res.record(), "files": files}


def trial_stream(task, adapter, config, req: TrialRequest):
  """The Ray task body (a streaming generator): first this node's id, as soon as the trial
  starts (the driver learns where it runs and that it was scheduled), then ``run_here``."""
  yield node_id()
  yield run_here(task, adapter, config, req)


def _read_tail(path: str) -> bytes:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      size = f.tell()
      f.seek(max(0, size - MAX_LOG_BYTES))
      return f.read()
  except OSError:
    return b""
