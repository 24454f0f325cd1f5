"""The proxy's core, independent of HTTP: request -> prompt -> backend -> reply + record.

``ProxyService.complete`` classifies the call's stream, splices recorded generations into
the prompt, maps the request's sampling options onto server defaults / caps / forced values,
clamps ``max_tokens`` to the context, samples through the backend and records the call.

Reproducible sampling: a session may carry a seed (``set_session_seed``, set by whoever
creates it, e.g. the RL loop from the run seed, step, task and sample). A request without its
own ``seed`` then samples with ``derive_seed(session seed, stream, call index in the stream)``,
so a trial's tokens do not depend on how concurrent trials reached the engine; unseeded
sessions keep the engine's arrival-order seeds.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import threading
import weakref
from typing import Sequence

from legorl_jax import errors
from legorl_jax.proxy.backend import PolicyBackend
from legorl_jax.proxy.recorder import Session, SessionStore
from legorl_jax.proxy.render import ChatRenderer
from legorl_jax.proxy.streams import MAIN, StreamClassifier, default_stream_classifier
from legorl_jax.proxy.types import Reply, RenderedRequest
from legorl_jax.sampling.params import SamplingParams

log = logging.getLogger(__name__)

_TOOL_ID_PREFIX = {"chat": "call_", "responses": "call_", "messages": "toolu_"}


def derive_seed(*parts) -> int:
  """A uint32 seed from ``parts`` (ints / strings), stable across processes and platforms
  (unlike ``hash``): the same parts give the same seed in a resumed run."""
  digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=4).digest()
  return int.from_bytes(digest, "little")


@dataclasses.dataclass
class _SessionSeed:
  seed: int
  calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass
class ProxyConfig:
  """Server-side policy for requests.

  default_*: used when a request leaves a field out. force_temperature / force_top_p: used
  whatever the request asks (a trainer samples at its own temperature; the value used is
  recorded per call). default_max_tokens None = whatever fits the context; max_tokens_cap
  bounds any request. auto_create_sessions: the first request on ``/sess/{id}`` creates the
  session (else unknown ids get 404). train_streams: streams whose segments are trained on.
  admin_token: required by ``POST /sess`` when set. record_anonymous: record ``/v1`` calls
  into the session "anonymous". token_cache_chars: text of the tokenized turns kept so that
  resent histories are not tokenized again (0: off). context_hint: how to get a longer
  context (e.g. the serve flag to raise), appended to an over-long request's error.
  """

  model_name: str = "legorl-policy"
  default_temperature: float = 1.0
  default_top_p: float = 1.0
  force_temperature: float | None = None
  force_top_p: float | None = None
  default_max_tokens: int | None = None
  max_tokens_cap: int | None = None
  auto_create_sessions: bool = True
  train_streams: Sequence[str] = (MAIN,)
  stream_classifier: StreamClassifier = default_stream_classifier
  max_body_bytes: int = 64 << 20
  admin_token: str | None = None
  record_anonymous: bool = False
  token_cache_chars: int = 32 << 20
  context_hint: str = ""  # how to get a longer context, added to over-long requests' errors


class ProxyService:
  """Turns neutral requests into replies through one backend, recording per session."""

  def __init__(self, backend: PolicyBackend, tokenizer, config: ProxyConfig | None = None, *,
               chat_template: str | None = None):
    self.backend = backend
    self.config = config or ProxyConfig()
    self.renderer = ChatRenderer(tokenizer, chat_template,
                                 cache_chars=self.config.token_cache_chars)
    self.sessions = SessionStore(self.config.train_streams)
    # Session -> its seed and per-stream call counts; dies with the session.
    self._seeds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    self._seeds_lock = threading.Lock()

  def set_session_seed(self, session_id: str, seed: int) -> None:
    """Requests of this session without their own ``seed`` sample with seeds derived from
    ``seed``, the stream and the call's index in that stream (see the module docstring)."""
    session = self.sessions.get(session_id)
    if session is None:
      raise errors.ProxyError(f"cannot seed session {session_id!r}: no such session; create it "
                              "first (ProxyServer.create_session).", status=404, code="not_found")
    with self._seeds_lock:
      self._seeds[session] = _SessionSeed(int(seed) % 2**32)

  def request_seed(self, session: Session | None, stream: str | None) -> int | None:
    """The next call's seed in ``session``'s ``stream`` (None: the session has no seed).
    Calls of one stream are sequential in a harness, so their index is reproducible."""
    if session is None:
      return None
    with self._seeds_lock:
      s = self._seeds.get(session)
      if s is None:
        return None
      index = s.calls[stream]
      s.calls[stream] += 1
    return derive_seed(s.seed, stream, index)

  @property
  def max_len(self) -> int:
    return int(self.backend.max_len)

  def sampling_params(self, req: RenderedRequest, prompt_len: int,
                      default_seed: int | None = None) -> SamplingParams:
    """Server policy applied to ``req``; ``default_seed`` is used when it carries no seed."""
    c = self.config
    room = self.max_len - prompt_len
    if room < 1:
      raise errors.ProxyError(
          f"prompt is too long: {prompt_len} tokens > {self.max_len - 1} maximum (the model's "
          f"context is {self.max_len} tokens); shorten or compact the conversation"
          + (f", or {c.context_hint}." if c.context_hint else "."),
          status=400, code="context_length_exceeded", param="messages")
    max_tokens = req.max_tokens or c.default_max_tokens or room
    if c.max_tokens_cap:
      max_tokens = min(max_tokens, c.max_tokens_cap)
    max_tokens = max(1, min(max_tokens, room))
    temperature = c.force_temperature if c.force_temperature is not None else (
        req.temperature if req.temperature is not None else c.default_temperature)
    top_p = c.force_top_p if c.force_top_p is not None else (
        req.top_p if req.top_p is not None else c.default_top_p)
    try:
      return SamplingParams(
          temperature=float(temperature), top_p=float(top_p), top_k=int(req.top_k or 0),
          max_tokens=int(max_tokens), stop_token_ids=self.renderer.stop_ids,
          stop=tuple(s for s in req.stop if s),
          seed=int(req.seed) % 2**32 if req.seed is not None else default_seed)
    except errors.ConfigError as e:
      raise errors.ProxyError(str(e), param="sampling") from e

  def count_tokens(self, req: RenderedRequest, session: Session | None = None) -> int:
    splices = session.match_assistants(req.messages)[0] if session is not None else None
    return len(self.renderer.render(req, splices))

  async def complete(self, req: RenderedRequest, session: Session | None) -> Reply:
    """Samples a reply to ``req`` and records it in ``session`` (if any)."""
    stream, splices, unmatched = None, {}, 0
    if session is not None:
      stream = session.assign_stream(self.config.stream_classifier, req, MAIN)
      splices, unmatched = session.match_assistants(req.messages)
    prompt = self.renderer.render(req, splices)
    req.prompt_ids = prompt
    seed = self.request_seed(session, stream)  # drawn per call, even if the request has one
    sampling = self.sampling_params(req, len(prompt), default_seed=seed)
    engine_session = f"{session.id}/{stream}" if session is not None else None
    try:
      completion = await self.backend.generate(prompt, sampling, session_id=engine_session,
                                               request=req)
    except errors.ContextLengthError as e:
      hint = f" ({self.config.context_hint})" if self.config.context_hint else ""
      raise errors.ProxyError(str(e) + hint, code="context_length_exceeded",
                              param="messages") from e
    except errors.ConfigError as e:
      raise errors.ProxyError(str(e)) from e
    except Exception as e:  # noqa: BLE001 -- a backend failure fails this request only
      log.exception("backend failed on a %s request", req.api)
      raise errors.ProxyError(f"The policy backend failed: {e}", status=500,
                              code="server_error") from e
    reply = self.renderer.reply(req, completion, _TOOL_ID_PREFIX[req.api])
    if session is not None:
      session.record(req, stream, prompt, sampling, completion, reply, len(splices), unmatched)
    return reply
