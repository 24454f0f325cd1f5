"""Continuous-batching sampling engine with a KV prefix cache shared across sessions.

One background thread owns the device: it admits queued requests into free cache rows,
starts each from the longest cached prefix of its prompt (``sampling.prefix_cache``: any
row's, or the prefix store's; requests admitted together share the prefill of what they have
in common), prefills the rest in fixed chunks aligned to positions, and runs ``decode_chunk``
sampling steps at a time over all live rows; finished rows are freed between chunks. Callers
on any thread (``generate``) or asyncio task (``agenerate``) just wait for their
``Completion``.

Shapes are drawn from fixed buckets (prefill rows x attention window, decode rows x attention
window, prefix copies x window), so after the bucket set has compiled no request recompiles
anything.

Parameter updates (``update_params``) wait for the requests submitted before them, so every
completion is sampled with one parameter version, which it records.

What a completion holds: the sampled ids and, per id, the logprob it was drawn with (see
``sampling.sample`` for the convention); a stop string cuts the completion after the token
that completes it, ids and logprobs alike.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import threading
import time
from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from legorl_jax import errors
from legorl_jax.models import params as model_params
from legorl_jax.models.decoder import Decoder
from legorl_jax.sampling import prefix_cache, steps
from legorl_jax.sampling.cache import Cache
from legorl_jax.sampling.params import Completion, SamplingParams
from legorl_jax.sampling.slots import SlotTable
from legorl_jax.sampling.stop import as_decode_fn, find_stop
from legorl_jax.sharding import rules as sharding_rules


def _bucket(buckets: Sequence[int], need: int) -> int:
  """Smallest bucket >= need (the largest one if none is)."""
  for b in buckets:
    if b >= need:
      return b
  return buckets[-1]


def _geometric(lo: int, hi: int, factor: int) -> tuple[int, ...]:
  out, b = [], lo
  while b < hi:
    out.append(b)
    b *= factor
  return tuple(out) + (hi,)


@dataclasses.dataclass(eq=False)
class _Request:
  prompt: list[int]
  params: SamplingParams
  session: Hashable | None
  future: concurrent.futures.Future
  seed: int
  t_submit: float
  slot: int = -1
  reuse: int = 0
  next_prefill: int = 0  # next prompt position to prefill; prefill ends at len(prompt) - 1
  prompt_np: np.ndarray | None = None  # the prompt as an int array (prefix matching)
  search: bool = True  # look for a longer cached prefix before the next prefill
  ids: list[int] = dataclasses.field(default_factory=list)
  logps: list[float] = dataclasses.field(default_factory=list)
  stop_checked: int = 0
  version: int = 0
  t_admit: float = 0.0
  t_ready: float = 0.0

  @property
  def prefill_end(self) -> int:
    return len(self.prompt) - 1


class Engine:
  """Serves ``generate`` requests from many threads on one model.

  Args:
    model: a ``Decoder``; the engine uses its parameter buffers as they are (pass a copy if
      they will be donated elsewhere). If they live on a mesh, the cache is placed on that
      mesh with K/V heads sharded like the attention weights.
    max_batch: cache rows = most requests decoded at once (idle rows keep session prefixes).
    max_len: cache slots per row; prompt + max_tokens must fit.
    prefill_chunk: the fixed prefill chunk length ``C`` (default: the smallest of
      ``prefill_buckets``, else 64). Prompts are prefilled in chunks aligned to absolute
      positions (``[kC, (k+1)C)``), so a prefix copied from the cache and one prefilled afresh
      are computed identically (see ``sampling.prefix_cache``).
    prefill_buckets: older spelling; only its smallest entry is used (as ``prefill_chunk``).
    prefill_rows: how many rows one prefill call may fill (buckets).
    decode_rows: decode runs on cache rows ``[0, b)`` for the smallest bucket ``b`` covering
      every live row (rows are handed out lowest index first).
    attn_buckets: attention window lengths (default: powers of two from 128 up to max_len).
    decode_chunk: sampling steps per device call (host round trip).
    max_stop_ids: most stop token ids per request.
    seed: engine seed for requests without ``SamplingParams.seed``.
    decode_fn: tokenizer (``.decode``) or ``ids -> str``, needed for stop strings only.
    prefix_reuse: the prefix cache: a request starts from the longest prompt prefix whose K/V
      any row (its session's, another request's, a running one's) or the prefix store holds,
      and requests admitted together share the prefill of their common prefix (off: always
      prefill it all). Outputs are bit-identical either way (fp32, same decode shapes).
    prefix_cache_gb: memory for the prefix store, in GiB: extra cache rows (of max_len slots)
      that keep prefixes whose row went to another request, least recently used evicted
      (0: cached prefixes live only in the max_batch rows).
    reuse_sampled_kv: a session's next turn also reuses the K/V its sampled tokens got in
      decode steps (less prefill per turn; results then agree with a cache-off run to float
      tolerance, not bit for bit).
    cache_dtype: K/V dtype (default: the model's compute dtype).
    join_window_s: after admitting a request, how long to wait for another before decoding
      (while rows are free). Callers that submit together (a group of trials, a benchmark's
      threads) land a few ms apart; without the wait the first arrivals decode a whole chunk
      before the rest join. The first rows' prefill runs meanwhile, so the wait is mostly
      hidden. Only requests submitted within the window join; 0 disables it.
  """

  def __init__(self, model: Decoder, *, max_batch: int = 16, max_len: int = 2048,
               prefill_buckets: Sequence[int] | None = None,
               prefill_rows: Sequence[int] | None = None, decode_rows: Sequence[int] | None = None,
               attn_buckets: Sequence[int] | None = None, decode_chunk: int = 16,
               max_stop_ids: int = 8, seed: int = 0, decode_fn=None, prefix_reuse: bool = True,
               cache_dtype=None, join_window_s: float = 0.003, prefill_chunk: int | None = None,
               prefix_cache_gb: float = 0.0, reuse_sampled_kv: bool = False):
    cfg = model.config
    if max_batch < 1 or decode_chunk < 1 or max_stop_ids < 1:
      raise errors.ConfigError(
          f"Engine needs max_batch, decode_chunk and max_stop_ids >= 1, got {max_batch}, "
          f"{decode_chunk}, {max_stop_ids}.")
    if not 0 <= join_window_s < 1:
      raise errors.ConfigError(f"Engine join_window_s={join_window_s} must be in [0, 1) seconds.")
    if not 2 <= max_len <= cfg.max_position_embeddings:
      raise errors.ConfigError(
          f"Engine max_len={max_len} must be in [2, model.max_position_embeddings="
          f"{cfg.max_position_embeddings}].")
    self.config, self.max_batch, self.max_len = cfg, max_batch, max_len
    self.decode_chunk, self.max_stop_ids = decode_chunk, max_stop_ids
    self.join_window_s = join_window_s
    if prefill_chunk is None:
      prefill_chunk = min(prefill_buckets) if prefill_buckets else min(64, max_len)
    self.prefill_chunk = self._buckets("prefill_chunk", (prefill_chunk,), max_len)[0]
    self.prefill_buckets = (self.prefill_chunk,)
    if prefix_cache_gb < 0:
      raise errors.ConfigError(f"Engine prefix_cache_gb={prefix_cache_gb} must be >= 0.")
    self.prefix_reuse, self.reuse_sampled_kv = prefix_reuse, reuse_sampled_kv
    self.prefill_rows = self._buckets(
        "prefill_rows", prefill_rows or (1, min(4, max_batch)), max_batch)
    self.decode_rows = self._buckets(
        "decode_rows", decode_rows or _geometric(1, max_batch, 4), max_batch, include_max=True)
    self.attn_buckets = self._buckets(
        "attn_buckets", attn_buckets or _geometric(min(128, max_len), max_len, 2), max_len,
        include_max=True)
    self._decode_fn = as_decode_fn(decode_fn)
    self._seed_rng = np.random.default_rng(seed)

    self._graphdef, self._state = nnx.split(model)
    self._model_def, _ = model_params.split_model(model)
    self._cache_dtype = cache_dtype
    self._store_row_bytes = prefix_cache.row_bytes(cfg, max_len, cache_dtype)
    store_rows = int(prefix_cache_gb * (1 << 30) // self._store_row_bytes) if prefix_reuse else 0
    self._store = prefix_cache.PrefixStore(max_batch, store_rows)
    self._num_rows = max_batch + store_rows  # cache rows: live rows, then the prefix store
    self._cache = self._new_cache()
    self._prefill, self._decode = steps.PREFILL, steps.DECODE
    # On one CPU device, each step's window is built in the previous call's window buffer of the
    # same kind (see ``sampling.steps``): one for decode, one per prefill row bucket, each no
    # larger than its window.
    sharding = self._cache.k[0].sharding
    self._keep_windows = (len(sharding.device_set) == 1
                          and next(iter(sharding.device_set)).platform == "cpu")
    self._window_buffers: dict[str, object] = {}
    self._swap_rows = steps.SWAP_ROWS
    self._copy_prefix = steps.COPY_PREFIX

    r = max_batch  # host copy of the per-row decode state
    self._rows = steps.DecodeRows(
        tokens=np.zeros(r, np.int32), positions=np.full(r, -1, np.int32),
        remaining=np.zeros(r, np.int32), temperature=np.ones(r, np.float32),
        top_p=np.ones(r, np.float32), top_k=np.zeros(r, np.int32), seeds=np.zeros(r, np.uint32),
        stop_ids=np.full((r, max_stop_ids), -1, np.int32))
    self._slots = SlotTable(max_batch, reuse=prefix_reuse)
    self._live: dict[int, _Request] = {}  # slot -> request, admission order
    self._queue: collections.deque[_Request] = collections.deque()
    self._cv = threading.Condition()
    self._thread: threading.Thread | None = None
    self._stopping = False
    self._update = None  # a pending update_params, applied once earlier requests drained
    self._update_lock = threading.Lock()
    self._version = 0
    self._stats = collections.Counter()

  # -- configuration helpers --------------------------------------------------------------------
  @staticmethod
  def _buckets(name, values, limit, include_max=False) -> tuple[int, ...]:
    vals = sorted({int(v) for v in values})
    if not vals or vals[0] < 1 or vals[-1] > limit:
      raise errors.ConfigError(f"Engine {name}={tuple(values)} must be integers in [1, {limit}].")
    if include_max and vals[-1] != limit:
      vals.append(limit)
    return tuple(vals)

  # -- lifecycle --------------------------------------------------------------------------------
  def start(self) -> "Engine":
    if self._thread is not None:
      return self
    self._stopping = False
    self._thread = threading.Thread(target=self._loop, name="legorl-sampler", daemon=True)
    self._thread.start()
    return self

  def stop(self):
    """Stops the device thread; queued and in-flight requests fail with SamplingError."""
    with self._cv:
      self._stopping = True
      self._cv.notify_all()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    err = errors.SamplingError("The sampling engine was stopped before this request finished.")
    for req in list(self._queue) + list(self._live.values()):
      self._fail(req, err)
    self._queue.clear()
    if self._update is not None:  # nothing left to drain: swap now
      state, version, done, _ = self._update
      self._apply_update(state, version)
      self._update = None
      done.set()

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()

  @property
  def params_version(self) -> int:
    return self._version

  def stats(self) -> dict:
    """Counters: requests, failed, prefill_tokens (prompt tokens prefilled), reused_tokens
    (prompt tokens served from the prefix cache), decoded_tokens, prefill_calls, decode_calls,
    decode_row_steps (rows x steps the decode calls ran, live or not), row_moves (rows
    compacted towards the front), cancelled (requests whose future was cancelled, dropped at
    the next chunk), prefix_copies (prefixes copied between rows: from the store, another
    row, or into the store), prefix_store_rows, prefix_store_hits, prefix_store_evictions,
    evictions (session rows given to others), params_version, and compilations {prefill,
    decode, swap_rows, copy_prefix}: traces of the shared jitted steps so far, process-wide
    (engines of one model shape share executables)."""
    out = {k: self._stats[k] for k in ("requests", "failed", "prefill_tokens", "reused_tokens",
                                       "decoded_tokens", "prefill_calls", "decode_calls",
                                       "decode_row_steps", "row_moves", "cancelled",
                                       "prefix_copies")}
    out["prefix_store_rows"] = self._store.num_rows
    out["prefix_store_hits"] = self._store.hits
    out["prefix_store_evictions"] = self._store.evictions
    out["evictions"] = self._slots.evictions
    out["compilations"] = dict(steps.COMPILATIONS)
    out["params_version"] = self._version
    return out

  def warmup(self):
    """Compiles every bucket shape now (before ``start``) instead of on first use."""
    if self._thread is not None:
      raise errors.SamplingError("Engine.warmup() must run before Engine.start().")
    chunk_attns = sorted({self._chunk_attn(k)
                          for k in range(-(-self.max_len // self.prefill_chunk))})
    for p in self.prefill_rows:
      for t in self.prefill_buckets:
        for a in chunk_attns:
          self._call_prefill(np.full(p, self._num_rows, np.int32), np.zeros((p, t), np.int32),
                             np.full((p, t), -1, np.int32), a)
    if self.prefix_reuse:
      for a in self.attn_buckets:
        self._cache = self._copy_prefix(self._cache, np.int32(0), np.int32(0), attn_len=a)
    for r in self.decode_rows:
      for a in self.attn_buckets:
        rows = jax.tree.map(lambda x: x[:r], self._rows)
        rows = rows._replace(positions=np.full(r, -1, np.int32))
        self._call_decode(rows, r, a)
    if len(self.decode_rows) > 1:  # row compaction can happen
      self._cache = self._swap_rows(self._cache, np.int32(0), np.int32(0))
    jax.block_until_ready(self._cache)

  # -- requests ---------------------------------------------------------------------------------
  def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
             session_id: Hashable | None = None) -> concurrent.futures.Future:
    """Queues a request; the future resolves to a ``Completion``. Bad requests raise here."""
    params = params or SamplingParams()
    prompt = self._check_request(prompt_ids, params)
    with self._cv:
      if self._thread is None or self._stopping:
        raise errors.SamplingError(
            "The sampling engine is not running; call engine.start() or use `with engine:`.")
      seed = params.seed if params.seed is not None else int(self._seed_rng.integers(2**32))
      req = _Request(prompt=prompt, params=params, session=session_id,
                     future=concurrent.futures.Future(), seed=seed, t_submit=time.perf_counter(),
                     prompt_np=np.asarray(prompt, np.int64), search=self.prefix_reuse)
      self._queue.append(req)
      self._cv.notify_all()
    return req.future

  def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
               session_id: Hashable | None = None, timeout: float | None = None) -> Completion:
    """Blocking, thread-safe: samples one completion of ``prompt_ids``."""
    return self.submit(prompt_ids, params, session_id).result(timeout)

  async def agenerate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                      session_id: Hashable | None = None) -> Completion:
    """``generate`` for asyncio callers (does not block the event loop)."""
    return await asyncio.wrap_future(self.submit(prompt_ids, params, session_id))

  def _check_request(self, prompt_ids, params: SamplingParams) -> list[int]:
    if not isinstance(params, SamplingParams):
      raise errors.ConfigError(f"params must be a SamplingParams, got {type(params).__name__}.")
    # One vectorised pass: this runs on the caller's thread (the proxy's event loop), and agent
    # prompts run to tens of thousands of ids.
    try:
      ids = np.asarray(prompt_ids, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as e:
      raise errors.ConfigError(f"prompt_ids must be a sequence of integer token ids: {e}.") from e
    v = self.config.vocab_size
    if ids.ndim != 1 or ids.size == 0:
      raise errors.ConfigError("prompt_ids must be a non-empty 1-D sequence of token ids; got "
                               f"shape {ids.shape}.")
    if ids.min() < 0 or ids.max() >= v:
      bad = ids[(ids < 0) | (ids >= v)]
      raise errors.ConfigError(f"prompt_ids holds ids outside [0, {v}): {bad[:5].tolist()}.")
    prompt = ids.tolist()
    if len(prompt) + params.max_tokens > self.max_len:
      raise errors.ContextLengthError(
          f"prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} exceeds the engine's "
          f"max_len={self.max_len}; shorten the prompt, lower max_tokens or raise Engine(max_len).")
    if len(params.stop_token_ids) > self.max_stop_ids:
      raise errors.ConfigError(
          f"SamplingParams.stop_token_ids has {len(params.stop_token_ids)} ids; this engine allows "
          f"{self.max_stop_ids} (raise Engine(max_stop_ids=...)).")
    if any(t >= v for t in params.stop_token_ids):
      raise errors.ConfigError(f"SamplingParams.stop_token_ids must be < vocab_size={v}.")
    if params.stop and self._decode_fn is None:
      raise errors.ConfigError(
          "SamplingParams.stop needs text: construct Engine(..., decode_fn=tokenizer).")
    return prompt

  # -- parameters -------------------------------------------------------------------------------
  def update_params(self, new, version: int | None = None, timeout: float | None = None,
                    copy: bool = True) -> int:
    """Swaps in new parameters without recompiling.

    ``new``: a Decoder, its ``nnx.split`` state, or a flat params dict (``models.params``);
    a flat dict may name only some parameters (what an update changed: the trained blocks, or
    merged LoRA kernels): the others keep their current arrays, uncopied.

    Shapes and dtypes must match; arrays are placed in the current parameters' shardings.
    Blocks until the requests submitted before this call finish and the swap is done (later
    requests wait meanwhile); cached prefixes are invalidated. Returns the new version
    (``version`` or old + 1). On timeout the update is withdrawn and SamplingError raised.
    ``copy=False`` lets the engine alias the caller's buffers (only safe when the caller never
    donates or mutates them, e.g. a learner whose train step donates its params must copy).
    """
    with self._update_lock:
      # Inside the lock: a partial dict is completed from the parameters of the last update.
      state = self._as_state(new)
      if jax.tree.structure(state) != jax.tree.structure(self._state):
        raise errors.ConfigError("update_params: the new parameters' tree differs from the model's.")
      for old, x in zip(jax.tree.leaves(self._state), jax.tree.leaves(state)):
        if old.shape != x.shape or old.dtype != x.dtype:
          raise errors.ConfigError(
              f"update_params: a parameter of shape {x.shape} {x.dtype} replaces one of shape "
              f"{old.shape} {old.dtype}; the engine only accepts identical shapes and dtypes.")
      alias = None if not copy else False
      state = jax.tree.map(lambda o, x: x if x is o else jax.device_put(x, o.sharding, may_alias=alias),
                           self._state, state)
      version = self._version + 1 if version is None else int(version)
      if version <= self._version:
        raise errors.ConfigError(f"update_params: version {version} <= current {self._version}.")
      done = threading.Event()
      with self._cv:
        if self._thread is None:
          self._apply_update(state, version)
          return version
        # [state, version, done, requests queued before this call still to admit]
        self._update = [state, version, done, len(self._queue)]
        self._cv.notify_all()
      if not done.wait(timeout):
        with self._cv:
          if not done.is_set():
            self._update = None
            raise errors.SamplingError(
                f"update_params timed out after {timeout}s waiting for earlier requests; the "
                "parameters were not changed.")
    return version

  def _as_state(self, new):
    if isinstance(new, nnx.Module):
      return nnx.split(new)[1]
    if isinstance(new, nnx.State):
      return new
    if isinstance(new, dict):  # flat {"layers.0.attn.q_kernel": array} (models.params)
      current = model_params.flatten_state(self._state)
      extra = sorted(set(new) - set(current))
      if extra or not new:
        raise errors.ConfigError(
            f"update_params: flat params name keys the model does not have: {extra[:5]} (or "
            "none at all); pass the model's own names (models.params.split_model).")
      full = {k: new[k] if k in new else v.get_value() for k, v in current.items()}
      _, state = nnx.split(self._model_def.merge(full))
      return state
    raise errors.ConfigError("update_params takes a Decoder, an nnx.State or a flat params dict, "
                             f"not {type(new).__name__}.")

  def _apply_update(self, state, version):
    # Every cached prefix (rows and store) holds K/V of the old parameters: forget them all.
    self._state, self._version = state, version
    self._slots.invalidate()
    self._store.invalidate()

  # -- device thread ----------------------------------------------------------------------------
  def _loop(self):
    while True:
      with self._cv:
        while not (self._stopping or self._queue or self._live or self._update):
          self._cv.wait()
        if self._stopping:
          return
      try:
        self._step()
      except Exception as e:  # noqa: BLE001 -- a failed step must not kill the server
        self._step_failure(e)

  def _step(self):
    """One scheduling round: admit, maybe swap parameters, prefill, one decode chunk."""
    # Prefill everything admitted before decoding, and admit what arrives within join_window_s
    # of the last admission (submitted by then): rows then join the decode batch together
    # instead of a decode chunk apart each, and the batch runs at full width for longer. A
    # later arrival waits for the next round, so live rows are not held back by a stream of
    # arrivals; each extra round needs an admission, so this ends within max_batch + 1 rounds.
    last_admit = None
    for round_ in range(self.max_batch + 1):
      if self._admit_queued():
        last_admit = time.perf_counter()
      elif round_ > 0:
        break
      for _ in range(self.max_batch):
        if not any(r.next_prefill < r.prefill_end for r in self._live.values()):
          break
        self._run_prefill()
      if (last_admit is None or not self.join_window_s
          or not self._wait_for_arrival(last_admit + self.join_window_s)):
        break
    if any(r.next_prefill >= r.prefill_end for r in self._live.values()):
      self._compact()
      self._run_decode()

  def _wait_for_arrival(self, deadline: float) -> bool:
    """True if a request submitted by ``deadline`` is queued while a row is free (waiting until
    ``deadline`` for one)."""
    with self._cv:
      while not (self._queue or self._stopping or self._update is not None):
        left = deadline - time.perf_counter()
        if left <= 0 or self._slots.num_free() == 0:
          break
        self._cv.wait(left)
      return (bool(self._queue) and self._queue[0].t_submit <= deadline
              and self._slots.num_free() > 0 and not self._stopping
              and self._update is None)  # an update admits only earlier requests first

  def _admit_queued(self) -> bool:
    """Moves queued requests into free rows (applying a due parameter update); True if any."""
    admitted = False
    with self._cv:
      while self._queue and self._slots.num_free() > 0:
        if self._update is not None:  # only requests queued before update_params go first
          if self._update[3] == 0:
            break
          self._update[3] -= 1
        req = self._queue.popleft()
        if req.future.cancelled():
          self._stats["cancelled"] += 1
          continue
        held = [s.cached for s in self._slots.slots]
        req.slot, req.reuse = self._slots.acquire(req.prompt, req.session)
        self._keep_evicted(req.slot, held[req.slot], req.reuse)
        self._admit(req)
        admitted = True
      if self._update is not None and self._update[3] == 0 and not self._live:
        state, version, done, _ = self._update
        self._apply_update(state, version)
        self._update = None
        done.set()
    return admitted

  def _keep_evicted(self, row: int, tokens, kept: int):
    """Saves the prefix row ``row`` held into the prefix store before a new request (keeping
    its first ``kept`` positions) overwrites it."""
    if self._store.num_rows and len(tokens) > kept:
      rows = prefix_cache.row_prefixes(self._slots.slots, self._live, exclude=row)
      dst = self._store.place_evicted(np.asarray(tokens, np.int64), rows)
      if dst is not None:
        self._copy_rows(row, dst, len(tokens))

  def _copy_rows(self, src: int, dst: int, length: int):
    """K/V positions ``[0, length)`` of row ``src`` -> row ``dst`` (one device call)."""
    attn = _bucket(self.attn_buckets, length)
    self._cache = self._copy_prefix(self._cache, np.int32(src), np.int32(dst), attn_len=attn)
    self._stats["prefix_copies"] += 1

  def _catch_up(self, req: _Request):
    """Starts ``req`` from the longest prefix of its prompt another row or the store holds
    (when longer than what it has): one copy, no prefill."""
    req.search = False
    held = (prefix_cache.row_prefixes(self._slots.slots, self._live, exclude=req.slot)
            + self._store.candidates())
    row, m = prefix_cache.best_source(req.prompt_np, req.prefill_end, held)
    if m <= req.next_prefill:
      return
    self._copy_rows(row, req.slot, m)
    if row >= self.max_batch:
      self._store.touch(row)
    self._stats["reused_tokens"] += m - req.next_prefill
    req.reuse += m - req.next_prefill
    req.next_prefill = m
    if req.next_prefill >= req.prefill_end:
      self._ready(req)

  def _admit(self, req: _Request):
    req.t_admit = time.perf_counter()
    req.version = self._version
    req.next_prefill = req.reuse
    self._stats["reused_tokens"] += req.reuse
    self._live[req.slot] = req
    if req.next_prefill >= req.prefill_end:
      self._ready(req)

  def _ready(self, req: _Request):
    """Prompt prefilled: the row's next decode step feeds the last prompt token."""
    s, p = req.slot, req.params
    req.t_ready = time.perf_counter()
    r = self._rows
    r.tokens[s], r.positions[s] = req.prompt[-1], len(req.prompt) - 1
    r.remaining[s], r.temperature[s] = p.max_tokens, p.temperature
    r.top_p[s], r.top_k[s], r.seeds[s] = p.top_p, p.top_k, req.seed
    r.stop_ids[s] = -1
    r.stop_ids[s, :len(p.stop_token_ids)] = p.stop_token_ids

  def _run_prefill(self):
    """One prefill call: the next chunk of up to ``prefill_rows`` requests.

    Chunks are aligned to absolute positions: position ``p`` goes to column ``p % C`` of the
    call for chunk ``p // C``, whose attention window depends on the chunk index only, so a
    position's K/V never depend on how the prompt was split or what was batched alongside.
    Requests whose next positions another request's chunk computes in this call (the same
    token ids) wait and copy them afterwards (``prefix_cache.split_leaders``)."""
    c = self.prefill_chunk
    for req in [r for r in self._live.values() if r.search and r.next_prefill < r.prefill_end]:
      self._catch_up(req)
    pending = [r for r in self._live.values() if r.next_prefill < r.prefill_end]
    if not pending:
      return
    leaders, followers = (prefix_cache.split_leaders(pending, c) if self.prefix_reuse
                          else (pending, []))
    attn = self._chunk_attn(leaders[0].next_prefill // c)
    group = [r for r in leaders if self._chunk_attn(r.next_prefill // c) == attn]
    group = group[:self.prefill_rows[-1]]
    p = _bucket(self.prefill_rows, len(group))
    slots = np.full(p, self._num_rows, np.int32)
    ids = np.zeros((p, c), np.int32)
    pos = np.full((p, c), -1, np.int32)
    for i, req in enumerate(group):
      a = req.next_prefill
      start = a - a % c
      b = min(start + c, req.prefill_end)
      slots[i] = req.slot
      ids[i, a - start:b - start] = req.prompt_np[a:b]
      pos[i, a - start:b - start] = np.arange(a, b)
    try:
      self._call_prefill(slots, ids, pos, attn)
    except Exception as e:  # noqa: BLE001
      if self._cache_lost():
        raise
      for req in group:
        self._fail(req, errors.SamplingError(f"prefill failed: {e!r}"))
      return
    self._stats["prefill_calls"] += 1
    for i, req in enumerate(group):
      n = int((pos[i] >= 0).sum())
      req.next_prefill += n
      self._stats["prefill_tokens"] += n
      if req.next_prefill >= req.prefill_end:
        self._ready(req)
    for req in followers:  # copy what the leaders just computed
      self._catch_up(req)

  def _chunk_attn(self, k: int) -> int:
    """Attention window of prefill chunk ``k``: a function of ``k`` alone (see _run_prefill)."""
    return _bucket(self.attn_buckets, min((k + 1) * self.prefill_chunk, self.max_len))

  def _window_buffer(self, kind: str, shapes):
    """The kept window buffer of ``kind`` if it has these shapes, else a new one; None when
    buffers are not kept. The buffer is taken out: a failed call may have consumed it."""
    if not self._keep_windows:
      return None
    buf = self._window_buffers.pop(kind, None)
    if buf is None or jax.tree.map(lambda b: b.shape, buf) != jax.tree.map(lambda x: x.shape,
                                                                          shapes):
      buf = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
      # A kept buffer is a step's output, committed to its device when the cache or parameters
      # are; a new one must match, or the step would trace again for the other kind of input.
      if any(x.committed for x in (self._cache.k[0], *jax.tree.leaves(self._state))):
        buf = jax.device_put(buf, self._cache.k[0].sharding)
    return buf

  def _call_prefill(self, slots, ids, pos, attn: int):
    # One buffer per prefill row bucket: a burst of arrivals alternates 1-row and 4-row groups.
    kind = f"prefill/{len(slots)}"
    buf = self._window_buffer(kind, steps.window_shapes(self._cache, len(slots), attn))
    out = self._prefill(self._graphdef, self._state, self._cache, slots, ids, pos, attn_len=attn,
                        window_buffer=buf)
    if buf is None:
      self._cache = out
    else:
      self._cache, self._window_buffers[kind] = out

  def _call_decode(self, rows, num_rows: int, attn: int):
    """Runs one decode chunk on rows ``[0, num_rows)``; returns (rows, out_ids, out_logp)."""
    buf = None
    if num_rows < self._num_rows or attn < self.max_len:  # else the window is the whole cache
      buf = self._window_buffer("decode", steps.decode_window_shapes(self._cache, num_rows, attn))
    out = self._decode(self._graphdef, self._state, self._cache, rows, num_rows=num_rows,
                       attn_len=attn, num_steps=self.decode_chunk, window_buffer=buf)
    self._cache = out[0]
    if buf is not None:
      self._window_buffers["decode"] = out[4]
    return out[1:4]

  def _compact(self):
    """Moves live rows down into idle ones when that shrinks the decode bucket.

    Decode runs on rows ``[0, b)``: a few long requests left in high rows (the tail of a batch)
    would otherwise keep decoding at full width. The idle row's cached prefix (a session's) is
    swapped up, not dropped. A swap copies two rows, so it is done only when the bucket shrinks.
    """
    live = sorted(self._live)
    want = _bucket(self.decode_rows, len(live))
    if _bucket(self.decode_rows, live[-1] + 1) <= want:
      return
    holes = [i for i in range(want) if i not in self._live]
    movers = [j for j in reversed(live) if j >= want]
    for dst, src in zip(holes, movers):
      self._cache = self._swap_rows(self._cache, np.int32(src), np.int32(dst))
      for x in self._rows:
        x[[src, dst]] = x[[dst, src]]
      self._slots.swap(src, dst)
      req = self._live.pop(src)
      req.slot = dst
      self._live[dst] = req
      self._stats["row_moves"] += 1

  def _run_decode(self):
    ready = [r for r in self._live.values() if r.next_prefill >= r.prefill_end]
    k = self.decode_chunk
    num_rows = _bucket(self.decode_rows, max(r.slot for r in ready) + 1)
    attn = _bucket(self.attn_buckets, max(int(self._rows.positions[r.slot]) for r in ready) + k)
    rows = jax.tree.map(lambda x: x[:num_rows], self._rows)
    new_rows, out_ids, out_logp = self._call_decode(rows, num_rows, attn)
    new_rows, out_ids, out_logp = jax.device_get((new_rows, out_ids, out_logp))
    self._stats["decode_calls"] += 1
    self._stats["decode_row_steps"] += num_rows * k
    for name in ("tokens", "positions", "remaining"):
      getattr(self._rows, name)[:num_rows] = getattr(new_rows, name)
    for req in ready:
      s = req.slot
      got = out_ids[:, s] >= 0
      req.ids.extend(out_ids[got, s].tolist())
      req.logps.extend(out_logp[got, s].tolist())
      self._stats["decoded_tokens"] += int(got.sum())
      try:
        self._after_chunk(req)
      except Exception as e:  # noqa: BLE001 -- e.g. a failing decode_fn fails this request only
        self._fail(req, errors.SamplingError(f"request failed after sampling: {e!r}"))

  def _after_chunk(self, req: _Request):
    s, p = req.slot, req.params
    finished = self._rows.positions[s] < 0
    reason, stop = None, None
    if req.future.cancelled():  # the caller gave up (e.g. its HTTP client went away): free the row
      self._finish(req, "cancelled", None)
      return
    if finished:
      last = req.ids[-1]
      reason, stop = ("stop", last) if last in p.stop_token_ids else ("length", None)
    if p.stop:
      hit = find_stop(self._decode_fn, req.ids, p.stop, req.stop_checked)
      if hit is not None:
        n, stop = hit
        del req.ids[n:], req.logps[n:]
        finished, reason = True, "stop"
      else:
        req.stop_checked = len(req.ids)
    if finished:
      self._finish(req, reason, stop)

  def _finish(self, req: _Request, reason: str, stop):
    s = req.slot
    self._rows.positions[s] = -1
    del self._live[s]
    # Exactly reusable: the prefilled prompt; sampled tokens' K/V came from decode steps.
    seq = req.prompt + req.ids
    self._slots.release(s, seq[:-1] if self.reuse_sampled_kv else req.prompt[:req.prefill_end],
                        req.session)
    now = time.perf_counter()
    if req.future.cancelled():
      self._stats["cancelled"] += 1
      return
    self._stats["requests"] += 1
    req.future.set_result(Completion(
        token_ids=req.ids, logprobs=req.logps, finish_reason=reason, prompt_len=len(req.prompt),
        reused_prefix_len=req.reuse, params_version=req.version, stop=stop,
        timings=dict(queued=req.t_admit - req.t_submit, prefill=req.t_ready - req.t_admit,
                     decode=now - req.t_ready, total=now - req.t_submit)))

  def _fail(self, req: _Request, exc: Exception):
    if req.slot >= 0 and self._live.get(req.slot) is req:
      self._rows.positions[req.slot] = -1
      del self._live[req.slot]
      self._slots.release(req.slot, [])
    self._stats["failed"] += 1
    if not req.future.done():
      req.future.set_exception(exc)

  def _new_cache(self) -> Cache:
    """Zero cache; on the parameters' mesh (if any) with K/V heads split like the weights."""
    make = functools.partial(Cache.zeros, self.config, self._num_rows, self.max_len,
                             self._cache_dtype)
    sharding = jax.tree.leaves(self._state)[0].sharding
    if not isinstance(sharding, NamedSharding):
      return make()
    c = self.config

    def spec(logical, shape):
      return NamedSharding(sharding.mesh,
                           sharding_rules.logical_to_spec(logical, shape, sharding.mesh))

    b, h, s, d = self._num_rows, c.num_kv_heads, self.max_len, c.head_dim
    k = spec((None, "kv_heads", "head_dim", None), (b, h, d, s))
    v = spec((None, "kv_heads", None, "head_dim"), (b, h, s, d))
    n = c.num_layers
    return jax.jit(make, out_shardings=Cache(k=(k,) * n, v=(v,) * n))()

  def _cache_lost(self) -> bool:
    return any(x.is_deleted() for x in self._cache.k + self._cache.v)

  def _step_failure(self, e: Exception):
    """A step failed outside any single request: fail the live ones, rebuild a lost cache."""
    err = errors.SamplingError(f"sampling engine step failed: {e!r}")
    self._window_buffers.clear()
    for req in list(self._live.values()):
      self._fail(req, err)
    if self._cache_lost():
      self._cache = self._new_cache()
    self._slots.invalidate()
    self._store.invalidate()
