"""Docker sandbox: one container per trial, no network, hard resource limits.

The container runs an idle keeper under Docker's init, with ``network_mode="none"``, memory,
pids and CPU limits, a read-only root filesystem, ``no-new-privileges``, and anonymous
volumes for the work dir, HOME and /opt/legorl (so files can be copied in and out with
archives, which also works against a remote engine). Commands run as an unprivileged uid.
Every container carries the ``legorl.sandbox`` label; ``reap_docker`` removes those whose
owner process is gone.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import posixpath
import shlex
import socket
import tarfile
import tempfile
import threading
import time

from legorl_jax.errors import SandboxError, TaskError
from legorl_jax.sandbox import base, diff as diff_lib, images
from legorl_jax.tasks import repo as repo_lib

log = logging.getLogger(__name__)

_reaped = False
REMOVE_TIMEOUT_S = 60.0  # how long destroy() waits out an unreachable engine
_reap_lock = threading.Lock()


def docker_client(timeout: int = 120):
  """A connected ``docker`` SDK client, or SandboxError saying how to get an engine."""
  try:
    import docker
    client = docker.from_env(timeout=timeout)
    client.ping()
    return client
  except Exception as e:  # noqa: BLE001 - any failure means "no usable engine"
    raise SandboxError(f"no Docker engine reachable ({e}); install docker.io and start dockerd "
                       "(see .ci/setup_system.sh)") from None


def _owner() -> str:
  return f"{socket.gethostname()}:{os.getpid()}"


def reap_docker(client, *, everything: bool = False) -> list[str]:
  """Force-removes labelled containers whose owner process on this host is gone."""
  removed = []
  host = socket.gethostname()
  for c in client.containers.list(all=True, filters={"label": base.LABEL}):
    owner = c.labels.get("legorl.owner", "")
    h, _, pid = owner.rpartition(":")
    alive = h == host and pid.isdigit() and base.pid_alive(int(pid))
    if everything or (h == host and not alive):
      try:
        c.remove(force=True, v=True)
        removed.append(c.name)
      except Exception as e:  # noqa: BLE001 - a container vanishing meanwhile is fine
        log.warning("could not reap container %s: %s", c.name, e)
  return removed


def _tar_of_dir(path: str, uid: int, gid: int) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tf:
    def owner(ti):
      ti.uid, ti.gid, ti.uname, ti.gname = uid, gid, "", ""
      return ti
    for name in sorted(os.listdir(path)):
      tf.add(os.path.join(path, name), arcname=name, filter=owner)
  return buf.getvalue()


def _tar_of_file(name: str, data: bytes, mode: int, uid: int, gid: int) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tf:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.uid, ti.gid, ti.mtime = len(data), mode, uid, gid, int(time.time())
    tf.addfile(ti, io.BytesIO(data))
  return buf.getvalue()


class DockerSandbox(base.Sandbox):
  """See the module docstring. Create with ``DockerSandbox(task, config)``."""

  def __init__(self, task, config: base.SandboxConfig):
    super().__init__(task, config)
    self.client = docker_client()
    self.api = self.client.api
    global _reaped
    with _reap_lock:
      if not _reaped:
        _reaped = True
        for name in reap_docker(self.client):
          log.info("reaped leftover container %s", name)
    for cid in retry_pending_removals(self.client):
      log.info("removed leftover container %s", cid[:12])
    user = config.docker_user.split(":")
    self.uid, self.gid = int(user[0]), int(user[-1])
    self.support_dir = base.SUPPORT_DIR
    self.container = None
    self._keeper_pid = None
    self._n = 0
    self._open()

  def _image(self):
    import docker
    image = self.task.image or self.config.image
    if image is None:
      return images.ensure_base_image(self.client)
    try:
      self.client.images.get(image)
    except docker.errors.ImageNotFound:
      raise TaskError(f"task {self.task.id}: docker image {image!r} is not available on this engine "
                      "(there is no registry here: build or load it first)") from None
    return image

  def _create(self):
    import docker
    from docker.types import Mount
    image = self._image()
    with tempfile.TemporaryDirectory(prefix="legorl-stage-") as tmp:
      staged = os.path.join(tmp, "repo")
      repo_lib.materialize_repo(self.task.repo, staged, git_mirror_dir=self.config.git_mirror_dir)
      repo_lib.squash_git_history(staged)
      repo_tar = _tar_of_dir(staged, self.uid, self.gid)
    mounts = [Mount(self.workdir, None, type="volume"), Mount(base.HOME, None, type="volume"),
              Mount(base.SUPPORT_DIR, None, type="volume")]
    for host, inside in self.config.mounts():
      if not os.path.exists(host):
        raise SandboxError(f"read-only mount source {host!r} does not exist")
      mounts.append(Mount(inside, host, type="bind", read_only=True))
    if self.config.proxy_socket:
      mounts.append(Mount(base.PROXY_SOCKET, self.config.proxy_socket, type="bind"))
    try:
      self.container = self.client.containers.create(
          image, command=["sleep", "infinity"], name=f"legorl-{self.id}", init=True,
          labels={base.LABEL: "1", "legorl.owner": _owner(), "legorl.task": self.task.id[:200]},
          network_mode="none", mem_limit=f"{self.memory_mb}m", memswap_limit=f"{self.memory_mb}m",
          pids_limit=self.pids, nano_cpus=int(self.cpus * 1e9), read_only=self.config.read_only_rootfs,
          tmpfs={"/tmp": f"rw,exec,size={self.config.tmp_mb}m,mode=1777"}, mounts=mounts,
          working_dir=self.workdir, security_opt=["no-new-privileges"], user="0:0",
          environment={"HOME": base.HOME})
      self.container.start()
    except docker.errors.APIError as e:
      raise SandboxError(f"cannot start a container from {image!r}: {e.explanation or e}") from None
    if not self.container.put_archive(self.workdir, repo_tar):
      raise SandboxError("copying the repository into the container failed")
    support = io.BytesIO()
    with tarfile.open(fileobj=support, mode="w") as tf:
      for name, src in base.SUPPORT_FILES.items():
        tf.add(src, arcname=name)
    self.container.put_archive(base.SUPPORT_DIR, support.getvalue())
    r = self.exec(f"chown {self.uid}:{self.gid} {shlex.quote(self.workdir)} {base.HOME} && chmod 755 "
                  f"{base.SUPPORT_DIR} && {wait_for_child_script()}", user="0:0", timeout=60)
    if not r.ok:
      raise SandboxError(f"preparing the container failed: {r.stderr[-300:]!r}")
    self._keeper_pid = keeper_pid(r.stdout, self.id)
    if self.config.proxy_socket:
      self._start_relay()

  def _start_relay(self):
    ready = f"{base.HOME}/.legorl_relay_ready"
    cmd = (f"rm -f {ready}; python3 {base.SUPPORT_DIR}/relay.py --listen 127.0.0.1:{self.config.proxy_port} "
           f"--unix {base.PROXY_SOCKET} --ready-file {ready}")
    ex = self.api.exec_create(self.container.id, ["/bin/sh", "-c", cmd], user=self.config.docker_user)
    self.api.exec_start(ex["Id"], detach=True)
    for _ in range(500):
      if self.exec(f"test -e {ready}", timeout=10).exit_code == 0:
        return
      time.sleep(0.02)
    raise SandboxError("the proxy relay did not start inside the container")

  # --- files --------------------------------------------------------------------------------
  @contextlib.contextmanager
  def _engine(self, what: str):
    """Turns engine failures (dockerd restarting, container removed) into SandboxError."""
    try:
      yield
    except SandboxError:
      raise
    except Exception as e:  # noqa: BLE001 - docker.errors.* and connection errors alike
      raise SandboxError(f"{what} in sandbox {self.id} failed: {e}") from None

  def read_file(self, path):
    import docker
    p = self.resolve(path)
    with self._engine(f"reading {path!r}"):
      try:
        stream, _ = self.container.get_archive(p)
        data = b"".join(stream)
      except docker.errors.NotFound:
        raise SandboxError(f"cannot read {path!r}: no such file in sandbox {self.id}") from None
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
      m = tf.next()
      if m is None or not m.isreg():
        raise SandboxError(f"cannot read {path!r}: not a regular file")
      return tf.extractfile(m).read()

  def write_file(self, path, data, mode=0o644):
    p = self.resolve(path)
    data = data.encode() if isinstance(data, str) else data
    parent = posixpath.dirname(p)
    r = self.exec(["mkdir", "-p", parent], timeout=30)
    if not r.ok:
      raise SandboxError(f"cannot create {parent!r} in sandbox {self.id}: {r.stderr[-200:]!r}")
    with self._engine(f"writing {path!r}"):
      ok = self.container.put_archive(parent, _tar_of_file(posixpath.basename(p), data, mode,
                                                           self.uid, self.gid))
    if not ok:
      raise SandboxError(f"cannot write {path!r} in sandbox {self.id}")

  def snapshot(self):
    with self._engine("reading the work dir"):
      stream, _ = self.container.get_archive(self.workdir + "/.")
      data = b"".join(stream)
    return diff_lib.snapshot_tar(data, strip="")

  # --- exec ---------------------------------------------------------------------------------
  def exec(self, cmd, *, timeout=None, env=None, cwd=None, stdout_path=None, stderr_path=None,
           stdin=None, max_output_bytes=8 << 20, user=None):
    if self._destroyed or self.container is None:
      raise SandboxError(f"sandbox {self.id} is destroyed")
    argv = base.as_argv(cmd)
    if stdin is not None:
      self._n += 1
      f = f"{base.HOME}/.legorl_stdin_{self._n}"
      self.write_file(f, stdin, mode=0o600)
      argv = ["/bin/sh", "-c", f'exec "$@" < {f}', "sh", *argv]
    if timeout is not None:
      argv = ["timeout", "-s", "KILL", f"{max(timeout, 0.001):.3f}", *argv]
    full_env = {**self.base_env(), **(env or {})}
    t0, started = time.perf_counter(), time.time()
    try:
      ex = self.api.exec_create(self.container.id, argv, environment=full_env,
                                workdir=self.resolve(cwd or self.workdir), user=user or self.config.docker_user)
      stream = self.api.exec_start(ex["Id"], stream=True, demux=True)
    except Exception as e:  # noqa: BLE001 - docker.errors.* and connection errors alike
      raise SandboxError(f"cannot exec in sandbox {self.id}: {e}") from None
    sinks = [base.OutputSink(stdout_path, max_output_bytes), base.OutputSink(stderr_path, max_output_bytes)]

    def pump():
      try:
        for out, err in stream:
          if out:
            sinks[0].write(out)
          if err:
            sinks[1].write(err)
      except Exception:  # noqa: BLE001 - the stream ends with the process or the container
        pass

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    th.join(None if timeout is None else timeout + 3)
    if th.is_alive():  # Processes escaped `timeout` and still hold the output open.
      self.kill_all()
      th.join(10)
    for s in sinks:
      s.close()
    duration = time.perf_counter() - t0
    try:
      code = self.api.exec_inspect(ex["Id"]).get("ExitCode")
    except Exception as e:  # noqa: BLE001 - the engine restarted or the container is gone
      raise SandboxError(f"lost the command in sandbox {self.id} (Docker engine restarted or "
                         f"container removed?): {e}") from None
    code = -9 if code is None else code
    timed_out = timeout is not None and code in (137, -9, 124) and duration >= timeout - 0.05
    return base.ExecResult(exit_code=code, timed_out=timed_out, stdout=sinks[0].value(),
                           stderr=sinks[1].value(), duration_s=duration, started_at=started)

  def kill_all(self):
    if self.container is None or self._keeper_pid is None:
      return
    script = (f"for d in /proc/[0-9]*; do p=${{d#/proc/}}; case $p in 1|$$|{self._keeper_pid}) ;; "
              "*) kill -9 $p 2>/dev/null;; esac; done; true")
    try:
      ex = self.api.exec_create(self.container.id, ["/bin/sh", "-c", script], user="0:0")
      self.api.exec_start(ex["Id"])
    except Exception as e:  # noqa: BLE001
      raise SandboxError(f"cannot stop the processes of sandbox {self.id}: {e}") from None

  def _destroy(self):
    if self.container is not None:
      remove_container(self.client, self.container.id, REMOVE_TIMEOUT_S)


def wait_for_child_script(children_file: str = "/proc/1/task/1/children",
                          tries: int = 200, pause_s: float = 0.05) -> str:
  """Shell that prints the pids in ``children_file`` once there are any (at most
  ``tries * pause_s`` seconds). Right after ``start`` the container's init may not have forked
  its ``sleep`` yet, so one read can come back empty (seen once in CI under load)."""
  f = shlex.quote(children_file)
  return (f"i=0; c=$(cat {f} 2>/dev/null); while [ -z \"$c\" ] && [ $i -lt {int(tries)} ]; do "
          f"sleep {pause_s}; i=$((i+1)); c=$(cat {f} 2>/dev/null); done; echo \"$c\"")


def keeper_pid(children: str, sandbox_id: str) -> int:
  """The keeper's pid (``sleep infinity``, init's first child) from ``wait_for_child_script``'s
  output; a clear SandboxError when init never forked it."""
  pids = children.split()
  if not pids or not pids[0].isdigit():
    raise SandboxError(f"sandbox {sandbox_id}: the container's init started no keeper process "
                       f"within 10 s (children of pid 1: {children.strip()!r}); the host may be "
                       "overloaded or the image lacks /bin/sleep. Retry the trial, or check "
                       "`docker run --rm --init IMAGE sleep 1` works.")
  return int(pids[0])


_pending: set[str] = set()  # containers whose removal failed; retried by later sandboxes
_pending_lock = threading.Lock()


def remove_container(client, container_id: str, timeout_s: float = 60.0) -> bool:
  """Force-removes a container (and its volumes), retrying while the engine is unreachable
  (e.g. dockerd restarting) for up to ``timeout_s``. A container already gone counts as
  removed. On failure it is remembered and retried by ``retry_pending_removals``."""
  import docker
  deadline, delay = time.monotonic() + timeout_s, 0.5
  while True:
    try:
      client.api.remove_container(container_id, force=True, v=True)
      ok = True
    except docker.errors.NotFound:
      ok = True
    except Exception as e:  # noqa: BLE001 - engine down, or removal already in progress
      ok = False
      err = e
    if ok:
      with _pending_lock:
        _pending.discard(container_id)
      return True
    if time.monotonic() >= deadline:
      log.warning("could not remove container %s: %s (retried later)", container_id[:12], err)
      with _pending_lock:
        _pending.add(container_id)
      return False
    time.sleep(delay)
    delay = min(delay * 2, 5.0)


def retry_pending_removals(client) -> list[str]:
  """Removes the containers earlier removals left behind; returns those now gone."""
  with _pending_lock:
    ids = list(_pending)
  return [c for c in ids if remove_container(client, c, timeout_s=0)]
