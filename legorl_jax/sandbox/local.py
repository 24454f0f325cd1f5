"""Local sandbox: a fresh copy of the repository, isolated with bubblewrap.

Each ``exec`` runs under ``bwrap`` with new user, PID, network, IPC and UTS namespaces:
only loopback networking, a root made of read-only system directories (/usr, /etc, ...)
plus the sandbox's own writable work dir, HOME and /tmp — the rest of the host (task files,
hidden tests, other sandboxes) is simply absent. Resource limits come from ``prlimit``
(processes, memory via RLIMIT_DATA, file size, CPU time). When run as root, every sandbox
gets its own unprivileged uid, so the process limit is per sandbox and its files are
unwritable to anything else. On timeout the whole process group is killed; because bwrap
is the namespace's init, every process in it dies too.

Without bwrap the sandbox runs commands directly in the copied repository (the weaker mode,
warned about once per process: no network or filesystem isolation), unless
``require_isolation``.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

from legorl_jax.errors import SandboxError, TaskError
from legorl_jax.sandbox import base, diff as diff_lib, host_death, uids
from legorl_jax.tasks import repo as repo_lib
from legorl_jax.tasks.schema import Task
from legorl_jax.utils import log_once

log = logging.getLogger(__name__)
WEAKER_MODE_KEY = "sandbox.local.weaker_mode"  # the once-per-process warning (utils.log_once)

MARKER = "legorl_sandbox.json"
_MAX_FILE_BYTES = 2 << 30
_MAX_READ_BYTES = 256 << 20
_reaped_dirs: set[str] = set()
_reap_lock = threading.Lock()


def default_base_dir() -> str:
  return os.path.join(tempfile.gettempdir(), "legorl_sandboxes")


def bwrap_path() -> str | None:
  return shutil.which("bwrap")


def reap_local(base_dir: str | None = None, *, everything: bool = False) -> list[str]:
  """Removes sandbox dirs whose owning process is gone (or all with ``everything``)."""
  base_dir = base_dir or default_base_dir()
  removed = []
  if not os.path.isdir(base_dir):
    return removed
  for name in os.listdir(base_dir):
    root = os.path.join(base_dir, name)
    try:
      with open(os.path.join(root, MARKER)) as f:
        info = json.load(f)
    except (OSError, ValueError):
      continue
    if everything or not base.pid_alive(int(info.get("owner_pid", -1))):
      if os.geteuid() == 0 and info.get("uid") not in (None, 0):
        _kill_uid(int(info["uid"]))
      _rmtree(root)
      removed.append(root)
  return removed


def _rmtree(path):
  def onerror(func, p, exc):
    try:
      os.chmod(os.path.dirname(p), 0o700)
      os.chmod(p, 0o700)
      func(p)
    except OSError:
      pass
  shutil.rmtree(path, onerror=onerror)


# The sandbox uids (reserved host-wide: ``uids``); these names are kept for callers.
processes_of_uid = uids.processes_of_uid
sandbox_processes = uids.sandbox_processes
own_sandbox_processes = uids.own_processes
_kill_uid = uids.kill_uid


class LocalSandbox(base.Sandbox):
  """See the module docstring. Create with ``LocalSandbox(task, config)``."""

  def __init__(self, task: Task, config: base.SandboxConfig):
    super().__init__(task, config)
    self.base_dir = config.base_dir or default_base_dir()
    with _reap_lock:
      if self.base_dir not in _reaped_dirs:
        _reaped_dirs.add(self.base_dir)
        for r in reap_local(self.base_dir):
          log.info("reaped leftover sandbox %s", r)
    self.bwrap = bwrap_path()
    if self.bwrap is None:
      if config.require_isolation:
        raise SandboxError("bubblewrap (bwrap) is not installed; `apt-get install -y bubblewrap`, "
                           "or set require_isolation=False to accept the weaker mode")
      log_once.warning(log, WEAKER_MODE_KEY, "bubblewrap not found: local sandboxes in this "
                       "process run WITHOUT network or filesystem isolation (weaker mode); "
                       "install bubblewrap for real isolation")
      log.debug("local sandbox %s runs in the weaker mode", self.id)
    self.isolated = self.bwrap is not None
    self.uid = uids.allocate() if os.geteuid() == 0 else None
    self.root = os.path.join(self.base_dir, self.id)
    self._live: set[subprocess.Popen] = set()
    self._lock = threading.Lock()
    self._n_exec = 0
    self._areas = {}
    self._open()

  # --- creation -----------------------------------------------------------------------------
  def _create(self):
    os.makedirs(self.root, mode=0o711)
    with open(os.path.join(self.root, MARKER), "w") as f:
      json.dump({"id": self.id, "owner_pid": os.getpid(), "uid": self.uid, "task": self.task.id,
                 "created": self.created_at}, f)
    work = os.path.join(self.root, "work")
    try:
      repo_lib.materialize_repo(self.task.repo, work, git_mirror_dir=self.config.git_mirror_dir)
    except TaskError:
      raise
    except OSError as e:
      raise SandboxError(f"cannot copy repository of task {self.task.id}: {e}") from e
    repo_lib.squash_git_history(work)
    for d in ("home", "tmp", "support", "exec"):
      os.makedirs(os.path.join(self.root, d))
    os.chmod(os.path.join(self.root, "tmp"), 0o1777)
    for name, src in base.SUPPORT_FILES.items():
      shutil.copyfile(src, os.path.join(self.root, "support", name))
    if self.uid is not None:
      for d in ("work", "home", "tmp"):
        _chown_tree(os.path.join(self.root, d), self.uid)
    if self.isolated:
      self._areas = {self.workdir: "work", base.HOME: "home", "/tmp": "tmp", base.SUPPORT_DIR: "support"}
    else:
      self.workdir = os.path.join(self.root, "work")
      self.home = os.path.join(self.root, "home")
      self._areas = {self.workdir: "work", self.home: "home", os.path.join(self.root, "tmp"): "tmp",
                     os.path.join(self.root, "support"): "support"}
    self._port = self.config.proxy_port if self.isolated else _free_port()

  @property
  def proxy_url(self):
    return f"http://127.0.0.1:{self._port}" if self.config.proxy_socket else None

  @property
  def support_dir(self) -> str:
    return base.SUPPORT_DIR if self.isolated else os.path.join(self.root, "support")

  # --- paths --------------------------------------------------------------------------------
  def host_path(self, path: str) -> str:
    """Host path of a sandbox path inside a writable area; refuses symlink escapes."""
    p = self.resolve(path) if self.isolated else os.path.normpath(
        path if os.path.isabs(path) else os.path.join(self.workdir, path))
    for inside, area in sorted(self._areas.items(), key=lambda kv: -len(kv[0])):
      if p == inside or p.startswith(inside.rstrip("/") + "/"):
        area_root = os.path.join(self.root, area)
        host = os.path.join(area_root, os.path.relpath(p, inside))
        real_parent = os.path.realpath(os.path.dirname(host))
        if not (real_parent + "/").startswith(os.path.realpath(area_root) + "/") and real_parent != os.path.realpath(area_root):
          raise SandboxError(f"path {path!r} resolves outside the sandbox")
        return host
    raise SandboxError(f"path {path!r} is outside the sandbox's work dir, HOME and /tmp")

  def read_file(self, path):
    """The file's bytes. The agent controls the tree, so a link, FIFO or device planted at
    ``path`` is refused (never followed, never blocked on), as is a file over 256 MiB."""
    host = self.host_path(path)
    try:
      fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
      raise SandboxError(f"cannot read {path!r} in sandbox {self.id}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
      st = os.fstat(fd)
      if not stat.S_ISREG(st.st_mode):
        raise SandboxError(f"cannot read {path!r} in sandbox {self.id}: not a regular file")
      if st.st_size > _MAX_READ_BYTES:
        raise SandboxError(f"cannot read {path!r} in sandbox {self.id}: {st.st_size} bytes is over "
                           f"the {_MAX_READ_BYTES}-byte limit")
      return f.read(_MAX_READ_BYTES)

  def write_file(self, path, data, mode=0o644):
    host = self.host_path(path)
    data = data.encode() if isinstance(data, str) else data
    parent = os.path.dirname(host)
    os.makedirs(parent, exist_ok=True)
    if os.path.islink(host):
      os.unlink(host)
    fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.chmod(host, mode)
    if self.uid is not None:
      _chown_upwards(host, os.path.join(self.root, os.path.relpath(host, self.root).split("/")[0]), self.uid)

  def snapshot(self):
    return diff_lib.snapshot_dir(os.path.join(self.root, "work"))

  # --- exec ---------------------------------------------------------------------------------
  def _bwrap_argv(self, cwd: str) -> list[str]:
    # As root, bwrap sets up the mounts with root's rights (so read-only mounts of root-owned
    # paths such as ~/.cache work) and `setpriv` then drops to the sandbox's own uid. As a
    # normal user, bwrap itself runs unprivileged in a new user namespace.
    unshare = (["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
               if self.uid is not None else ["--unshare-all"])
    a = [self.bwrap, "--die-with-parent", *unshare, "--new-session", "--hostname", "sandbox"]
    for d in ("/usr", "/etc"):
      a += ["--ro-bind", d, d]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
      if os.path.islink(d):
        a += ["--symlink", os.readlink(d), d]
      elif os.path.isdir(d):
        a += ["--ro-bind", d, d]
    a += ["--proc", "/proc", "--dev", "/dev"]
    # Parents of mount points on the new root must be world-traversable (bwrap running as
    # root would otherwise create them 0700).
    dests = [base.HOME, self.workdir, base.SUPPORT_DIR] + [i for _, i in self.config.mounts()]
    if self.config.proxy_socket:
      dests.append(base.PROXY_SOCKET)
    made = set()
    for dst in dests:
      parts = dst.strip("/").split("/")[:-1]
      for k in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:k])
        if d in made or d in ("/usr", "/etc", "/tmp", "/proc", "/dev") or d.startswith(("/usr/", "/etc/")):
          continue
        made.add(d)
        a += ["--perms", "0755", "--dir", d]
    a += ["--bind", os.path.join(self.root, "tmp"), "/tmp",
          "--bind", os.path.join(self.root, "home"), base.HOME,
          "--bind", os.path.join(self.root, "work"), self.workdir,
          "--ro-bind", os.path.join(self.root, "support"), base.SUPPORT_DIR]
    for host, inside in self.config.mounts():
      if not os.path.exists(host):
        raise SandboxError(f"read-only mount source {host!r} does not exist")
      a += ["--ro-bind", host, inside]
    if self.config.proxy_socket:
      a += ["--bind", self.config.proxy_socket, base.PROXY_SOCKET]
    a += ["--chdir", cwd, "--"]
    if self.uid is not None:
      a += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]
    return a

  def _limits_argv(self) -> list[str]:
    lim = [f"--data={self.memory_mb << 20}", f"--fsize={_MAX_FILE_BYTES}", "--core=0"]
    if self.uid is not None:
      lim.append(f"--nproc={self.pids}")
    if self.config.cpu_time_s:
      lim.append(f"--cpu={self.config.cpu_time_s}")
    return ["prlimit", *lim, "--"]

  def _relay_wrap(self, argv):
    sock = base.PROXY_SOCKET if self.isolated else self.config.proxy_socket
    relay = os.path.join(self.support_dir, "relay.py")
    script = (f'r=/tmp/.legorl_relay_$$; python3 {relay} --listen 127.0.0.1:{self._port} --unix {sock} '
              f'--ready-file $r >/dev/null 2>&1 & i=0; while [ ! -e $r ] && [ $i -lt 500 ]; '
              f'do sleep 0.01; i=$((i+1)); done; rm -f $r; exec "$@"')
    return ["/bin/sh", "-c", script, "legorl-relay", *argv]

  def exec(self, cmd, *, timeout=None, env=None, cwd=None, stdout_path=None, stderr_path=None,
           stdin=None, max_output_bytes=8 << 20):
    if self._destroyed:
      raise SandboxError(f"sandbox {self.id} is destroyed")
    argv = base.as_argv(cmd)
    if self.config.proxy_socket:
      argv = self._relay_wrap(argv)
    cwd = self.resolve(cwd or self.workdir) if self.isolated else (cwd or self.workdir)
    full_env = self.base_env()
    if not self.isolated:
      full_env["TMPDIR"] = os.path.join(self.root, "tmp")
    full_env.update(env or {})
    if self.isolated:
      argv = self._limits_argv() + self._bwrap_argv(cwd) + argv
    else:
      argv = self._limits_argv() + argv
    argv = host_death.die_with_host_argv() + argv  # dies with this process, from its fork on
    kwargs = {}
    if self.uid is not None and not self.isolated:
      kwargs = {"user": self.uid, "group": self.uid, "extra_groups": []}
    sinks = [base.OutputSink(stdout_path, max_output_bytes), base.OutputSink(stderr_path, max_output_bytes)]
    t0, started = time.perf_counter(), time.time()
    try:
      # Pipes, not files: a command flooding its output must not fill the host's disk.
      p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                           start_new_session=True, cwd=None if self.isolated else cwd, **kwargs)
    except OSError as e:
      for s in sinks:
        s.close()
      raise SandboxError(f"cannot start command in sandbox {self.id}: {e}") from e
    with self._lock:
      self._live.add(p)
    stop = threading.Event()
    pumps = [threading.Thread(target=_pump, args=(pipe, sink, stop), daemon=True)
             for pipe, sink in ((p.stdout, sinks[0]), (p.stderr, sinks[1]))]
    for th in pumps:
      th.start()
    timed_out = False
    try:
      if stdin is not None:
        try:
          p.stdin.write(stdin)
          p.stdin.close()
        except BrokenPipeError:
          pass
      p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      timed_out = True
      _killpg(p.pid)
      if not self.isolated and self.uid is not None:
        _kill_uid(self.uid)
      p.wait()
    finally:
      with self._lock:
        self._live.discard(p)
      # Leftover processes of the command may still hold the pipes: drain briefly, then stop.
      for th in pumps:
        th.join(5.0)
      stop.set()
      for th in pumps:
        th.join()
      for s in sinks:
        s.close()
      p.stdout.close()
      p.stderr.close()
    duration = time.perf_counter() - t0
    return base.ExecResult(exit_code=p.returncode, timed_out=timed_out, stdout=sinks[0].value(),
                           stderr=sinks[1].value(), duration_s=duration, started_at=started)

  def kill_all(self):
    with self._lock:
      live = list(self._live)
    for p in live:
      _killpg(p.pid)
    if self.uid is not None:
      _kill_uid(self.uid)

  def _destroy(self):
    try:
      self.kill_all()
    finally:
      if os.path.isdir(self.root):
        _rmtree(self.root)
      if self.uid is not None:
        uids.release(self.uid)


def _killpg(pid):
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _pump(pipe, sink, stop):
  """Copies ``pipe`` into ``sink`` until EOF, or until ``stop`` is set and nothing is ready."""
  fd = pipe.fileno()
  poller = select.poll()  # not select.select: that fails once the process has >= 1024 fds open
  poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
  while True:
    ready = poller.poll(200)
    if not ready:
      if stop.is_set():
        return
      continue
    data = os.read(fd, 1 << 16)
    if not data:
      return
    sink.write(data)


def _chown_tree(path, uid):
  os.lchown(path, uid, uid)
  for dirpath, dirnames, filenames in os.walk(path):
    for name in dirnames + filenames:
      os.lchown(os.path.join(dirpath, name), uid, uid)


def _chown_upwards(path, stop, uid):
  """Chowns ``path`` and the directories above it, up to and including ``stop``."""
  p = path
  while True:
    os.lchown(p, uid, uid)
    if os.path.normpath(p) == os.path.normpath(stop) or len(p) <= len(stop):
      break
    p = os.path.dirname(p)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
