"""Snapshots of a working tree and the diff between two of them.

A snapshot is ``{relative path: bytes}`` of every file, with symlinks stored as their target
(never followed: an agent's symlink to a host file must not be read on the host). ``.git``,
``__pycache__`` and ``*.pyc`` are left out: they are not part of the agent's answer.
The diff does not trust git inside the sandbox, which the agent controls.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import os
import stat
import tarfile

SYMLINK_PREFIX = b"\x00symlink:"
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache"}


def _skip(rel: str) -> bool:
  parts = rel.split("/")
  return any(p in _SKIP_DIRS for p in parts) or rel.endswith(".pyc")


@dataclasses.dataclass(frozen=True)
class FileChange:
  path: str
  kind: str  # "added" | "modified" | "deleted"
  binary: bool = False


@dataclasses.dataclass(frozen=True)
class RepoDiff:
  """Changes from the start state; ``patch`` is a git-style unified diff (text files)."""
  changes: tuple[FileChange, ...]
  patch: str

  @property
  def paths(self) -> list[str]:
    return [c.path for c in self.changes]

  @property
  def empty(self) -> bool:
    return not self.changes


def snapshot_dir(root: str, max_file_bytes: int = 64 << 20) -> dict[str, bytes]:
  """Every file under ``root`` (not following symlinks), keyed by relative POSIX path."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
    rel_dir = os.path.relpath(dirpath, root)
    dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
    for name in dirnames + filenames:
      full = os.path.join(dirpath, name)
      rel = name if rel_dir == "." else f"{rel_dir}/{name}"
      if _skip(rel):
        continue
      try:
        st = os.lstat(full)
      except OSError:
        continue
      if stat.S_ISLNK(st.st_mode):
        out[rel] = SYMLINK_PREFIX + os.fsencode(os.readlink(full))
      elif stat.S_ISREG(st.st_mode):
        if st.st_size > max_file_bytes:
          out[rel] = b"\x00large:%d" % st.st_size
          continue
        try:
          fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
          out[rel] = b"\x00unreadable"
          continue
        with os.fdopen(fd, "rb") as f:
          out[rel] = f.read()
  return out


def snapshot_tar(data: bytes, strip: str = "") -> dict[str, bytes]:
  """Snapshot from a tar archive (as ``docker get_archive`` returns), dropping ``strip/``."""
  out = {}
  with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
    for m in tf:
      name = m.name
      if strip:
        if name == strip or not name.startswith(strip + "/"):
          continue
        name = name[len(strip) + 1:]
      while name.startswith("./"):
        name = name[2:]
      if not name or _skip(name):
        continue
      if m.issym():
        out[name] = SYMLINK_PREFIX + m.linkname.encode()
      elif m.isreg():
        f = tf.extractfile(m)
        out[name] = f.read() if f is not None else b""
  return out


def _is_text(b: bytes) -> bool:
  if b"\x00" in b[:8192]:
    return False
  try:
    b.decode("utf-8")
    return True
  except UnicodeDecodeError:
    return False


def compute_diff(before: dict[str, bytes], after: dict[str, bytes]) -> RepoDiff:
  """Changed files and a ``git apply``-able unified diff of the text ones."""
  changes, chunks = [], []
  for path in sorted(set(before) | set(after)):
    a, b = before.get(path), after.get(path)
    if a == b:
      continue
    kind = "added" if a is None else "deleted" if b is None else "modified"
    binary = not all(_is_text(x) for x in (a, b) if x is not None)
    changes.append(FileChange(path, kind, binary))
    if binary:
      chunks.append(f"diff --git a/{path} b/{path}\nBinary files differ\n")
      continue
    a_lines = a.decode().splitlines(keepends=True) if a is not None else []
    b_lines = b.decode().splitlines(keepends=True) if b is not None else []
    head = f"diff --git a/{path} b/{path}\n"
    if kind == "added":
      head += "new file mode 100644\n"
    elif kind == "deleted":
      head += "deleted file mode 100644\n"
    body = difflib.unified_diff(a_lines, b_lines, "/dev/null" if a is None else f"a/{path}",
                                "/dev/null" if b is None else f"b/{path}", n=3)
    text = []
    for line in body:
      text.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    chunks.append(head + "".join(text))
  return RepoDiff(tuple(changes), "".join(chunks))
