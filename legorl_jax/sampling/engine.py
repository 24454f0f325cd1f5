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

The engine is the API and the device thread; the work is split by job: ``scheduler``
(admission, chunked prefill with shared-prefix leaders, decode chunks, completion),
``device`` (parameters, KV cache and the jitted step calls), ``prefix_cache`` (which cached
prefix a prompt starts from, and the prefix store), ``buckets`` (the fixed shapes).

What a completion holds: the sampled ids and, per id, the logprob it was drawn with (see
``sampling.sample`` for the convention); a stop string cuts the completion after the token
that completes it, ids and logprobs alike. An engine serving a mixture-of-experts policy also
returns every token's routed experts (``Completion.routes``, kept in a route cache beside K/V:
``sampling.cache``), which the proxy records for rollout routing replay.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Hashable, Sequence

import jax
import numpy as np
from flax import nnx

from legorl_jax import errors
from legorl_jax.models import params as model_params
from legorl_jax.models.decoder import Decoder
from legorl_jax.sampling import prefix_cache, steps
from legorl_jax.sampling.buckets import checked, fill, geometric
from legorl_jax.sampling.device import Device
from legorl_jax.sampling.params import Completion, SamplingParams
from legorl_jax.sampling.scheduler import Layout, PendingUpdate, Request, Scheduler
from legorl_jax.sampling.stop import as_decode_fn


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
    attn_buckets: attention window lengths (default: ``buckets.fill(attn_step, max_len)``).
    fuse_projections: the sampler computes q|k|v and gate|up as one matmul each, from fused
      copies of those kernels rebuilt at every parameter update (``sampling.fused``; the
      same function, ~0.4 of the parameters' bytes again). Off by default: on XLA:CPU it
      measured 0.96x per decode step (SmolLM2, 32 rows, BENCHMARKS.md); for one device only.
    attn_step: the default windows' spacing: multiples of it up to ``8 * attn_step``, then eight
      per doubling (a call attends over at most ``attn_step`` slots, or 1/8, past its longest
      row). Ignored when ``attn_buckets`` is given.
    share_prefix: shared-prompt decode attention (``sampling.shared_prefix``): rows whose
      prompts agree on their first ``P`` tokens (``P`` a window size, chosen per decode call)
      read that prefix's K/V once per group and step, from one row, instead of once per row.
      Results equal the plain path's to float tolerance.
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
    record_routes: return each token's routed experts with every completion
      (``Completion.routes``). Default (None): on for mixture-of-experts models, whose
      trajectories need them for ``trainer.routing_replay``; dense models have no routes. The
      route cache adds ``L_moe * k`` bytes per cache slot (``sampling.cache``) and one row read
      per finished request.
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
               prefix_cache_gb: float = 0.0, reuse_sampled_kv: bool = False,
               record_routes: bool | None = None, attn_step: int = 128,
               fuse_projections: bool = False, share_prefix: bool = False):
    cfg = model.config
    if record_routes is None:
      record_routes = bool(cfg.moe_layers)
    if record_routes and not cfg.moe_layers:
      raise errors.ConfigError(
          f"Engine(record_routes=True) needs a mixture-of-experts model (qwen3_moe); this "
          f"{cfg.architecture} model is dense and routes nothing.")
    self.record_routes = bool(record_routes)
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
    self.prefill_chunk = checked("prefill_chunk", (prefill_chunk,), max_len)[0]
    self.prefill_buckets = (self.prefill_chunk,)
    if prefix_cache_gb < 0:
      raise errors.ConfigError(f"Engine prefix_cache_gb={prefix_cache_gb} must be >= 0.")
    self.prefix_reuse, self.reuse_sampled_kv = prefix_reuse, reuse_sampled_kv
    self.prefill_rows = checked("prefill_rows", prefill_rows or (1, min(4, max_batch)), max_batch)
    self.decode_rows = checked(
        "decode_rows", decode_rows or geometric(1, max_batch, 4), max_batch, include_max=True)
    self.attn_buckets = checked(
        "attn_buckets", attn_buckets or fill(min(attn_step, max_len), max_len), max_len,
        include_max=True)
    self._decode_fn = as_decode_fn(decode_fn)
    self._seed_rng = np.random.default_rng(seed)

    row_bytes = prefix_cache.row_bytes(cfg, max_len, cache_dtype, routes=self.record_routes)
    store_rows = int(prefix_cache_gb * (1 << 30) // row_bytes) if prefix_reuse else 0
    # cache rows: live rows, then the prefix store
    self._device = Device(model, max_batch + store_rows, max_len, cache_dtype,
                          record_routes=self.record_routes, fuse_projections=fuse_projections)
    layout = Layout(max_batch=max_batch, max_len=max_len, prefill_chunk=self.prefill_chunk,
                    prefill_rows=self.prefill_rows, decode_rows=self.decode_rows,
                    attn_buckets=self.attn_buckets, decode_chunk=decode_chunk,
                    max_stop_ids=max_stop_ids, join_window_s=join_window_s,
                    prefix_reuse=prefix_reuse, reuse_sampled_kv=reuse_sampled_kv,
                    share_prefix=bool(share_prefix))
    self._scheduler = Scheduler(layout, self._device,
                                prefix_cache.PrefixStore(max_batch, store_rows), self._decode_fn)
    self._thread: threading.Thread | None = None
    self._update_lock = threading.Lock()

  # -- lifecycle --------------------------------------------------------------------------------
  def start(self) -> "Engine":
    if self._thread is not None:
      return self
    self._scheduler.stopping = False
    self._thread = threading.Thread(target=self._loop, name="legorl-sampler", daemon=True)
    self._thread.start()
    return self

  def stop(self):
    """Stops the device thread; queued and in-flight requests fail with SamplingError."""
    sched = self._scheduler
    with sched.cv:
      sched.stopping = True
      sched.cv.notify_all()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    sched.fail_all(errors.SamplingError("The sampling engine was stopped before this request "
                                        "finished."))
    if sched.update is not None:  # nothing left to drain: swap now
      sched.apply_pending_update()

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()

  @property
  def params_version(self) -> int:
    return self._device.version

  def stats(self) -> dict:
    """Counters: requests, failed, prefill_tokens (prompt tokens prefilled), reused_tokens
    (prompt tokens served from the prefix cache), decoded_tokens, prefill_calls, decode_calls,
    decode_row_steps (rows x steps the decode calls ran, live or not), live_row_steps (of those,
    rows holding a request), prefill_s and decode_s (device-thread seconds in prefill calls, and
    in decode chunks with their row compaction: with the wall time, how busy the engine was
    and what stalled decoding), row_moves (rows
    compacted towards the front), cancelled (requests whose future was cancelled, dropped at
    the next chunk), prefix_copies (prefixes copied between rows: from the store, another
    row, or into the store), prefix_store_rows, prefix_store_hits, prefix_store_evictions,
    evictions (session rows given to others), shared_prefix_calls (decode calls with
    shared-prompt attention) and shared_prefix_saved_slots (K/V slots per step those calls did
    not read, summed over calls), params_version, and compilations {prefill,
    decode, swap_rows, copy_prefix, row_routes (route-recording engines only)}: traces of the
    shared jitted steps so far, process-wide (engines of one model shape share executables)."""
    sched = self._scheduler
    out = {k: sched.stats[k] for k in ("requests", "failed", "prefill_tokens", "reused_tokens",
                                       "decoded_tokens", "prefill_calls", "decode_calls",
                                       "decode_row_steps", "live_row_steps", "row_moves",
                                       "cancelled", "prefix_copies", "shared_prefix_calls",
                                       "shared_prefix_saved_slots")}
    out["prefill_s"] = float(sched.stats["prefill_s"])
    out["decode_s"] = float(sched.stats["decode_s"])
    out["prefix_store_rows"] = sched.store.num_rows
    out["prefix_store_hits"] = sched.store.hits
    out["prefix_store_evictions"] = sched.store.evictions
    out["evictions"] = sched.slots.evictions
    out["compilations"] = dict(steps.COMPILATIONS)
    out["params_version"] = self._device.version
    return out

  def warmup(self):
    """Compiles every bucket shape now (before ``start``) instead of on first use."""
    if self._thread is not None:
      raise errors.SamplingError("Engine.warmup() must run before Engine.start().")
    dev, layout = self._device, self._scheduler.layout
    chunk_attns = sorted({layout.chunk_attn(k)
                          for k in range(-(-self.max_len // self.prefill_chunk))})
    for p in self.prefill_rows:
      for t in self.prefill_buckets:
        for a in chunk_attns:
          dev.prefill(np.full(p, dev.num_rows, np.int32), np.zeros((p, t), np.int32),
                      np.full((p, t), -1, np.int32), a)
    if self.prefix_reuse:
      for a in self.attn_buckets:
        dev.copy_prefix(0, 0, a)
    for r in self.decode_rows:
      for a in self.attn_buckets:
        rows = jax.tree.map(lambda x: x[:r], self._scheduler.rows)
        rows = rows._replace(positions=np.full(r, -1, np.int32))
        dev.decode(rows, r, a, self.decode_chunk)
    if len(self.decode_rows) > 1:  # row compaction can happen
      dev.swap_rows(0, 0)
    if self.record_routes:
      dev.routes(0, 0)
    dev.block_until_ready()

  # -- requests ---------------------------------------------------------------------------------
  def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
             session_id: Hashable | None = None) -> concurrent.futures.Future:
    """Queues a request; the future resolves to a ``Completion``. Bad requests raise here."""
    params = params or SamplingParams()
    prompt = self._check_request(prompt_ids, params)
    sched = self._scheduler
    with sched.cv:
      if self._thread is None or sched.stopping:
        raise errors.SamplingError(
            "The sampling engine is not running; call engine.start() or use `with engine:`.")
      seed = params.seed if params.seed is not None else int(self._seed_rng.integers(2**32))
      req = Request(prompt=prompt, params=params, session=session_id,
                    future=concurrent.futures.Future(), seed=seed, t_submit=time.perf_counter(),
                    prompt_np=np.asarray(prompt, np.int64), search=self.prefix_reuse)
      sched.enqueue(req)
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
      current = self._device.state
      state = self._as_state(new)
      if jax.tree.structure(state) != jax.tree.structure(current):
        raise errors.ConfigError("update_params: the new parameters' tree differs from the model's.")
      for old, x in zip(jax.tree.leaves(current), jax.tree.leaves(state)):
        if old.shape != x.shape or old.dtype != x.dtype:
          raise errors.ConfigError(
              f"update_params: a parameter of shape {x.shape} {x.dtype} replaces one of shape "
              f"{old.shape} {old.dtype}; the engine only accepts identical shapes and dtypes.")
      alias = None if not copy else False
      state = jax.tree.map(lambda o, x: x if x is o else jax.device_put(x, o.sharding, may_alias=alias),
                           current, state)
      old_version = self._device.version
      version = old_version + 1 if version is None else int(version)
      if version <= old_version:
        raise errors.ConfigError(f"update_params: version {version} <= current {old_version}.")
      done = threading.Event()
      sched = self._scheduler
      with sched.cv:
        if self._thread is None:
          sched.apply_update(state, version)
          return version
        sched.update = PendingUpdate(state, version, done, ahead=len(sched.queue))
        sched.cv.notify_all()
      if not done.wait(timeout):
        with sched.cv:
          if not done.is_set():
            sched.update = None
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
      current = model_params.flatten_state(self._device.state)
      extra = sorted(set(new) - set(current))
      if extra or not new:
        raise errors.ConfigError(
            f"update_params: flat params name keys the model does not have: {extra[:5]} (or "
            "none at all); pass the model's own names (models.params.split_model).")
      full = {k: new[k] if k in new else v.get_value() for k, v in current.items()}
      _, state = nnx.split(self._device.model_def.merge(full))
      return state
    raise errors.ConfigError("update_params takes a Decoder, an nnx.State or a flat params dict, "
                             f"not {type(new).__name__}.")

  # -- device thread ----------------------------------------------------------------------------
  def _loop(self):
    sched = self._scheduler
    while sched.wait_for_work():
      try:
        sched.step()
      except Exception as e:  # noqa: BLE001 -- a failed step must not kill the server
        sched.recover(e)
