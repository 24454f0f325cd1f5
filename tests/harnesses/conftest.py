"""Shared fixtures for harness tests: tasks, a scripted proxy, a tiny neural proxy, a trial
runner, and the checks every adapter test makes on its recordings.

  easy_tasks                      3 synthetic easy tasks (session)
  scripted_proxy(tasks, **kw)     a started ProxyServer on a Unix socket whose backend is a
                                  ScriptedPolicy over ``tasks`` (kw go to ScriptedPolicy);
                                  ``server.replies`` lists every text it answered
  tiny_engine_proxy               namespace(proxy, model, engine, temperature, max_len): the
                                  random ``tiny`` policy behind a proxy (max_len 8192)
  make_tiny_engine_proxy(max_len) the same with another context length (cached per length)
  run_harness_trials(adapter, proxy, tasks, backend="local"|"docker", ...) -> [TrialResult]

Check helpers (plain functions, import them from ``tests.harnesses.conftest``):
  require_installed(adapter)           pytest.skip naming the install command if missing
  check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
  check_token_faithful(model, trajectory)
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import threading
import types

import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
from legorl_jax.models import create_model, get_preset
from legorl_jax.models import tokenizer as tokenization
from legorl_jax.models.decoder import KVCache
from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer, ScriptedBackend
from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sampling import Engine
from legorl_jax.sandbox import SandboxConfig
from legorl_jax.taskgen.synthetic import generate_tasks

TINY_MAX_LEN = 8192
TINY_TEMPERATURE = 1.0
TINY_MAX_TOKENS = 48  # per call: junk text, keep trials short


def start_proxy(backend, tokenizer, config: ProxyConfig) -> ProxyServer:
  """A proxy on a fresh Unix socket (what trials relay into the sandbox)."""
  sock_dir = tempfile.mkdtemp(prefix="lgpx-", dir="/tmp")
  os.chmod(sock_dir, 0o755)
  uds = os.path.join(sock_dir, "proxy.sock")
  server = ProxyServer(backend, tokenizer, config, port=None, uds=uds).start()
  os.chmod(uds, 0o666)  # the sandbox's unprivileged uid connects to it
  server._legorl_sock_dir = sock_dir  # noqa: SLF001 -- removed at teardown
  return server


def stop_proxy(server: ProxyServer):
  server.stop()
  shutil.rmtree(getattr(server, "_legorl_sock_dir", ""), ignore_errors=True)


def require_installed(adapter):
  """Skips (naming the install command) when the adapter's CLI is not installed."""
  try:
    adapter.check_installed()
  except errors.HarnessError as e:
    pytest.skip(f"{e} (CI runs `python -m legorl_jax.harnesses.install all`)")


def docker_available() -> bool:
  try:
    import docker
    docker.from_env().ping()
    return True
  except Exception:  # noqa: BLE001 -- any failure means "no engine"
    return False


@pytest.fixture(scope="session")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="session")
def easy_tasks():
  return generate_tasks(3, seed=11, difficulty="easy")


@pytest.fixture(scope="session")
def scripted_proxy(tokenizer):
  """Factory: ``scripted_proxy(tasks, max_len=32768, **policy_kwargs) -> ProxyServer``."""
  servers = []

  def make(tasks, *, max_len: int = 32768, policy: ScriptedPolicy | None = None, **policy_kwargs):
    policy = policy or ScriptedPolicy(patches_by_instruction(tasks), **policy_kwargs)
    replies, lock = [], threading.Lock()

    def reply(request):
      text = policy.reply(request)
      with lock:
        replies.append(text)
      return text

    server = start_proxy(ScriptedBackend(tokenizer, reply, max_len=max_len), tokenizer,
                         ProxyConfig(model_name="policy"))
    server.replies, server.policy = replies, policy
    servers.append(server)
    return server

  yield make
  for s in servers:
    stop_proxy(s)


@pytest.fixture(scope="session")
def make_tiny_engine_proxy(tokenizer):
  """Factory: ``make_tiny_engine_proxy(max_len)`` -> namespace(proxy, model, engine, ...)."""
  made = {}

  def make(max_len: int = TINY_MAX_LEN):
    if max_len in made:
      return made[max_len]
    cfg = get_preset("tiny").replace(max_position_embeddings=max(max_len, 4096))
    model = create_model(cfg, seed=0)
    attn = tuple(sorted({min(2048, max_len), max_len}))
    engine = Engine(model, max_batch=4, max_len=max_len, prefill_buckets=(512, 2048),
                    prefill_rows=(1,), decode_rows=(4,), attn_buckets=attn, decode_chunk=16,
                    seed=0, decode_fn=tokenizer)
    engine.start()
    proxy = start_proxy(EngineBackend(engine), tokenizer,
                        ProxyConfig(model_name="policy", force_temperature=TINY_TEMPERATURE,
                                    max_tokens_cap=TINY_MAX_TOKENS))
    made[max_len] = types.SimpleNamespace(proxy=proxy, model=model, engine=engine,
                                          temperature=TINY_TEMPERATURE, max_len=max_len)
    return made[max_len]

  yield make
  for ns in made.values():
    stop_proxy(ns.proxy)
    ns.engine.stop()


@pytest.fixture(scope="session")
def tiny_engine_proxy(make_tiny_engine_proxy):
  return make_tiny_engine_proxy(TINY_MAX_LEN)


@pytest.fixture(scope="session")
def run_harness_trials(tmp_path_factory):
  """Factory: runs one trial per task and returns the TrialResults (in task order)."""

  def run(adapter, proxy, tasks, backend: str = "local", *, timeout_s: float = 240.0,
          max_turns: int = 8, concurrency: int = 3, max_retries: int = 0, out_dir=None):
    require_installed(adapter)
    if backend == "docker" and not docker_available():
      pytest.skip("no Docker engine (`bash .ci/setup_system.sh` starts one)")
    out_dir = str(out_dir or tmp_path_factory.mktemp(f"{adapter.name}-{backend}"))
    cfg = TrialConfig(harness_timeout_s=timeout_s, max_turns=max_turns,
                      sandbox=SandboxConfig(backend=backend))
    return run_trials([TrialJob(t, adapter) for t in tasks], proxy, cfg, out_dir,
                      concurrency=concurrency, max_retries=max_retries)

  return run


# -- checks ----------------------------------------------------------------------------------
def describe(res) -> str:
  """A failure message with what to look at."""
  out = [f"{res.task_id}: status={res.status} harness_status={res.harness_status} "
         f"exit={res.exit_code} error={res.error[:800]}"]
  for name, path in res.log_paths.items():
    try:
      with open(path, errors="replace") as f:
        out.append(f"--- {name} (tail)\n{f.read()[-1500:]}")
    except OSError:
      pass
  return "\n".join(out)


def check_masks(trajectory):
  """Loss mask is 1 exactly on each call's sampled ids (at its sample_offset), 0 elsewhere,
  and logprobs are 0 where the mask is 0; side streams never reach the train segments."""
  calls = trajectory.calls
  for seg in trajectory.segments + trajectory.side_segments:
    ids, mask, logps = seg.token_ids, seg.loss_mask, seg.logprobs
    assert len(ids) == len(mask) == len(logps)
    want = np.zeros(len(ids), np.int64)
    for ci in seg.calls:
      c = calls[ci]
      assert c.segment == seg.id
      off, n = c.sample_offset, len(c.token_ids)
      assert ids[off:off + n] == c.token_ids
      assert ids[:len(c.prompt_ids)] == c.prompt_ids, "prompt must prefix its segment"
      want[off:off + n] = 1
    np.testing.assert_array_equal(np.asarray(mask), want)
    assert all(lp == 0.0 for lp, m in zip(logps, mask) if m == 0)
  assert all(s.train and s.stream == "main" for s in trajectory.segments)
  assert all(not s.train for s in trajectory.side_segments)


def check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments: int | None = 1):
  """Scripted trial: solved, every main call's sampled ids are the tokenization of one of
  the scripted replies (+ end of turn), masks exact, the expected number of train segments."""
  assert res.status == st.SOLVED, describe(res)
  traj = res.trajectory
  assert traj is not None and traj.calls, describe(res)
  check_masks(traj)
  eot = tokenization.special_token_ids(tokenizer)["im_end"]
  replies = {tuple(tokenizer.encode(r, add_special_tokens=False)) + (eot,) for r in proxy.replies}
  for c in traj.calls:
    assert tuple(c.token_ids) in replies, c.index
    assert all(lp == 0.0 for lp in c.logprobs)
  if expected_train_segments is not None:
    assert len(traj.segments) == expected_train_segments, (
        [(s.reason, s.calls) for s in traj.segments], describe(res))
  n_masked = sum(s.sampled for s in traj.segments)
  assert n_masked == sum(len(c.token_ids) for c in traj.main_calls)
  return traj


_FULL_FORWARD_MAX = 4096  # longer: chunked teacher forcing through the KV cache (O(T) memory)
_CHUNK = 512
# The cache grows by this many slots as the chunks reach them. A chunk's attention costs in
# proportion to the slots it reads, so a 17k-token segment read against the whole 17k-slot
# cache from its first chunk spent ~40% of its work on empty slots (masked, so the logits are
# the same either way); 4096-slot steps keep that waste small at five compiles.
_GROW = 4096


def _grown(cache: KVCache, slots: int) -> KVCache:
  """``cache`` with empty (zero) slots added up to ``slots``."""
  pad = lambda a: jnp.pad(a, ((0, 0), (0, slots - a.shape[1]), (0, 0), (0, 0)))  # noqa: E731
  return KVCache(k=tuple(map(pad, cache.k)), v=tuple(map(pad, cache.v)))


# Compiled at LLVM -O2 whatever the session's flags: this program runs ~35 times per long
# segment and its cost is run time (a chunk's softmax over up to 20k slots), which the suite's
# -O0 code (tests/conftest.py) runs ~1.7x slower: Claude Code's 17k-token segment, warm,
# 34 -> 18 CPU-s (2026-12-06). Only the speed changes: the same ops, no fast-math at any level.
_RESCORE_COMPILE = {"xla_backend_optimization_level": 2}


@functools.partial(jax.jit, static_argnums=0, compiler_options=_RESCORE_COMPILE)
def _chunk_logits(graphdef, state, ids, positions, cache):
  model = nnx.merge(graphdef, state)
  hidden, cache = model.decode(ids, positions, cache)
  return model.logits_from_hidden(hidden), cache


def _teacher_forced_logits(model, token_ids):
  """float64 [T, V] logits of a teacher-forced pass. Up to 4096 tokens: one full forward
  (``model(ids)``, the training path). Longer (harness prompts reach 17k tokens, whose [T, T]
  attention would need tens of GB): 512-token chunks through ``Decoder.decode`` with a KV cache,
  a path tests/models/test_decoder.py checks against the full forward."""
  n = len(token_ids)
  if n <= _FULL_FORWARD_MAX:
    return np.asarray(model(jnp.asarray([token_ids], jnp.int32))[0], np.float64)
  size = -(-n // _CHUNK) * _CHUNK
  cache = model.init_cache(1, min(size, _GROW))
  ids = np.zeros(size, np.int32)
  ids[:n] = token_ids
  pos = np.where(np.arange(size) < n, np.arange(size), -1).astype(np.int32)
  graphdef, state = nnx.split(model)
  out = []
  for start in range(0, size, _CHUNK):
    if start + _CHUNK > cache.max_len:  # grow the slots: a chunk attends to no more than it needs
      cache = _grown(cache, min(size, cache.max_len + _GROW))
    sl = slice(start, start + _CHUNK)
    logits, cache = _chunk_logits(graphdef, state, jnp.asarray(ids[None, sl]),
                                  jnp.asarray(pos[None, sl]), cache)
    out.append(np.asarray(logits[0], np.float64))
  return np.concatenate(out)[:n]


def rescore(model, token_ids, temperature):
  """out[t] = log p(token_ids[t] | token_ids[:t]) (float64 NumPy log-softmax of the model's
  logits / temperature); out[0] = 0."""
  logits = _teacher_forced_logits(model, token_ids)
  if temperature > 0:
    logits = logits / temperature
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  out = np.zeros(len(token_ids))
  out[1:] = logp[np.arange(len(token_ids) - 1), np.asarray(token_ids[1:])]
  return out


def check_token_faithful(model, trajectory, tol: float = 1e-5) -> int:
  """Every sampled token of every segment (train and side) re-scored by the model equals the
  recorded logprob; returns how many tokens were checked."""
  check_masks(trajectory)
  calls = trajectory.calls
  checked = 0
  for seg in trajectory.segments + trajectory.side_segments:
    if not seg.calls:
      continue
    temps = {calls[ci].temperature for ci in seg.calls}
    assert len(temps) == 1, temps
    ref = rescore(model, seg.token_ids, temps.pop())
    for t, (m, lp) in enumerate(zip(seg.loss_mask, seg.logprobs)):
      if m:
        assert abs(ref[t] - lp) < tol, (seg.id, t, ref[t], lp)
        checked += 1
  return checked


def check_accounted(results, tasks):
  """One final result per task, each with a known status."""
  assert [r.task_id for r in results] == [t.id for t in tasks]
  for r in results:
    st.check(r.status)
    assert r.trajectory is not None or r.status == st.SANDBOX_ERROR, describe(r)


def check_policy_trials(model, results, tasks):
  """Tiny-policy trials: one accounted result per task, each ending with a policy status (not
  an infrastructure one), each recording re-scored token for token by ``model``."""
  check_accounted(results, tasks)
  for r in results:
    assert r.status in (st.FAILED, st.OVERLONG, st.SOLVED, st.TIMEOUT), describe(r)
    assert check_token_faithful(model, r.trajectory) > 0, describe(r)
