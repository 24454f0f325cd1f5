"""What the npm-distributed harness CLIs (OpenCode, Codex, Claude Code) share.

Each is installed under its own npm prefix (``legorl_jax.harnesses.install``) and mounted
read-only into the sandbox at ``/opt/harness/<name>``. The pinned versions ship native
executables (Bun-compiled OpenCode and Claude Code, a static musl Codex), so no Node.js runtime
is needed inside the sandbox; when an entry point is a JavaScript file instead, the host's
``node`` and the shared libraries it needs outside glibc are mounted too, so it also runs in a
minimal container of the same glibc family.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

from legorl_jax.harnesses import base, install

INSIDE_ROOT = "/opt/harness"
# Libraries every glibc-based image (Debian minbase included) already has.
_BASE_LIBS = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|"
                        r"libresolv|libutil|linux-vdso)\.so")
# How the proxy's 400 ``context_length_exceeded`` surfaces in each CLI's output: the proxy's
# own message ("prompt is too long: ..."), or Codex's "ran out of room in the model's context
# window".
_CONTEXT_OVERFLOW = re.compile(
    r"context_length_exceeded|prompt is too long|context window|maximum context", re.IGNORECASE)


def is_script(path: str | os.PathLike) -> bool:
  """True when ``path`` is an interpreted script (``#!``), False for a native executable."""
  try:
    with open(path, "rb") as f:
      return f.read(2) == b"#!"
  except OSError:
    return False


def node_mounts(node: str | None = None) -> list[str]:
  """Host paths that make ``node`` runnable in a sandbox: the binary and any shared library
  it links beyond the glibc base set (e.g. Debian's ``libnode``)."""
  node = node or shutil.which("node") or "/usr/bin/node"
  node = os.path.realpath(node)
  mounts = [node]
  try:
    out = subprocess.run(["ldd", node], capture_output=True, text=True, timeout=10).stdout
  except (OSError, subprocess.SubprocessError):
    return mounts
  for line in out.splitlines():
    m = re.match(r"\s*(\S+)\s+=>\s+(/\S+)", line)
    if m and not _BASE_LIBS.match(m.group(1)):
      mounts.append(os.path.realpath(m.group(2)))
  return mounts


def mentions_context_overflow(text: str) -> bool:
  return bool(_CONTEXT_OVERFLOW.search(text))


class NpmCliAdapter(base.HarnessAdapter):
  """An adapter whose CLI lives under ``install.install_dir(pin)``.

  Subclasses set ``pin`` (the ``install.PINS`` key) and ``entry`` (the program's path relative
  to the install dir; a native executable when the package ships one). ``min_memory_mb`` is
  read by ``legorl_jax.rollout.trial`` as the sandbox's memory floor.
  """

  pin: str = ""
  entry: str = ""
  # The local sandbox bounds memory with RLIMIT_DATA, which counts committed address space;
  # Bun's JavaScriptCore heap and allocator commit several GiB up front (4 GiB aborts OpenCode
  # mid-run), so these CLIs ask the trial runner for a higher floor.
  min_memory_mb: int = 8192

  @property
  def host_root(self) -> pathlib.Path:
    return install.install_dir(self.pin)

  @property
  def inside_root(self) -> str:
    return f"{INSIDE_ROOT}/{self.pin}"

  def host_entry(self) -> pathlib.Path:
    return self.host_root / self.entry

  def executable(self) -> str | None:
    p = self.host_entry()
    return str(p) if p.is_file() and os.access(p, os.X_OK) else None

  def install_hint(self) -> str:
    return f"python -m legorl_jax.harnesses.install {self.pin}"

  def ro_mounts(self) -> list:
    mounts: list = [(str(self.host_root), self.inside_root)]
    if is_script(self.host_entry()):
      mounts += node_mounts()
    return mounts

  def entry_argv(self) -> list[str]:
    """The program as seen inside the sandbox (``node <script>`` for a JavaScript entry)."""
    inside = f"{self.inside_root}/{self.entry}"
    if is_script(self.host_entry()):
      return [os.path.realpath(shutil.which("node") or "/usr/bin/node"), inside]
    return [inside]

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    """ok on exit 0; overlong when a failing run reports the proxy's context overflow."""
    if timed_out:
      return base.HARNESS_TIMEOUT
    if exit_code == 0:
      return base.HARNESS_OK
    if mentions_context_overflow(stdout_tail + stderr_tail):
      return base.HARNESS_OVERLONG
    return base.HARNESS_ERROR
