"""The run-file path layer on a local directory and on a non-local file system (fsspec's
in-memory ``memory://``, which has no append and no ``os`` access, like an object store)."""

import json
import os

import fsspec
import pytest

from legorl_jax import errors
from legorl_jax.utils import paths


@pytest.fixture
def memroot():
  root = "memory://legorl_test_paths"
  fs = fsspec.filesystem("memory")
  yield root
  if fs.exists(root):
    fs.rm(root, recursive=True)


def test_local_paths_are_plain_os_paths(tmp_path):
  d = str(tmp_path / "a" / "b")
  assert paths.join(d, "x.json") == os.path.join(d, "x.json") and not paths.is_remote(d)
  paths.write_text(paths.join(d, "x.json"), '{"k": 1}')  # creates the parents
  assert json.load(open(os.path.join(d, "x.json"))) == {"k": 1}
  with paths.AppendFile(os.path.join(d, "log.jsonl")) as f:
    f.write("1\n")
  paths.append_lines(os.path.join(d, "log.jsonl"), ["2", "3"])
  assert open(os.path.join(d, "log.jsonl")).read() == "1\n2\n3\n"


def test_remote_append_rewrites_the_whole_object(memroot):
  p = paths.join(memroot, "run", "trials.jsonl")
  assert p == memroot + "/run/trials.jsonl" and paths.scheme(p) == "memory"
  assert not paths.exists(p)
  f = paths.AppendFile(p)
  f.write("a\n")
  # Visible to other readers after every write (autoflush), as a metrics log must be.
  assert fsspec.filesystem("memory").cat(p).decode() == "a\n"
  f.write("b\n")
  f.close()
  paths.append_lines(p, ["c", "d"])  # a later writer (a resumed run) keeps what was there
  assert paths.read_text(p) == "a\nb\nc\nd\n"
  with pytest.raises(errors.ConfigError, match="append"):
    paths.open_file(p, "a")


def test_gs_urls_are_joined_not_touched():
  # No network here: only the URL handling is checked; epath/gcsfs do the I/O on a TPU VM.
  assert paths.join("gs://bucket/run", "eval", "x.json") == "gs://bucket/run/eval/x.json"
  assert paths.is_remote("gs://bucket/run") and paths.scheme("gs://bucket/run") == "gs"


def test_unknown_scheme_names_the_problem():
  with pytest.raises(errors.ConfigError, match="nosuchfs://"):
    paths.exists("nosuchfs://bucket/x")
