"""Per-session recording: calls, generations, streams and segments.

A *generation* is what one call sampled (ids, logprobs) plus the message it was returned as
(content, tool-call ids), so that when the harness sends that assistant message back the
renderer can splice in the exact ids. A *segment* is one token sequence for the learner: a
call whose prompt extends an open segment's sequence (prompt + sampled ids) appends to it,
the new prompt tokens with mask 0 and the sampled ones with mask 1; any other call opens a
new segment with a recorded reason. Segments live in *streams* ("main", "title", sub-agents,
...); only streams in ``train_streams`` are used for training.

Mixture-of-experts policies: when the backend's completions carry routes (``Completion.routes``,
the experts of every prompt and sampled token per sparse layer), a segment keeps them aligned
with its tokens, for rollout routing replay in the learner. A token's routes are the first ones
recorded for it: a sampled token's come from the decode step of its own call (what the next
sampled tokens' logprobs were drawn with); a later call that prefills it again only fills in
routes still missing (-1, e.g. the last sampled token of the previous call, which is never fed
back). Segments of dense policies have no routes and no ``routed_experts`` key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import threading
import time
from typing import Any, Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.proxy import route_codec
from legorl_jax.proxy.render import same_calls
from legorl_jax.proxy.types import Message, Reply, RenderedRequest, ToolCall
from legorl_jax.sampling.params import Completion, SamplingParams

# How many of a stream's latest segments a new call may continue (parallel sub-agents).
_OPEN_SEGMENTS = 16


@dataclasses.dataclass
class Generation:
  call_index: int
  token_ids: list[int]
  content: str
  tool_calls: list[ToolCall]


@dataclasses.dataclass
class Segment:
  """One training sequence. token_ids / loss_mask / logprobs are aligned, length T; so is
  ``routes`` when the policy's routes were recorded: int ``[T, L_moe, k]``, -1 = no route."""

  id: int
  stream: str
  train: bool
  reason: str
  token_ids: list[int] = dataclasses.field(default_factory=list)
  loss_mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  calls: list[int] = dataclasses.field(default_factory=list)
  routes: np.ndarray | None = None

  def extend(self, ids: Sequence[int], sampled: bool, logprobs: Sequence[float] | None = None,
             routes: np.ndarray | None = None):
    """Appends tokens; ``routes``: their routes ``[len(ids), L_moe, k]`` or None (unrecorded)."""
    before = len(self.token_ids)
    self.token_ids.extend(ids)
    self.loss_mask.extend([1 if sampled else 0] * len(ids))
    self.logprobs.extend(logprobs if sampled else [0.0] * len(ids))
    self._append_routes(before, len(ids), routes)

  def _append_routes(self, before: int, n: int, routes: np.ndarray | None):
    if routes is None:
      if self.routes is not None:  # keep alignment: these tokens have no route
        self.routes = np.concatenate(
            [self.routes, np.full((n,) + self.routes.shape[1:], -1, self.routes.dtype)])
      return
    if self.routes is None:  # the first routed call: earlier tokens have no route
      self.routes = np.full((before,) + routes.shape[1:], -1, routes.dtype)
    elif self.routes.shape[1:] != routes.shape[1:]:
      raise errors.ProxyError(
          f"segment {self.id}: a call's routes have shape {routes.shape[1:]} per token, the "
          f"segment's {self.routes.shape[1:]}; one session must be served by one policy.",
          status=500, code="server_error")
    self.routes = np.concatenate([self.routes, routes.astype(self.routes.dtype)])

  def fill_routes(self, routes: np.ndarray):
    """Sets the routes still missing (-1) among the first ``len(routes)`` tokens from
    ``routes`` (a later call's prefill computed them); recorded ones stay."""
    if self.routes is None or routes.shape[1:] != self.routes.shape[1:]:
      return
    head = self.routes[:len(routes)]
    missing = np.any(head < 0, axis=-1, keepdims=True)
    self.routes[:len(routes)] = np.where(missing, routes.astype(head.dtype), head)

  def to_json(self, calls: Sequence["CallRecord"]) -> dict:
    mine = [calls[i] for i in self.calls]
    # Copies: the trajectory must not change if the segment does afterwards.
    return {"id": self.id, "stream": self.stream, "train": self.train, "reason": self.reason,
            "token_ids": list(self.token_ids), "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs),
            "calls": list(self.calls),
            "temperatures": sorted({c.temperature for c in mine}),
            "params_versions": sorted({c.params_version for c in mine}),
            **({} if self.routes is None
               else {"routed_experts": route_codec.encode(self.routes)})}


@dataclasses.dataclass
class CallRecord:
  """Everything one call did. ``sample_offset``: where its sampled ids start in its segment."""

  index: int
  api: str
  stream: str
  segment: int
  sample_offset: int
  new_segment: str | None
  prompt_ids: np.ndarray  # int32 [P]
  token_ids: list[int]
  logprobs: list[float]
  finish_reason: str
  reply_finish_reason: str
  temperature: float
  top_p: float
  top_k: int
  max_tokens: int
  params_version: int
  reused_prefix_len: int
  spliced_messages: int
  timings: dict[str, float]
  wall_time: float

  def to_json(self) -> dict:
    return {"index": self.index, "api": self.api, "stream": self.stream, "segment": self.segment,
            "sample_offset": self.sample_offset, "new_segment": self.new_segment,
            "prompt_ids": self.prompt_ids.tolist(), "token_ids": self.token_ids,
            "logprobs": self.logprobs, "finish_reason": self.finish_reason,
            "reply_finish_reason": self.reply_finish_reason, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "max_tokens": self.max_tokens,
            "params_version": self.params_version, "reused_prefix_len": self.reused_prefix_len,
            "spliced_messages": self.spliced_messages, "timings": self.timings,
            "time": self.wall_time}


@dataclasses.dataclass
class _Stream:
  name: str
  train: bool
  segments: list[Segment] = dataclasses.field(default_factory=list)
  last_system: str | None = None
  last_tools: str | None = None
  last_num_messages: int = 0


def hash_token(token: str) -> bytes:
  return hashlib.sha256(token.encode()).digest()


class Session:
  """One harness run's recording. Thread-safe; the proxy and the rollout layer share it."""

  def __init__(self, session_id: str, token_hash: bytes | None = None,
               train_streams: Sequence[str] = ("main",)):
    self.id = session_id
    self._token_hash = token_hash
    self.train_streams = frozenset(train_streams)
    self.created = time.time()
    self.main_signature: tuple[str, str] | None = None  # (system text, tools key)
    self._lock = threading.RLock()
    self._calls: list[CallRecord] = []
    self._segments: list[Segment] = []
    self._streams: dict[str, _Stream] = {}
    self._by_tool_id: dict[str, Generation] = {}
    self._by_content: dict[str, list[Generation]] = {}
    self._closed = False  # set when the trial collects its trajectory (``SessionStore.pop``)

  # -- auth -------------------------------------------------------------------------------------
  def check_token(self, token: str | None) -> bool:
    """Binds the first token seen; afterwards only that token is accepted."""
    if token is None:
      return False
    h = hash_token(token)
    with self._lock:
      if self._token_hash is None:
        self._token_hash = h
        return True
      return hmac.compare_digest(self._token_hash, h)

  def assign_stream(self, classifier, request: RenderedRequest, main: str) -> str:
    """Classifies a call; the first call classified ``main`` defines the main signature."""
    with self._lock:
      name = classifier(request, self.main_signature)
      if name == main and self.main_signature is None:
        self.main_signature = (request.system_text(), request.tools_key())
      return name

  # -- splicing ---------------------------------------------------------------------------------
  def match_assistants(self, messages: Sequence[Message]) -> tuple[dict[int, list[int]], int]:
    """Maps assistant messages to recorded sampled ids (by tool-call id, else exact content).

    A message matches only if its tool calls (ids, names, arguments) equal the recorded ones
    and its content equals the recorded content (or was dropped by the client). Returns
    ({message index: sampled ids}, number of assistant messages left unmatched).
    """
    out, used, unmatched = {}, set(), 0
    with self._lock:
      for i, m in enumerate(messages):
        if m.role != "assistant":
          continue
        gen = None
        if m.tool_calls:
          gen = self._by_tool_id.get(m.tool_calls[0].id)
          if gen is not None and not same_calls(m.tool_calls, gen.tool_calls):
            gen = None
        else:
          for g in self._by_content.get(m.content.strip(), ()):
            if id(g) not in used:
              gen = g
              break
        if gen is not None and m.content.strip() not in ("", gen.content.strip()):
          gen = None
        if gen is None or id(gen) in used:
          unmatched += 1
          continue
        used.add(id(gen))
        out[i] = gen.token_ids
    return out, unmatched

  # -- recording --------------------------------------------------------------------------------
  def record(self, request: RenderedRequest, stream: str, prompt_ids: Sequence[int],
             sampling: SamplingParams, completion: Completion, reply: Reply,
             spliced: int, unmatched: int) -> CallRecord:
    """Appends one call to its stream's segments and remembers the generation for splicing."""
    prompt = list(prompt_ids)
    sampled = list(completion.token_ids)
    routes = completion.routes
    if routes is not None and np.shape(routes)[0] != len(prompt) + len(sampled):
      raise errors.ProxyError(
          f"the policy backend returned routes for {np.shape(routes)[0]} tokens, not the "
          f"{len(prompt)} prompt + {len(sampled)} sampled ones; the call is not recorded.",
          status=500, code="server_error")
    cut = lambda a, b: None if routes is None else np.asarray(routes[a:b])  # noqa: E731
    with self._lock:
      if self._closed:
        # The trial ended while this call was being sampled (e.g. the harness timed out): its
        # trajectory has been taken and the harness never sees this reply.
        raise errors.ProxyError(
            f"session {self.id!r} has ended (its trial finished); this call is not recorded.",
            status=409, code="session_closed")
      st = self._streams.get(stream)
      if st is None:
        st = self._streams[stream] = _Stream(stream, stream in self.train_streams)
      seg = self._continued_segment(st, prompt)
      reason = None
      if seg is None:
        reason = self._new_segment_reason(st, request, prompt, unmatched)
        seg = Segment(id=len(self._segments), stream=stream, train=st.train, reason=reason)
        self._segments.append(seg)
        st.segments.append(seg)
        seg.extend(prompt, sampled=False, routes=cut(0, len(prompt)))
      else:
        n = len(seg.token_ids)
        if routes is not None:
          seg.fill_routes(cut(0, n))
        seg.extend(prompt[n:], sampled=False, routes=cut(n, len(prompt)))
      offset = len(seg.token_ids)
      seg.extend(sampled, sampled=True, logprobs=[float(x) for x in completion.logprobs],
                 routes=cut(len(prompt), None))
      rec = CallRecord(
          index=len(self._calls), api=request.api, stream=stream, segment=seg.id,
          sample_offset=offset, new_segment=reason, prompt_ids=np.asarray(prompt, np.int32),
          token_ids=sampled, logprobs=list(map(float, completion.logprobs)),
          finish_reason=completion.finish_reason, reply_finish_reason=reply.finish_reason,
          temperature=float(sampling.temperature), top_p=float(sampling.top_p),
          top_k=int(sampling.top_k), max_tokens=int(sampling.max_tokens),
          params_version=int(completion.params_version),
          reused_prefix_len=int(completion.reused_prefix_len), spliced_messages=spliced,
          timings=dict(completion.timings), wall_time=time.time())
      seg.calls.append(rec.index)
      self._calls.append(rec)
      gen = Generation(rec.index, sampled, reply.content, list(reply.tool_calls))
      if reply.tool_calls:
        for c in reply.tool_calls:
          self._by_tool_id[c.id] = gen
      else:
        self._by_content.setdefault(reply.content.strip(), []).append(gen)
      st.last_system, st.last_tools = request.system_text(), request.tools_key()
      st.last_num_messages = len(request.messages)
      return rec

  @staticmethod
  def _continued_segment(st: _Stream, prompt: list[int]) -> Segment | None:
    for seg in reversed(st.segments[-_OPEN_SEGMENTS:]):
      n = len(seg.token_ids)
      if n <= len(prompt) and prompt[:n] == seg.token_ids:
        return seg
    return None

  @staticmethod
  def _new_segment_reason(st: _Stream, request: RenderedRequest, prompt: list[int],
                          unmatched: int) -> str:
    if not st.segments:
      return "first_call"
    for seg in st.segments[-_OPEN_SEGMENTS:]:
      if len(prompt) <= len(seg.token_ids) and seg.token_ids[:len(prompt)] == prompt:
        return "regenerated"
    if request.system_text() != st.last_system:
      return "system_changed"
    if request.tools_key() != st.last_tools:
      return "tools_changed"
    if len(request.messages) < st.last_num_messages:
      return "compacted"
    if unmatched:
      return "assistant_unmatched"
    return "history_rewritten"

  # -- reading ----------------------------------------------------------------------------------
  @property
  def calls(self) -> list[CallRecord]:
    with self._lock:
      return list(self._calls)

  def segments(self, train_only: bool = True) -> list[Segment]:
    with self._lock:
      return [s for s in self._segments if s.train or not train_only]

  def close(self) -> None:
    """No call is recorded after this (waits for one being recorded to finish)."""
    with self._lock:
      self._closed = True

  def trajectory(self) -> dict[str, Any]:
    """``{"segments": [train segments], "side_segments": [...], "calls": [...], ...}``.

    Each segment: token_ids, loss_mask (1 exactly on sampled tokens), logprobs (aligned,
    0 where the mask is 0), stream, train, reason, calls, temperatures, params_versions; and
    for a mixture-of-experts policy routed_experts (``route_codec.encode`` of its routes).
    """
    with self._lock:
      segs = [s.to_json(self._calls) for s in self._segments]
      return {"session_id": self.id,
              "segments": [s for s in segs if s["train"]],
              "side_segments": [s for s in segs if not s["train"]],
              "streams": sorted(self._streams),
              "calls": [c.to_json() for c in self._calls]}


class SessionStore:
  """Sessions by id (thread-safe)."""

  def __init__(self, train_streams: Sequence[str] = ("main",)):
    self.train_streams = tuple(train_streams)
    self._sessions: dict[str, Session] = {}
    self._lock = threading.Lock()

  def create(self, session_id: str, token: str | None = None) -> Session:
    with self._lock:
      if session_id in self._sessions:
        raise KeyError(session_id)
      s = Session(session_id, hash_token(token) if token is not None else None,
                  self.train_streams)
      self._sessions[session_id] = s
      return s

  def get(self, session_id: str) -> Session | None:
    with self._lock:
      return self._sessions.get(session_id)

  def get_or_create(self, session_id: str) -> Session:
    with self._lock:
      s = self._sessions.get(session_id)
      if s is None:
        s = self._sessions[session_id] = Session(session_id, None, self.train_streams)
      return s

  def pop(self, session_id: str) -> Session | None:
    """Removes a session and closes it, so its trajectory is final."""
    with self._lock:
      session = self._sessions.pop(session_id, None)
    if session is not None:
      session.close()
    return session

  def __len__(self):
    with self._lock:
      return len(self._sessions)

  def __contains__(self, session_id):
    with self._lock:
      return session_id in self._sessions
