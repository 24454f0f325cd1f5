"""Run-directory files on a local disk or an object store (``gs://``), through one small API.

The host-side writers (metrics, trial records, summary, plots, dashboard) call these
functions instead of ``open``/``os`` so the same run can write to ``/tmp/run`` or to
``gs://bucket/run``. Local paths go straight to the OS. ``gs://``, ``s3://``, ``az://`` and
``hf://`` go through ``etils.epath`` (shipped with orbax; it needs ``gcsfs`` or TensorFlow at
run time for ``gs://``). Any other ``scheme://`` goes to ``fsspec`` by scheme name, which is
how the tests exercise the remote code path (``memory://``) without a network.

Object stores cannot append to an object, so ``AppendFile`` keeps a remote file's lines in
memory and rewrites the whole object on ``flush`` (run-level logs are small: a few thousand
lines); local files are appended to in place.
"""

from __future__ import annotations

import os
import posixpath
from typing import IO

from legorl_jax import errors

EPATH_SCHEMES = ("gs", "s3", "az", "hf")


def scheme(path) -> str:
  """``"gs"`` for ``gs://b/x``; ``""`` for a local path."""
  p = os.fspath(path)
  return p.split("://", 1)[0] if "://" in p else ""


def is_remote(path) -> bool:
  return bool(scheme(path))


def join(base, *parts: str) -> str:
  """``os.path.join`` for local paths; ``/``-joined URLs for remote ones."""
  base = os.fspath(base)
  if not is_remote(base):
    return os.path.join(base, *parts)
  return posixpath.join(base, *parts)


def _fsspec(path: str):
  try:
    import fsspec
  except ImportError as e:  # pragma: no cover -- fsspec ships with etils/orbax
    raise errors.ConfigError(f"{path!r} needs fsspec: pip install fsspec") from e
  try:
    return fsspec.filesystem(scheme(path))
  except (ImportError, ValueError) as e:
    raise errors.ConfigError(
        f"No file system for {scheme(path)}:// paths ({e}); install its fsspec driver or use a "
        "local workdir.") from e


def _epath(path: str):
  from etils import epath
  return epath.Path(path)


def _remote_call(path: str, what: str, fn):
  try:
    return fn()
  except (ImportError, NotImplementedError) as e:
    hint = " (gs:// needs `pip install gcsfs`)" if scheme(path) == "gs" else ""
    raise errors.ConfigError(f"Cannot {what} {path}: {e}{hint}.") from e


def open_file(path, mode: str = "r") -> IO:
  """Opens ``path`` (``r``/``w``/``rb``/``wb``; ``a`` only for local paths)."""
  path = os.fspath(path)
  s = scheme(path)
  if not s:
    return open(path, mode)
  if "a" in mode:
    raise errors.ConfigError(f"Object stores cannot append ({path}); use paths.AppendFile.")
  if s in EPATH_SCHEMES:
    return _remote_call(path, "open", lambda: _epath(path).open(mode))
  return _fsspec(path).open(path, mode)


def exists(path) -> bool:
  path = os.fspath(path)
  s = scheme(path)
  if not s:
    return os.path.exists(path)
  if s in EPATH_SCHEMES:
    return _remote_call(path, "check", lambda: _epath(path).exists())
  return _fsspec(path).exists(path)


def makedirs(path) -> None:
  """Creates a directory and its parents (object stores have none: a no-op there unless the
  driver keeps directory markers)."""
  path = os.fspath(path)
  s = scheme(path)
  if not s:
    os.makedirs(path, exist_ok=True)
  elif s in EPATH_SCHEMES:
    _remote_call(path, "create", lambda: _epath(path).mkdir(parents=True, exist_ok=True))
  else:
    _fsspec(path).makedirs(path, exist_ok=True)


def read_text(path) -> str:
  with open_file(path, "r") as f:
    return f.read()


def write_text(path, text: str) -> None:
  """Writes a whole file (creating the parent directory)."""
  path = os.fspath(path)
  parent = posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)
  if parent:
    makedirs(parent)
  with open_file(path, "w") as f:
    f.write(text)


class AppendFile:
  """A line-oriented file opened for appending, locally or on an object store.

  ``write`` buffers remote text; ``flush`` (called by ``write`` unless ``autoflush=False``)
  rewrites the object with everything written so far, previous content included.
  """

  def __init__(self, path, autoflush: bool = True):
    self.path = os.fspath(path)
    self.autoflush = autoflush
    self._remote = is_remote(self.path)
    parent = (posixpath if self._remote else os.path).dirname(self.path)
    if parent:
      makedirs(parent)
    if self._remote:
      self._text = read_text(self.path) if exists(self.path) else ""
      self._dirty = False
      self._f = None
    else:
      self._f = open(self.path, "a", buffering=1)

  def write(self, text: str) -> None:
    if not self._remote:
      self._f.write(text)
      return
    self._text += text
    self._dirty = True
    if self.autoflush:
      self.flush()

  def flush(self) -> None:
    if not self._remote:
      self._f.flush()
    elif self._dirty:
      write_text(self.path, self._text)
      self._dirty = False

  def close(self) -> None:
    self.flush()
    if self._f is not None:
      self._f.close()
      self._f = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def append_lines(path, lines) -> None:
  """Appends ``lines`` (strings without newlines) in one go: one rewrite for a remote file."""
  with AppendFile(path, autoflush=False) as f:
    for line in lines:
      f.write(line + "\n")
