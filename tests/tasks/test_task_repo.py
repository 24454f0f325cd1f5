"""Materialising repositories and squashing their history (checked with the git CLI)."""

import io
import os
import subprocess
import tarfile

import pytest

from legorl_jax.errors import TaskError
from legorl_jax.tasks.repo import archive_dir, materialize_repo, squash_git_history
from legorl_jax.tasks.schema import RepoSource

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}


def git(cwd, *args):
  return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout


def make_history(path):
  """A repo whose later commit (on another branch and a tag) holds 'THE FIX'."""
  os.makedirs(path)
  git(path, "init", "-q", "-b", "main")
  (open(os.path.join(path, "m.py"), "w")).write("x = 1  # bug\n")
  git(path, "add", "-A")
  git(path, "commit", "-q", "-m", "base")
  base = git(path, "rev-parse", "HEAD").strip()
  git(path, "checkout", "-q", "-b", "fix")
  open(os.path.join(path, "m.py"), "w").write("x = 2  # THE FIX\n")
  git(path, "commit", "-q", "-am", "THE FIX")
  git(path, "tag", "v-fix")
  git(path, "checkout", "-q", "main")
  git(path, "remote", "add", "origin", "https://example.invalid/repo.git")
  return base


def test_git_source_at_base_commit_then_squashed(tmp_path):
  src = str(tmp_path / "src")
  base = make_history(src)
  dest = str(tmp_path / "dest")
  materialize_repo(RepoSource(kind="git", url=src, commit=base), dest)
  assert open(os.path.join(dest, "m.py")).read() == "x = 1  # bug\n"
  squash_git_history(dest)
  log_all = git(dest, "log", "--all", "--format=%s")
  assert log_all.strip() == "Initial commit"
  assert git(dest, "remote").strip() == ""
  assert git(dest, "for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]
  # No object anywhere in the store mentions the fix.
  objs = git(dest, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
  for line in objs:
    content = subprocess.run(["git", "cat-file", "-p", line.split()[0]], cwd=dest, capture_output=True).stdout
    assert b"THE FIX" not in content
  assert git(dest, "status", "--porcelain") == ""


def test_dir_and_archive_sources(tmp_path):
  src = tmp_path / "proj"
  (src / "pkg").mkdir(parents=True)
  (src / "pkg" / "a.py").write_text("A = 1\n")
  d1 = str(tmp_path / "d1")
  materialize_repo(RepoSource(kind="dir", path="proj", base_dir=str(tmp_path)), d1)
  assert open(os.path.join(d1, "pkg", "a.py")).read() == "A = 1\n"
  data = archive_dir(str(src))
  assert data == archive_dir(str(src))  # deterministic
  d2 = str(tmp_path / "d2")
  materialize_repo(RepoSource(kind="archive", data=data), d2)
  assert open(os.path.join(d2, "pkg", "a.py")).read() == "A = 1\n"
  # A tarball with a single top directory is unwrapped.
  tgz = tmp_path / "p.tar.gz"
  subprocess.run(["tar", "czf", str(tgz), "-C", str(tmp_path), "proj"], check=True)
  d3 = str(tmp_path / "d3")
  materialize_repo(RepoSource(kind="archive", path=str(tgz)), d3)
  assert os.listdir(d3) == ["pkg"]


def test_unsafe_archive_and_missing_sources_fail_clearly(tmp_path):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tf:
    ti = tarfile.TarInfo("../escape.txt")
    ti.size = 1
    tf.addfile(ti, io.BytesIO(b"x"))
  with pytest.raises(TaskError, match="escapes the repository"):
    materialize_repo(RepoSource(kind="archive", data=buf.getvalue()), str(tmp_path / "e"))
  assert not (tmp_path / "escape.txt").exists()
  with pytest.raises(TaskError, match="does not exist"):
    materialize_repo(RepoSource(kind="dir", path=str(tmp_path / "missing")), str(tmp_path / "m"))
  with pytest.raises(TaskError, match="cannot fetch"):
    materialize_repo(RepoSource(kind="git", url=str(tmp_path / "nogit"), commit="abc1234"), str(tmp_path / "g"))
