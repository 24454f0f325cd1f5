"""Shared pieces for the security suite: a scripted proxy on a Unix socket, a tiny real policy
behind one, and adversarial repository builders."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import types

import pytest

from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
from legorl_jax.models import create_model, get_preset
from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer, ScriptedBackend
from legorl_jax.sampling import Engine
from legorl_jax.taskgen.synthetic import generate_tasks

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
TINY_MAX_LEN = 4096


def uds_proxy(backend, tokenizer, config) -> ProxyServer:
  """A started proxy on a fresh Unix socket that sandboxes (other uids) can reach."""
  sock_dir = tempfile.mkdtemp(prefix="lgsec-", dir="/tmp")
  os.chmod(sock_dir, 0o755)
  server = ProxyServer(backend, tokenizer, config, port=None,
                       uds=os.path.join(sock_dir, "proxy.sock")).start()
  server._sock_dir = sock_dir  # noqa: SLF001 -- removed at teardown
  return server


def stop(server):
  server.stop()
  shutil.rmtree(getattr(server, "_sock_dir", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="session")
def easy_tasks():
  return generate_tasks(3, seed=21, difficulty="easy")


@pytest.fixture(scope="session")
def scripted_uds_proxy(tokenizer, easy_tasks):
  """The gold-patch scripted policy behind a proxy (cheap, deterministic trials)."""
  policy = ScriptedPolicy(patches_by_instruction(easy_tasks))
  server = uds_proxy(ScriptedBackend(tokenizer, policy.reply), tokenizer,
                     ProxyConfig(model_name="policy"))
  yield server
  stop(server)


@pytest.fixture(scope="session")
def tiny_policy_proxy(tokenizer):
  """The random ``tiny`` policy on a real engine behind a proxy: real sampling, short replies."""
  cfg = get_preset("tiny").replace(max_position_embeddings=TINY_MAX_LEN)
  engine = Engine(create_model(cfg, seed=0), max_batch=4, max_len=TINY_MAX_LEN,
                  prefill_buckets=(1024, TINY_MAX_LEN), prefill_rows=(1,), decode_rows=(4,),
                  attn_buckets=(TINY_MAX_LEN,), decode_chunk=16, seed=0, decode_fn=tokenizer)
  engine.start()
  server = uds_proxy(EngineBackend(engine), tokenizer,
                     ProxyConfig(model_name="policy", force_temperature=1.0, max_tokens_cap=24))
  yield types.SimpleNamespace(proxy=server, engine=engine)
  stop(server)
  engine.stop()


# -- leak accounting -----------------------------------------------------------------------
def open_fds() -> int:
  return len(os.listdir("/proc/self/fd"))


def descendants(root: int) -> list[int]:
  """Live (non-zombie) processes whose parent chain reaches ``root``."""
  parent = {}
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z":
      parent[int(pid)] = int(fields[1])
  out = []
  for pid in parent:
    p = parent.get(pid)
    while p not in (None, 0, 1):
      if p == root:
        out.append(pid)
        break
      p = parent.get(p)
  return sorted(out)


# -- adversarial repositories --------------------------------------------------------------
def tar_bytes(members, compress: bool = False) -> bytes:
  """A tar archive of ``members``: (TarInfo, bytes or None) pairs, written as given."""
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w") as tf:
    for ti, data in members:
      if data is not None:
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
      else:
        tf.addfile(ti)
  return buf.getvalue()


def member(name, *, kind=tarfile.REGTYPE, linkname="", data=b"x"):
  ti = tarfile.TarInfo(name)
  ti.type, ti.linkname, ti.mode = kind, linkname, 0o644
  return ti, (data if kind == tarfile.REGTYPE else None)


def git(cwd, *args) -> str:
  return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True,
                        text=True).stdout


def repo_with_fix_in_history(path) -> str:
  """A git repo whose base commit has the bug and whose later commit, branch, tag and stash
  hold the fix (plus a remote); returns the base commit."""
  os.makedirs(path)
  git(path, "init", "-q", "-b", "main")
  with open(os.path.join(path, "m.py"), "w") as f:
    f.write("X = 1  # bug\n")
  git(path, "add", "-A")
  git(path, "commit", "-q", "-m", "base")
  base = git(path, "rev-parse", "HEAD").strip()
  git(path, "checkout", "-q", "-b", "fix")
  with open(os.path.join(path, "m.py"), "w") as f:
    f.write("X = 2  # THE FIX\n")
  git(path, "commit", "-q", "-am", "THE FIX")
  git(path, "tag", "fixed")
  git(path, "checkout", "-q", "main")
  git(path, "remote", "add", "origin", "https://example.invalid/upstream.git")
  return base
