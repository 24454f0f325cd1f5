"""The sampling engine's scheduler: admission, chunked prefill, decode chunks, completion.

Runs on the engine's device thread only (``step``), except ``enqueue`` and the update hand-off,
which callers' threads reach under ``cv``. One round admits queued requests into free cache
rows, starts each from the longest cached prefix of its prompt (any row's or the prefix
store's, see ``sampling.prefix_cache``), prefills the rest in chunks aligned to positions (one
request computes each chunk that several share, the others copy it), then runs one decode
chunk over all live rows and resolves the requests that finished.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Hashable

import jax
import numpy as np

from legorl_jax import errors
from legorl_jax.sampling import prefix_cache, shared_prefix, steps
from legorl_jax.sampling.buckets import bucket
from legorl_jax.sampling.device import Device
from legorl_jax.sampling.params import Completion, SamplingParams
from legorl_jax.sampling.slots import SlotTable
from legorl_jax.sampling.stop import find_stop


@dataclasses.dataclass(frozen=True)
class Layout:
  """The engine's checked sizes and switches (see ``Engine`` for each)."""

  max_batch: int
  max_len: int
  prefill_chunk: int
  prefill_rows: tuple[int, ...]
  decode_rows: tuple[int, ...]
  attn_buckets: tuple[int, ...]
  decode_chunk: int
  max_stop_ids: int
  join_window_s: float
  prefix_reuse: bool
  reuse_sampled_kv: bool
  share_prefix: bool = False

  def chunk_attn(self, k: int) -> int:
    """Attention window of prefill chunk ``k``: a function of ``k`` alone (see run_prefill)."""
    return bucket(self.attn_buckets, min((k + 1) * self.prefill_chunk, self.max_len))


@dataclasses.dataclass(eq=False)
class Request:
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
  sampled: int = 0  # tokens sampled, before a stop string cut any (each but the last was fed)
  stop_checked: int = 0
  version: int = 0
  t_admit: float = 0.0
  t_ready: float = 0.0

  @property
  def prefill_end(self) -> int:
    return len(self.prompt) - 1


@dataclasses.dataclass
class PendingUpdate:
  """An ``update_params`` waiting for the requests queued before it (``ahead``) to drain."""

  state: object
  version: int
  done: threading.Event
  ahead: int


class Scheduler:
  """Queue, live rows and their host-side decode state, over one ``Device``."""

  def __init__(self, layout: Layout, device: Device, store: prefix_cache.PrefixStore, decode_fn):
    self.layout, self.device, self.store = layout, device, store
    self._decode_fn = decode_fn
    r = layout.max_batch  # host copy of the per-row decode state
    self.rows = steps.DecodeRows(
        tokens=np.zeros(r, np.int32), positions=np.full(r, -1, np.int32),
        remaining=np.zeros(r, np.int32), temperature=np.ones(r, np.float32),
        top_p=np.ones(r, np.float32), top_k=np.zeros(r, np.int32), seeds=np.zeros(r, np.uint32),
        stop_ids=np.full((r, layout.max_stop_ids), -1, np.int32))
    self.slots = SlotTable(layout.max_batch, reuse=layout.prefix_reuse)
    self.live: dict[int, Request] = {}  # slot -> request, admission order
    self.queue: collections.deque[Request] = collections.deque()
    self.cv = threading.Condition()
    self.stopping = False
    self.update: PendingUpdate | None = None
    self.stats = collections.Counter()

  # -- hand-offs from callers' threads (under cv) -----------------------------------------------
  def enqueue(self, req: Request):
    self.queue.append(req)
    self.cv.notify_all()

  def wait_for_work(self) -> bool:
    """Blocks until there is something to do; False once the engine is stopping."""
    with self.cv:
      while not (self.stopping or self.queue or self.live or self.update):
        self.cv.wait()
      return not self.stopping

  def apply_update(self, state, version: int):
    # Every cached prefix (rows and store) holds K/V of the old parameters: forget them all.
    self.device.state, self.device.version = state, version
    self.slots.invalidate()
    self.store.invalidate()

  def apply_pending_update(self):
    u, self.update = self.update, None
    self.apply_update(u.state, u.version)
    u.done.set()

  def fail_all(self, err: Exception):
    """Fails every queued and live request (the engine stopped)."""
    for req in list(self.queue) + list(self.live.values()):
      self.fail(req, err)
    self.queue.clear()

  def recover(self, e: Exception):
    """A step failed outside any single request: fail the live ones, rebuild a lost cache."""
    err = errors.SamplingError(f"sampling engine step failed: {e!r}")
    for req in list(self.live.values()):
      self.fail(req, err)
    self.device.reset()
    self.slots.invalidate()
    self.store.invalidate()

  # -- one round --------------------------------------------------------------------------------
  def step(self):
    """One scheduling round: admit, maybe swap parameters, prefill, one decode chunk."""
    # Prefill everything admitted before decoding, and admit what arrives within join_window_s
    # of the last admission (submitted by then): rows then join the decode batch together
    # instead of a decode chunk apart each, and the batch runs at full width for longer. A
    # later arrival waits for the next round, so live rows are not held back by a stream of
    # arrivals; each extra round needs an admission, so this ends within max_batch + 1 rounds.
    lay = self.layout
    last_admit = None
    for round_ in range(lay.max_batch + 1):
      if self._admit_queued():
        last_admit = time.perf_counter()
      elif round_ > 0:
        break
      for _ in range(lay.max_batch):
        if not any(r.next_prefill < r.prefill_end for r in self.live.values()):
          break
        t0 = time.perf_counter()
        self._run_prefill()
        self.stats["prefill_s"] += time.perf_counter() - t0
      if (last_admit is None or not lay.join_window_s
          or not self._wait_for_arrival(last_admit + lay.join_window_s)):
        break
    if any(r.next_prefill >= r.prefill_end for r in self.live.values()):
      t0 = time.perf_counter()
      self._compact()
      self._run_decode()
      self.stats["decode_s"] += time.perf_counter() - t0

  def _wait_for_arrival(self, deadline: float) -> bool:
    """True if a request submitted by ``deadline`` is queued while a row is free (waiting until
    ``deadline`` for one)."""
    with self.cv:
      while not (self.queue or self.stopping or self.update is not None):
        left = deadline - time.perf_counter()
        if left <= 0 or self.slots.num_free() == 0:
          break
        self.cv.wait(left)
      return (bool(self.queue) and self.queue[0].t_submit <= deadline
              and self.slots.num_free() > 0 and not self.stopping
              and self.update is None)  # an update admits only earlier requests first

  def _admit_queued(self) -> bool:
    """Moves queued requests into free rows (applying a due parameter update); True if any."""
    admitted = False
    with self.cv:
      while self.queue and self.slots.num_free() > 0:
        if self.update is not None:  # only requests queued before update_params go first
          if self.update.ahead == 0:
            break
          self.update.ahead -= 1
        req = self.queue.popleft()
        if req.future.cancelled():
          self.stats["cancelled"] += 1
          continue
        held = [s.cached for s in self.slots.slots]
        req.slot, req.reuse = self.slots.acquire(req.prompt, req.session)
        self._keep_evicted(req.slot, held[req.slot], req.reuse)
        self._admit(req)
        admitted = True
      if self.update is not None and self.update.ahead == 0 and not self.live:
        self.apply_pending_update()
    return admitted

  def _admit(self, req: Request):
    req.t_admit = time.perf_counter()
    req.version = self.device.version
    req.next_prefill = req.reuse
    self.stats["reused_tokens"] += req.reuse
    self.live[req.slot] = req
    if req.next_prefill >= req.prefill_end:
      self._ready(req)

  def _ready(self, req: Request):
    """Prompt prefilled: the row's next decode step feeds the last prompt token."""
    s, p = req.slot, req.params
    req.t_ready = time.perf_counter()
    r = self.rows
    r.tokens[s], r.positions[s] = req.prompt[-1], len(req.prompt) - 1
    r.remaining[s], r.temperature[s] = p.max_tokens, p.temperature
    r.top_p[s], r.top_k[s], r.seeds[s] = p.top_p, p.top_k, req.seed
    r.stop_ids[s] = -1
    r.stop_ids[s, :len(p.stop_token_ids)] = p.stop_token_ids

  # -- prefix reuse -----------------------------------------------------------------------------
  def _keep_evicted(self, row: int, tokens, kept: int):
    """Saves the prefix row ``row`` held into the prefix store before a new request (keeping
    its first ``kept`` positions) overwrites it."""
    if self.store.num_rows and len(tokens) > kept:
      rows = prefix_cache.row_prefixes(self.slots.slots, self.live, exclude=row)
      dst = self.store.place_evicted(np.asarray(tokens, np.int64), rows)
      if dst is not None:
        self._copy_rows(row, dst, len(tokens))

  def _copy_rows(self, src: int, dst: int, length: int):
    """K/V positions ``[0, length)`` of row ``src`` -> row ``dst`` (one device call)."""
    self.device.copy_prefix(src, dst, bucket(self.layout.attn_buckets, length))
    self.stats["prefix_copies"] += 1

  def _catch_up(self, req: Request):
    """Starts ``req`` from the longest prefix of its prompt another row or the store holds
    (when longer than what it has): one copy, no prefill."""
    req.search = False
    held = (prefix_cache.row_prefixes(self.slots.slots, self.live, exclude=req.slot)
            + self.store.candidates())
    row, m = prefix_cache.best_source(req.prompt_np, req.prefill_end, held)
    if m <= req.next_prefill:
      return
    self._copy_rows(row, req.slot, m)
    if row >= self.layout.max_batch:
      self.store.touch(row)
    self.stats["reused_tokens"] += m - req.next_prefill
    req.reuse += m - req.next_prefill
    req.next_prefill = m
    if req.next_prefill >= req.prefill_end:
      self._ready(req)

  # -- chunked prefill --------------------------------------------------------------------------
  def _run_prefill(self):
    """One prefill call: the next chunk of up to ``prefill_rows`` requests.

    Chunks are aligned to absolute positions: position ``p`` goes to column ``p % C`` of the
    call for chunk ``p // C``, whose attention window depends on the chunk index only, so a
    position's K/V never depend on how the prompt was split or what was batched alongside.
    Requests whose next positions another request's chunk computes in this call (the same
    token ids) wait and copy them afterwards (``prefix_cache.split_leaders``)."""
    lay = self.layout
    c = lay.prefill_chunk
    for req in [r for r in self.live.values() if r.search and r.next_prefill < r.prefill_end]:
      self._catch_up(req)
    pending = [r for r in self.live.values() if r.next_prefill < r.prefill_end]
    if not pending:
      return
    leaders, followers = (prefix_cache.split_leaders(pending, c) if lay.prefix_reuse
                          else (pending, []))
    attn = lay.chunk_attn(leaders[0].next_prefill // c)
    group = [r for r in leaders if lay.chunk_attn(r.next_prefill // c) == attn]
    group = group[:lay.prefill_rows[-1]]
    p = bucket(lay.prefill_rows, len(group))
    slots = np.full(p, self.device.num_rows, np.int32)
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
      self.device.prefill(slots, ids, pos, attn)
    except Exception as e:  # noqa: BLE001
      if self.device.lost():
        raise
      for req in group:
        self.fail(req, errors.SamplingError(f"prefill failed: {e!r}"))
      return
    self.stats["prefill_calls"] += 1
    for i, req in enumerate(group):
      n = int((pos[i] >= 0).sum())
      req.next_prefill += n
      self.stats["prefill_tokens"] += n
      if req.next_prefill >= req.prefill_end:
        self._ready(req)
    for req in followers:  # copy what the leaders just computed
      self._catch_up(req)

  # -- decode -----------------------------------------------------------------------------------
  def _compact(self):
    """Moves live rows down into idle ones when that shrinks the decode bucket.

    Decode runs on rows ``[0, b)``: a few long requests left in high rows (the tail of a batch)
    would otherwise keep decoding at full width. The idle row's cached prefix (a session's) is
    swapped up, not dropped. A swap copies two rows, so it is done only when the bucket shrinks.
    """
    live = sorted(self.live)
    want = bucket(self.layout.decode_rows, len(live))
    if bucket(self.layout.decode_rows, live[-1] + 1) <= want:
      return
    holes = [i for i in range(want) if i not in self.live]
    movers = [j for j in reversed(live) if j >= want]
    for dst, src in zip(holes, movers):
      self.device.swap_rows(src, dst)
      for x in self.rows:
        x[[src, dst]] = x[[dst, src]]
      self.slots.swap(src, dst)
      req = self.live.pop(src)
      req.slot = dst
      self.live[dst] = req
      self.stats["row_moves"] += 1

  def _run_decode(self):
    lay = self.layout
    ready = [r for r in self.live.values() if r.next_prefill >= r.prefill_end]
    k = lay.decode_chunk
    num_rows = bucket(lay.decode_rows, max(r.slot for r in ready) + 1)
    attn = bucket(lay.attn_buckets, max(int(self.rows.positions[r.slot]) for r in ready) + k)
    rows = jax.tree.map(lambda x: x[:num_rows], self.rows)
    shared = None
    if lay.share_prefix:
      # Splits below the window only; a row's K/V below its prefill end came from prefill or a
      # prefix copy of the same ids (chunks aligned to positions), so equal ids, equal K/V.
      shared = shared_prefix.plan([(r.slot, r.prompt_np, r.prefill_end) for r in ready],
                                  num_rows, [b for b in lay.attn_buckets if b < attn])
      if shared is not None:
        self.stats["shared_prefix_calls"] += 1
        self.stats["shared_prefix_saved_slots"] += shared.saved_slots
    new_rows, out_ids, out_logp = self.device.decode(rows, num_rows, attn, k, shared=shared)
    new_rows, out_ids, out_logp = jax.device_get((new_rows, out_ids, out_logp))
    self.stats["decode_calls"] += 1
    self.stats["decode_row_steps"] += num_rows * k
    self.stats["live_row_steps"] += len(ready) * k
    for name in ("tokens", "positions", "remaining"):
      getattr(self.rows, name)[:num_rows] = getattr(new_rows, name)
    for req in ready:
      s = req.slot
      got = out_ids[:, s] >= 0
      req.ids.extend(out_ids[got, s].tolist())
      req.logps.extend(out_logp[got, s].tolist())
      req.sampled += int(got.sum())
      self.stats["decoded_tokens"] += int(got.sum())
      try:
        self._after_chunk(req)
      except Exception as e:  # noqa: BLE001 -- e.g. a failing decode_fn fails this request only
        self.fail(req, errors.SamplingError(f"request failed after sampling: {e!r}"))

  def _after_chunk(self, req: Request):
    s, p = req.slot, req.params
    finished = self.rows.positions[s] < 0
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

  # -- ends -------------------------------------------------------------------------------------
  def _finish(self, req: Request, reason: str, stop):
    s = req.slot
    self.rows.positions[s] = -1
    del self.live[s]
    # Exactly reusable: the prefilled prompt; sampled tokens' K/V came from decode steps.
    seq = req.prompt + req.ids
    self.slots.release(s, seq[:-1] if self.layout.reuse_sampled_kv else req.prompt[:req.prefill_end],
                       req.session)
    now = time.perf_counter()
    if req.future.cancelled():
      self.stats["cancelled"] += 1
      return
    routes = self._routes(req) if self.device.record_routes else None
    self.stats["requests"] += 1
    req.future.set_result(Completion(
        token_ids=req.ids, logprobs=req.logps, finish_reason=reason, prompt_len=len(req.prompt),
        reused_prefix_len=req.reuse, params_version=req.version, stop=stop,
        timings=dict(queued=req.t_admit - req.t_submit, prefill=req.t_ready - req.t_admit,
                     decode=now - req.t_ready, total=now - req.t_submit), routes=routes))

  def _routes(self, req: Request) -> np.ndarray:
    """``Completion.routes`` of a finished request, read from its row's route cache before the
    row serves anyone else: positions ``[0, prompt_len + sampled - 1)`` were fed (prefilled,
    copied from a cached prefix or fed by a decode step); the rest is -1."""
    total = len(req.prompt) + len(req.ids)
    fed = min(total, len(req.prompt) + req.sampled - 1)
    have = self.device.routes(req.slot, fed)
    out = np.full((total,) + have.shape[1:], -1, have.dtype)
    out[:fed] = have
    return out

  def fail(self, req: Request, exc: Exception):
    if req.slot >= 0 and self.live.get(req.slot) is req:
      self.rows.positions[req.slot] = -1
      del self.live[req.slot]
      self.slots.release(req.slot, [])
    self.stats["failed"] += 1
    if not req.future.done():
      req.future.set_exception(exc)
