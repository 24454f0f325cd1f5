"""The one sandbox interface: create from a task → exec → read/write → diff → destroy.

Inside every sandbox, whatever the backend, the layout is the same:

  <task.workdir> (default /workspace)   the repository, writable, squashed to one commit
  /home/agent                           private HOME, writable
  /tmp                                  scratch, writable
  /opt/legorl                           read-only support scripts (relay.py, pyrunner.py)
  /run/legorl/proxy.sock                the proxy's Unix socket, when configured
  everything else                       read-only (or absent); no network but loopback

The agent phase sees no hidden tests: they are written in only by the verifier.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
import shlex
import time
import uuid
from typing import Mapping, Sequence

from legorl_jax.errors import SandboxError
from legorl_jax.utils import procfs
from legorl_jax.sandbox import diff as diff_lib
from legorl_jax.tasks.schema import Task

log = logging.getLogger(__name__)

LABEL = "legorl.sandbox"
HOME = "/home/agent"
SUPPORT_DIR = "/opt/legorl"
PROXY_SOCKET = "/run/legorl/proxy.sock"
SUPPORT_FILES = {
    "relay.py": os.path.join(os.path.dirname(__file__), "relay.py"),
    "pyrunner.py": os.path.join(os.path.dirname(os.path.dirname(__file__)), "rewards", "pyrunner.py"),
}


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Backend-independent sandbox options. Limits left None come from ``task.limits``.

  ro_mounts: host paths made visible read-only inside the sandbox, each ``"/path"`` (same
    path inside) or ``("/host/path", "/inside/path")`` — harness CLIs, ``/usr/bin/node``.
  proxy_socket: host path of the proxy's Unix socket; the sandbox then serves it at
    ``http://127.0.0.1:{proxy_port}`` through ``relay.py``.
  """
  backend: str = "local"
  ro_mounts: tuple = ()
  proxy_socket: str | None = None
  proxy_port: int = 8080
  env: Mapping[str, str] = dataclasses.field(default_factory=dict)
  memory_mb: int | None = None
  pids: int | None = None
  cpus: float | None = None
  cpu_time_s: int | None = None
  tmp_mb: int = 1024
  # local backend
  base_dir: str | None = None
  require_isolation: bool = False
  # docker backend
  image: str | None = None
  docker_user: str = "1000:1000"
  read_only_rootfs: bool = True
  git_mirror_dir: str | None = None

  def mounts(self) -> list[tuple[str, str]]:
    out = []
    for m in self.ro_mounts:
      host, inside = (m, m) if isinstance(m, str) else tuple(m)
      if not os.path.isabs(host) or not os.path.isabs(inside):
        raise SandboxError(f"ro_mounts entry {m!r} must use absolute paths")
      out.append((host, inside))
    return out


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """Outcome of one command. ``stdout``/``stderr`` are empty when written to files."""
  exit_code: int
  timed_out: bool
  stdout: bytes
  stderr: bytes
  duration_s: float
  started_at: float

  @property
  def ok(self) -> bool:
    return self.exit_code == 0 and not self.timed_out


class OutputSink:
  """One output stream of a command: a host file (``path``) or captured bytes.

  Keeps the first ``limit`` bytes and the last ``tail`` bytes, with a line saying how much was
  dropped between them, so a command flooding its output costs bounded disk and memory while
  the end of the output (where harnesses report errors) survives.
  """

  def __init__(self, path: str | None, limit: int, tail: int = 64 << 10):
    self.f = open(path, "wb") if path else None
    self.buf, self.ring = bytearray(), bytearray()
    self.limit, self.tail = max(0, int(limit)), tail
    self.written = self.dropped = 0
    self._closed = False

  def write(self, b: bytes) -> None:
    if self.written < self.limit:
      head = b[: self.limit - self.written]
      if self.f is not None:
        self.f.write(head)
      else:
        self.buf += head
      self.written += len(head)
      b = b[len(head):]
    if b:
      self.dropped += len(b)
      self.ring += b[-self.tail:]
      if len(self.ring) > self.tail:
        del self.ring[: len(self.ring) - self.tail]

  def _trailer(self) -> bytes:
    if not self.dropped:
      return b""
    skipped = self.dropped - len(self.ring)
    return f"\n[legorl: {skipped} bytes of output dropped]\n".encode() + bytes(self.ring)

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    if self.f is not None:
      self.f.write(self._trailer())
      self.f.close()

  def value(self) -> bytes:
    """Captured bytes (empty when streaming to a file)."""
    return b"" if self.f is not None else bytes(self.buf) + self._trailer()


def as_argv(cmd: str | Sequence[str]) -> list[str]:
  if isinstance(cmd, str):
    return ["/bin/sh", "-c", cmd]
  argv = [str(c) for c in cmd]
  if not argv:
    raise SandboxError("exec needs a non-empty command")
  return argv


def new_sandbox_id() -> str:
  return f"lg{uuid.uuid4().hex[:12]}"


def pid_alive(pid: int) -> bool:
  """Whether process ``pid`` is running on this host: the reapers of both backends remove what
  a sandbox left behind only once the process that owned it is gone. A process of another user
  (PermissionError) counts as alive; a zombie (exited, not yet waited for by its parent: an
  owner that died in a container whose init does not reap) counts as gone, since it owns
  nothing any more."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return _proc_state(pid) != "Z"


def _proc_state(pid: int) -> str | None:
  """The state letter of process ``pid`` (``R``, ``S``, ``Z``...), or None where there is no
  procfs or the process is gone."""
  fields = procfs.stat_fields(f"/proc/{pid}/stat")
  return fields[0] if fields else None


class Sandbox(abc.ABC):
  """One isolated copy of a task's repository. Use as a context manager, or call destroy()."""

  def __init__(self, task: Task, config: SandboxConfig):
    self.task, self.config = task, config
    self.id = new_sandbox_id()
    self.workdir = task.workdir
    self.home = HOME
    self._start: dict[str, bytes] | None = None
    self._destroyed = False
    self.memory_mb = config.memory_mb or task.limits.memory_mb
    self.pids = config.pids or task.limits.pids
    self.cpus = config.cpus or task.limits.cpus
    self.created_at = time.time()

  # --- backend-specific -----------------------------------------------------------------
  @abc.abstractmethod
  def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
           env: Mapping[str, str] | None = None, cwd: str | None = None,
           stdout_path: str | None = None, stderr_path: str | None = None,
           stdin: bytes | None = None, max_output_bytes: int = 8 << 20) -> ExecResult:
    """Runs ``cmd`` (argv list, or a shell string for /bin/sh -c) inside the sandbox.

    ``cwd`` defaults to the work dir; ``env`` adds to the sandbox's base env (PATH, HOME,
    LANG, TMPDIR). On timeout (wall clock) every process the command started is killed and
    ``timed_out`` is set. ``stdout_path``/``stderr_path`` are host files to stream output
    to (for long-lived harnesses); otherwise output is captured. Either way at most
    ``max_output_bytes`` from the start plus a 64 KiB tail are kept (see ``OutputSink``).
    """

  @abc.abstractmethod
  def read_file(self, path: str) -> bytes:
    """Bytes of a file inside the sandbox (relative paths are under the work dir)."""

  @abc.abstractmethod
  def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
    """Creates or replaces a file inside the sandbox, with parent directories."""

  @abc.abstractmethod
  def snapshot(self) -> dict[str, bytes]:
    """{relative path: bytes} of the work dir, see ``legorl_jax.sandbox.diff``."""

  @abc.abstractmethod
  def kill_all(self) -> None:
    """Kills every process still running in the sandbox (before verification)."""

  @abc.abstractmethod
  def _destroy(self) -> None:
    ...

  def _create(self) -> None:
    """Backend-specific creation (work dir, container, ...); called once by ``_open``."""
    raise NotImplementedError

  # --- shared -----------------------------------------------------------------------------
  def _open(self) -> None:
    """Creates the sandbox and runs the task's setup; a failure leaves nothing behind."""
    try:
      self._create()
      self.run_setup()
    except BaseException:
      self.destroy()
      raise

  @property
  def proxy_url(self) -> str | None:
    return f"http://127.0.0.1:{self.config.proxy_port}" if self.config.proxy_socket else None

  def base_env(self) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": self.home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp",
           "USER": "agent", "GIT_CONFIG_NOSYSTEM": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(self.config.env)
    return env

  def resolve(self, path: str) -> str:
    p = path if path.startswith("/") else f"{self.workdir}/{path}"
    p = os.path.normpath(p)
    if ".." in p.split("/"):
      raise SandboxError(f"path {path!r} escapes the sandbox")
    return p

  def write_files(self, files: Mapping[str, bytes | str]) -> None:
    for path, data in files.items():
      self.write_file(path, data)

  def run_setup(self) -> None:
    """Runs the task's setup commands and records the start state for ``diff()``."""
    for cmd in self.task.setup_commands:
      r = self.exec(cmd, timeout=max(60.0, self.task.limits.timeout_s))
      if not r.ok:
        raise SandboxError(f"setup command {cmd!r} of task {self.task.id} failed "
                           f"(exit {r.exit_code}, timed_out={r.timed_out}): {r.stderr[-500:]!r}")
    self._start = self.snapshot()

  def diff(self) -> diff_lib.RepoDiff:
    """Changes to the work dir since the sandbox was created (after setup commands)."""
    if self._start is None:
      raise SandboxError("diff() before the start state was recorded (call run_setup first)")
    return diff_lib.compute_diff(self._start, self.snapshot())

  def apply_patch(self, patch: str, *, timeout: float = 60.0) -> ExecResult:
    """Applies a unified diff in the work dir with ``git apply`` (falls back to ``patch``)."""
    if not patch.strip():
      return ExecResult(0, False, b"", b"", 0.0, time.time())
    name = f"{self.home}/.legorl_patch_{uuid.uuid4().hex[:8]}.diff"
    self.write_file(name, patch)
    q = shlex.quote(name)
    r = self.exec(f"git -c core.hooksPath=/dev/null apply --whitespace=nowarn {q} "
                  f"|| patch -p1 --batch --forward < {q}; rc=$?; rm -f {q}; exit $rc", timeout=timeout)
    return r

  def destroy(self) -> None:
    """Removes everything the sandbox created; safe to call twice."""
    if self._destroyed:
      return
    self._destroyed = True
    self._destroy()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.destroy()
    return False

  def __del__(self):
    if not getattr(self, "_destroyed", True):
      try:
        self.destroy()
      except Exception:  # noqa: BLE001 - best effort at interpreter exit; the reaper handles the rest
        pass
