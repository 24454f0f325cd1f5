"""The project's files, from a directory, a git checkout, an sdist archive or a PyPI release.

Whatever the source, the result is one clean directory tree: no ``.git``, no byte code, no
build or tool caches, so the content hash (which names the Docker image and the task ids)
depends only on files a developer would commit.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

from legorl_jax.errors import TaskError
from legorl_jax.tasks import repo as repo_lib, tree_check
from legorl_jax.tasks.schema import RepoSource

_JUNK_DIRS = {".git", "__pycache__", ".tox", ".nox", ".eggs", ".pytest_cache", ".mypy_cache",
              ".ruff_cache", ".hypothesis", "build", "dist", ".venv", "venv", ".idea", ".vscode"}
_JUNK_SUFFIXES = (".pyc", ".pyo", ".so", ".egg")
_PYPI_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*==[A-Za-z0-9][A-Za-z0-9.+!_\-]*$")


@dataclasses.dataclass(frozen=True)
class Project:
  """A project ready to build tasks from. ``root``: its clean tree on the host."""
  root: str
  name: str
  version: str
  origin: str          # what the user pointed at (path or NAME==VERSION)
  content_hash: str    # sha256 over the sorted (path, bytes) of the tree, 16 hex digits

  @property
  def slug(self) -> str:
    """Lower-case ``name-version`` usable in Docker tags and task ids."""
    s = re.sub(r"[^a-z0-9._-]+", "-", f"{self.name}-{self.version}".lower()).strip("-.")
    return s or "project"


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "legorl_jax", "sdists")


def fetch_pypi_sdist(spec: str, cache_dir: str | None = None, timeout_s: float = 300.0) -> str:
  """Path of the sdist of ``NAME==VERSION`` (``pip download --no-binary :all: --no-deps``),
  kept in ``cache_dir`` so a second build needs no network."""
  if not _PYPI_SPEC.match(spec or ""):
    raise TaskError(f"--pypi={spec!r} is not NAME==VERSION (for example inflection==0.5.1)")
  name, version = spec.split("==")
  dest = os.path.join(cache_dir or default_cache_dir(), f"{name.lower()}-{version}")
  found = _sdists_in(dest)
  if found:
    return found[0]
  os.makedirs(dest, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="legorl-sdist-", dir=dest) as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           "--disable-pip-version-check", "-q", "-d", tmp, spec]
    try:
      p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
      raise TaskError(f"pip download of {spec} took over {timeout_s:.0f}s; check the network") from None
    got = _sdists_in(tmp)
    if p.returncode != 0 or not got:
      raise TaskError(f"cannot download the sdist of {spec} (pip exit {p.returncode}): "
                      f"{p.stderr.strip()[-600:]}; check the name and version on PyPI (the release "
                      "must publish an sdist)")
    final = os.path.join(dest, os.path.basename(got[0]))
    os.replace(got[0], final)
  return final


def _sdists_in(d: str) -> list[str]:
  return sorted(p for pat in ("*.tar.gz", "*.tgz", "*.zip", "*.tar.bz2")
                for p in glob.glob(os.path.join(d, pat)))


def load_project(path: str, dest: str, *, origin: str | None = None) -> Project:
  """Copies the project at ``path`` (directory, git checkout, or sdist archive) into the new
  directory ``dest`` as a clean tree; raises TaskError naming what is wrong with ``path``."""
  if os.path.exists(dest):
    raise TaskError(f"destination {dest!r} already exists")
  try:
    if os.path.isdir(path):
      if os.path.exists(os.path.join(path, ".git")):
        _copy_git_checkout(path, dest)
      else:
        repo_lib.materialize_repo(RepoSource(kind="dir", path=os.path.abspath(path)), dest)
    elif os.path.isfile(path):
      if path.endswith(".zip"):
        _extract_zip(path, dest)
      else:
        repo_lib.materialize_repo(RepoSource(kind="archive", path=os.path.abspath(path)), dest)
      _unwrap_single_dir(dest)  # sdists hold one top directory, with or without its own entry
    else:
      raise TaskError(f"--from_repo={path!r} does not exist; give a project directory, a git "
                      "checkout or an sdist archive (.tar.gz / .zip)")
    _clean(dest)
    if not any(f.endswith(".py") for _, _, fs in os.walk(dest) for f in fs):
      raise TaskError(f"{path!r} holds no Python files; the builder needs a Python project")
    name, version = _name_version(dest, path)
    return Project(root=dest, name=name, version=version, origin=origin or path,
                   content_hash=tree_hash(dest))
  except BaseException:
    shutil.rmtree(dest, ignore_errors=True)
    raise


def _copy_git_checkout(src: str, dest: str) -> None:
  """Tracked files plus untracked, not-ignored ones (what ``git status`` would show)."""
  p = subprocess.run(["git", "-C", src, "ls-files", "-z", "-co", "--exclude-standard"],
                     capture_output=True, timeout=120)
  if p.returncode != 0:
    raise TaskError(f"{src!r} has a .git but `git ls-files` failed: "
                    f"{p.stderr.decode(errors='replace')[-300:]}")
  os.makedirs(dest)
  for rel in sorted(set(p.stdout.decode().split("\0")) - {""}):
    s = os.path.join(src, rel)
    if not os.path.isfile(s) or os.path.islink(s):
      continue  # deleted in the work tree, a submodule, or a link
    d = os.path.join(dest, rel)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    shutil.copy2(s, d)


def _extract_zip(path: str, dest: str) -> None:
  os.makedirs(dest)
  try:
    with zipfile.ZipFile(path) as zf:
      for info in zf.infolist():
        name = info.filename
        if name.startswith("/") or ".." in name.split("/"):
          raise TaskError(f"sdist {path!r} has a member outside the archive root: {name!r}")
      zf.extractall(dest)
  except zipfile.BadZipFile as e:
    raise TaskError(f"sdist {path!r} is not a readable zip archive: {e}") from None
  tree_check.check_tree(dest, repr(path), tree_check.DEFAULT_LIMITS)  # sizes and counts, as for tars


def _unwrap_single_dir(dest: str) -> None:
  entries = os.listdir(dest)
  if len(entries) == 1 and entries[0] != ".git" and os.path.isdir(os.path.join(dest, entries[0])):
    top = os.path.join(dest, entries[0])
    tmp = dest + ".unwrap"
    os.rename(top, tmp)
    os.rmdir(dest)
    os.rename(tmp, dest)


def _clean(root: str) -> None:
  for dirpath, dirnames, filenames in os.walk(root, topdown=True):
    for d in list(dirnames):
      if d in _JUNK_DIRS:
        shutil.rmtree(os.path.join(dirpath, d), ignore_errors=True)
        dirnames.remove(d)
    for f in filenames:
      full = os.path.join(dirpath, f)
      if f.endswith(_JUNK_SUFFIXES) or os.path.islink(full):
        os.unlink(full)


def tree_hash(root: str) -> str:
  """sha256 of the tree's sorted relative paths and contents, 16 hex digits."""
  h = hashlib.sha256()
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    for f in sorted(filenames):
      full = os.path.join(dirpath, f)
      rel = os.path.relpath(full, root)
      h.update(rel.encode() + b"\0")
      with open(full, "rb") as fh:
        h.update(hashlib.sha256(fh.read()).digest())
  return h.hexdigest()[:16]


def _name_version(root: str, origin: str) -> tuple[str, str]:
  """From PKG-INFO (sdists), pyproject.toml [project], setup.cfg [metadata], else the path."""
  pkg_info = os.path.join(root, "PKG-INFO")
  if os.path.isfile(pkg_info):
    text = open(pkg_info, encoding="utf-8", errors="replace").read()
    n = re.search(r"^Name:\s*(\S+)", text, re.M)
    v = re.search(r"^Version:\s*(\S+)", text, re.M)
    if n and v:
      return n.group(1), v.group(1)
  from legorl_jax.taskgen.repo import env_spec
  meta = env_spec.read_pyproject(root).get("project", {})
  if isinstance(meta.get("name"), str):
    return meta["name"], str(meta.get("version") or "0")
  cfg = env_spec.read_setup_cfg(root)
  if cfg.has_option("metadata", "name"):
    return cfg.get("metadata", "name"), cfg.get("metadata", "version", fallback="0")
  base = os.path.basename(os.path.normpath(origin))
  for suffix in (".tar.gz", ".tgz", ".zip", ".tar.bz2"):
    base = base.removesuffix(suffix)
  return base or "project", "0"
