"""Materialising a task's repository on the host, and squashing its git history.

The agent must not find the fix in the history, so whatever the source, the working copy it
gets is a fresh git repository with exactly one commit, one branch and no remotes, tags,
stashes, reflogs or packed objects from the original.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile

from legorl_jax.errors import TaskError
from legorl_jax.tasks import tree_check
from legorl_jax.tasks.schema import RepoSource

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "legorl", "GIT_AUTHOR_EMAIL": "legorl@localhost",
    "GIT_COMMITTER_NAME": "legorl", "GIT_COMMITTER_EMAIL": "legorl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
    # Task URLs are untrusted: no `ext::` (runs commands) or other exotic transports.
    "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
}


def _git(args, cwd, timeout=600):
  env = {**os.environ, **_GIT_ENV, "HOME": cwd}
  p = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  if p.returncode != 0:
    raise TaskError(f"git {' '.join(args)} failed in {cwd}: {p.stderr.strip()[-500:]}")
  return p.stdout


def _resolve(repo: RepoSource, p: str) -> str:
  if os.path.isabs(p) or "://" in p or repo.base_dir is None:
    return p
  return os.path.join(repo.base_dir, p)


def materialize_repo(repo: RepoSource, dest: str, *, git_mirror_dir: str | None = None,
                     limits: tree_check.RepoLimits = tree_check.DEFAULT_LIMITS) -> None:
  """Creates ``dest`` holding the repository's files at the task's base state.

  The contents are untrusted: members or links that leave the repository, special files and
  anything over ``limits`` are refused with a TaskError naming the entry (see
  ``tree_check``), and nothing is left at ``dest``.

  ``git_mirror_dir``: for git sources, a directory of local clones named ``owner__name``
  (or ``owner__name.git``) used instead of the network URL when present.
  """
  if os.path.exists(dest):
    raise TaskError(f"destination {dest!r} already exists")
  try:
    _materialize(repo, dest, git_mirror_dir, limits)
    tree_check.check_tree(dest, _describe(repo), limits)
  except BaseException:
    shutil.rmtree(dest, ignore_errors=True)
    raise


def _describe(repo: RepoSource) -> str:
  if repo.kind == "git":
    return f"{repo.url}@{repo.commit}"
  return repo.path or "<inline archive>"


def _materialize(repo, dest, git_mirror_dir, limits):
  if repo.kind == "dir":
    src = _resolve(repo, repo.path)
    if not os.path.isdir(src):
      raise TaskError(f"repository directory {src!r} does not exist; fix repo.path")
    tree_check.check_tree(src, repr(src), limits)  # before copying: refuse a huge tree early
    shutil.copytree(src, dest, symlinks=True)
  elif repo.kind == "archive":
    if repo.data is not None:
      fileobj = io.BytesIO(repo.data)
    else:
      src = _resolve(repo, repo.path)
      if not os.path.isfile(src):
        raise TaskError(f"repository archive {src!r} does not exist; fix repo.path")
      fileobj = open(src, "rb")
    os.makedirs(dest)
    what = repr(repo.path) if repo.path else "(inline archive_b64)"
    try:
      with tarfile.open(fileobj=fileobj, mode="r:*") as tf:
        members = tree_check.check_archive(tf, what, limits)
        top_dirs = {m.name.strip("/") for m in members if m.isdir() and not m.name.startswith(".")}
        tf.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
      detail = " ".join(str(e).split())[:400]
      raise TaskError(f"repository archive {what} is unreadable ({type(e).__name__}: {detail}); "
                      "repo archives must be .tar, .tar.gz, .tar.bz2 or .tar.xz files") from None
    finally:
      fileobj.close()
    _strip_single_top_dir(dest, top_dirs)
  elif repo.kind == "git":
    url = _resolve(repo, repo.url)
    if git_mirror_dir:
      name = url.rstrip("/").removesuffix(".git").split("/")[-2:]
      for cand in ("__".join(name), "__".join(name) + ".git"):
        if os.path.isdir(os.path.join(git_mirror_dir, cand)):
          url = os.path.join(git_mirror_dir, cand)
          break
    os.makedirs(dest)
    try:
      _git(["init", "-q"], dest)
      _git(["fetch", "-q", "--depth", "1", "--", url, repo.commit], dest)
      _git(["checkout", "-q", "FETCH_HEAD"], dest)
    except (TaskError, subprocess.TimeoutExpired) as e:
      raise TaskError(f"cannot fetch {url} at {repo.commit}: {e}") from None
  else:
    raise TaskError(f"unknown repository kind {repo.kind!r}")


def _strip_single_top_dir(dest, top_dirs):
  """Archives made with ``tar czf x.tgz project/`` hold one top directory (with its own
  entry): unwrap it. File-only archives (as ``archive_dir`` writes) are left alone."""
  entries = os.listdir(dest)
  if (len(entries) == 1 and entries[0] in top_dirs and os.path.isdir(os.path.join(dest, entries[0]))
      and entries[0] != ".git"):
    top = os.path.join(dest, entries[0])
    tmp = dest + ".unwrap"
    os.rename(top, tmp)
    os.rmdir(dest)
    os.rename(tmp, dest)


def squash_git_history(path: str, message: str = "Initial commit") -> str:
  """Replaces any history in ``path`` by one commit of the current files; returns its hash."""
  dot_git = os.path.join(path, ".git")
  if os.path.islink(dot_git) or os.path.isfile(dot_git):  # a `gitdir:` file would redirect git
    os.unlink(dot_git)
  shutil.rmtree(dot_git, ignore_errors=True)
  _git(["init", "-q", "-b", "main"], path)
  _git(["config", "core.hooksPath", "/dev/null"], path)
  _git(["add", "-A", "."], path)
  _git(["commit", "-q", "--allow-empty", "--no-verify", "-m", message], path)
  return _git(["rev-parse", "HEAD"], path).strip()


def archive_dir(path: str) -> bytes:
  """A deterministic .tar.gz of ``path`` (sorted, zeroed times and owners), without .git."""
  buf = io.BytesIO()
  import gzip
  with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
    with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
      for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__"))
        for name in sorted(files):
          full = os.path.join(root, name)
          rel = os.path.relpath(full, path)
          ti = tf.gettarinfo(full, arcname=rel)
          ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
          if ti.isreg():
            with open(full, "rb") as f:
              tf.addfile(ti, f)
          else:
            tf.addfile(ti)
  return buf.getvalue()


def files_to_archive(files: dict[str, str | bytes]) -> bytes:
  """A deterministic .tar.gz of an in-memory {relative path: content} mapping."""
  buf = io.BytesIO()
  import gzip
  with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
    with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
      for rel in sorted(files):
        data = files[rel].encode() if isinstance(files[rel], str) else files[rel]
        ti = tarfile.TarInfo(rel)
        ti.size, ti.mode = len(data), 0o644
        tf.addfile(ti, io.BytesIO(data))
  return buf.getvalue()
