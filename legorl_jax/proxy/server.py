"""The HTTP server (aiohttp): routes, session auth, error shapes, SSE, lifecycle.

Routes, anonymous and per session (``/sess/{id}`` prefix, bearer token bound on first use):

  POST /v1/chat/completions           OpenAI Chat Completions (+ SSE)
  POST /v1/responses                  OpenAI Responses (+ SSE)
  POST /v1/messages[?beta=true]       Anthropic Messages (+ SSE)
  POST /v1/messages/count_tokens      Anthropic token count
  GET  /v1/models                     the served model (OpenAI and Anthropic fields)
  GET  /sess/{id}/trajectory          the session's recording (JSON)
  DELETE /sess/{id}                   drops a session
  POST /sess                          creates a session with a random token (trainer)
  GET  /health

The same paths without ``/v1`` are accepted too (clients configured with a bare base URL).
Secrets are never logged: tokens are kept only as hashes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import secrets
import threading
from typing import NamedTuple

from aiohttp import web

from legorl_jax import errors
from legorl_jax.errors import InvalidJSONError, ProxyError
from legorl_jax.utils import safe_json
from legorl_jax.proxy import anthropic_messages, openai_chat, openai_responses, wire
from legorl_jax.proxy.recorder import Session
from legorl_jax.proxy.service import ProxyConfig, ProxyService
from legorl_jax.proxy.types import Message, new_id

log = logging.getLogger(__name__)

_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_APIS = {"chat": openai_chat, "responses": openai_responses, "messages": anthropic_messages}
_STORED_RESPONSES = 4096  # previous_response_id history kept in memory (LRU)


class SessionHandle(NamedTuple):
  """What a trainer hands to one harness run."""

  session_id: str
  token: str
  base_url: str  # ``.../sess/{id}``: Anthropic clients use it as is

  @property
  def openai_base_url(self) -> str:
    return self.base_url + "/v1"


def _token(request: web.Request) -> str | None:
  auth = request.headers.get("Authorization", "")
  if auth[:7].lower() == "bearer ":
    return auth[7:].strip() or None
  return request.headers.get("x-api-key") or None


class ProxyServer:
  """Serves the proxy over TCP and/or a Unix socket.

  In a trainer: ``server = ProxyServer(EngineBackend(engine), tokenizer, config).start()``
  runs it on a background thread; ``server.create_session()`` makes a session and
  ``server.sessions.get(id).trajectory()`` reads its recording. ``await server.astart()``
  runs it on the caller's event loop instead.
  """

  def __init__(self, backend, tokenizer, config: ProxyConfig | None = None, *,
               host: str = "127.0.0.1", port: int | None = 0, uds: str | None = None,
               chat_template: str | None = None):
    self.service = ProxyService(backend, tokenizer, config, chat_template=chat_template)
    self.config = self.service.config
    self.host, self.port, self.uds = host, port, uds
    # (bind host, port) of the listener ``listen_tcp`` opened on a running server, if any.
    self.tcp_listener: tuple[str, int] | None = None
    self._responses: collections.OrderedDict = collections.OrderedDict()
    self._runner: web.AppRunner | None = None
    self._loop: asyncio.AbstractEventLoop | None = None
    self._thread: threading.Thread | None = None
    self.app = self._make_app()

  @property
  def sessions(self):
    return self.service.sessions

  # -- lifecycle --------------------------------------------------------------------------------
  async def astart(self) -> "ProxyServer":
    # handler_cancellation: a client that hangs up (a harness killed at its time limit) cancels
    # its handler, and with it the engine request, which stops sampling at its next chunk.
    self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                 handler_cancellation=True)
    await self._runner.setup()
    if self.port is not None:
      site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
      await site.start()
      self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 -- port 0 -> real
    if self.uds is not None:
      await web.UnixSite(self._runner, self.uds).start()
      # Sandboxes run their harness as an unprivileged uid; the relay inside connects to this
      # socket, so it must be writable by others. Session tokens still guard every session.
      os.chmod(self.uds, 0o666)
    return self

  async def astop(self):
    if self._runner is not None:
      await self._runner.cleanup()
      self._runner = None

  def start(self, timeout: float = 30.0) -> "ProxyServer":
    """Runs the server on a background thread with its own event loop."""
    if self._thread is not None:
      return self
    ready, failure = threading.Event(), []

    def run():
      loop = asyncio.new_event_loop()
      self._loop = loop
      asyncio.set_event_loop(loop)
      try:
        loop.run_until_complete(self.astart())
      except Exception as e:  # noqa: BLE001 -- reported to the starting thread
        failure.append(e)
        ready.set()
        return
      ready.set()
      loop.run_forever()
      loop.run_until_complete(self.astop())
      loop.close()

    self._thread = threading.Thread(target=run, name="legorl-proxy", daemon=True)
    self._thread.start()
    if not ready.wait(timeout):
      raise errors.ProxyError("The proxy server did not start in time.", status=500)
    if failure:
      self._thread = None
      raise errors.ProxyError(f"The proxy server could not start: {failure[0]}", status=500)
    return self

  def listen_tcp(self, host: str = "0.0.0.0", port: int = 0, timeout: float = 30.0
                 ) -> tuple[str, int]:
    """Also serves this running server on TCP ``host:port`` (0: a free port); returns the
    (host, port) it listens on. For clients on other machines (trials on Ray worker nodes,
    ``rollout.ray_backend``) when the server was started with a Unix socket only; that
    listener serves only session routes and ``/health``. Once per server: a second call
    returns the first listener. A server started with a TCP port already returns that."""
    if self.port is not None:
      return self.host, self.port
    if self.tcp_listener is not None:
      return self.tcp_listener
    if self._loop is None or self._runner is None:
      raise errors.ProxyError("listen_tcp needs a running server: call start() first.",
                              status=500)

    async def open_site():
      site = web.TCPSite(self._runner, host, port, reuse_address=True)
      await site.start()
      return site._server.sockets[0].getsockname()[1]  # noqa: SLF001 -- port 0 -> real

    try:
      real = asyncio.run_coroutine_threadsafe(open_site(), self._loop).result(timeout)
    except OSError as e:
      raise errors.ConfigError(
          f"The proxy cannot listen on {host}:{port} for remote trials: {e}. Choose another "
          "port (--config.proxy.advertise_port, or 0 for a free one).") from e
    self.tcp_listener = (host, int(real))
    return self.tcp_listener

  def stop(self):
    if self._thread is None:
      return
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join()
    self._thread = None

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()

  @property
  def url(self) -> str:
    """Root URL (``http://host:port``; ``http://localhost`` when serving a Unix socket only)."""
    if self.port is None:
      return "http://localhost"
    host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{self.port}"

  def create_session(self, session_id: str | None = None, token: str | None = None
                     ) -> SessionHandle:
    """A new session bound to ``token`` (random when None)."""
    sid = session_id or new_id("s", 8)
    if not _SESSION_ID_RE.match(sid):
      raise errors.ConfigError(f"session id {sid!r} must match {_SESSION_ID_RE.pattern}.")
    token = token or secrets.token_urlsafe(24)
    try:
      self.sessions.create(sid, token)
    except KeyError:
      raise errors.ConfigError(f"session {sid!r} already exists.") from None
    return SessionHandle(sid, token, f"{self.url}/sess/{sid}")

  # -- app --------------------------------------------------------------------------------------
  def _make_app(self) -> web.Application:
    app = web.Application(client_max_size=self.config.max_body_bytes,
                          middlewares=[self._guard])
    r = app.router
    for prefix in ("", "/sess/{sid}"):
      for v in ("/v1", ""):
        r.add_post(f"{prefix}{v}/chat/completions", self._api_handler("chat"))
        r.add_post(f"{prefix}{v}/responses", self._api_handler("responses"))
        r.add_post(f"{prefix}{v}/messages", self._api_handler("messages"))
        r.add_post(f"{prefix}{v}/messages/count_tokens", self._count_tokens)
        r.add_get(f"{prefix}{v}/models", self._models)
    r.add_post("/sess", self._create_session)
    r.add_get("/sess/{sid}/trajectory", self._trajectory)
    r.add_delete("/sess/{sid}", self._delete_session)
    r.add_get("/health", self._health)
    return app

  @web.middleware
  async def _guard(self, request: web.Request, handler):
    """Every failure becomes an error in the shape of the API the route belongs to."""
    if self.tcp_listener is not None and self._on_remote_listener(request):
      # The listener for remote trials faces a network: only sessions' own routes (each
      # guarded by its token) and /health, never anonymous sampling or session creation.
      if not (request.path.startswith("/sess/") or request.path == "/health"):
        return self._error(request, ProxyError(
            f"{request.path} is not served on the remote-trial listener; use a session route "
            "(/sess/{id}/...).", status=403, code="permission_error"))
    try:
      return await handler(request)
    except ProxyError as e:
      return self._error(request, e)
    except web.HTTPException as e:
      if e.status < 400:
        raise
      return self._error(request, ProxyError(e.reason or "request failed", status=e.status,
                                             code="invalid_request_error"))
    except (asyncio.CancelledError, ConnectionResetError):
      raise
    except Exception as e:  # noqa: BLE001 -- one bad request must not take the server down
      log.exception("unhandled error on %s %s", request.method, request.path)
      return self._error(request, ProxyError(f"internal error: {type(e).__name__}: {e}",
                                             status=500, code="server_error"))

  def _on_remote_listener(self, request: web.Request) -> bool:
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return isinstance(sock, tuple) and len(sock) >= 2 and sock[1] == self.tcp_listener[1]

  @staticmethod
  def _api_of(request: web.Request) -> str:
    path = request.path
    if "/messages" in path or "anthropic-version" in request.headers:
      return "messages"
    return "responses" if "/responses" in path else "chat"

  def _error(self, request: web.Request, e: ProxyError) -> web.Response:
    body = _APIS[self._api_of(request)].error(e)
    return web.json_response(body, status=e.status, dumps=wire.dumps)

  def _session(self, request: web.Request, create: bool = True) -> Session | None:
    """The route's session (None on anonymous routes), after checking its token.

    An unknown id is created by a POST (when ``auto_create_sessions``), else it is a 404.
    """
    sid = request.match_info.get("sid")
    if sid is None:
      if self.config.record_anonymous:
        return self.sessions.get_or_create("anonymous")
      return None
    if not _SESSION_ID_RE.match(sid):
      raise ProxyError(f"session id {sid!r} is malformed.", status=404, code="not_found")
    session = self.sessions.get(sid)
    token = _token(request)
    if session is None and not (create and self.config.auto_create_sessions
                                and request.method == "POST"):
      raise ProxyError(f"unknown session {sid!r}.", status=404, code="not_found")
    if token is None:
      raise ProxyError("this session needs a bearer token (Authorization: Bearer ... or "
                       "x-api-key).", status=401, code="invalid_api_key")
    if session is None:
      session = self.sessions.get_or_create(sid)
    if not session.check_token(token):
      raise ProxyError(f"the token does not match session {sid!r}.", status=403,
                       code="permission_denied")
    return session

  async def _json(self, request: web.Request):
    if (request.content_length or 0) > self.config.max_body_bytes:  # refuse before waiting
      raise ProxyError(f"request body exceeds {self.config.max_body_bytes} bytes.", status=413,
                       code="request_too_large")
    try:
      raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
      raise ProxyError(f"request body exceeds {self.config.max_body_bytes} bytes.", status=413,
                       code="request_too_large") from None
    return _parse_body(raw)

  def _api_handler(self, api: str):
    fmt = _APIS[api]

    async def handle(request: web.Request) -> web.StreamResponse:
      session = self._session(request)
      body = await self._json(request)
      if api == "responses":
        req = fmt.parse(body, request.headers, history=self._history(body))
      else:
        req = fmt.parse(body, request.headers)
      reply = await self.service.complete(req, session)
      if api == "responses":
        rid = new_id("resp_")
        self._store_response(rid, req, reply)
        if req.stream:
          return await self._sse(request, fmt.events(req, reply, rid))
        return web.json_response(fmt.response(req, reply, response_id=rid), dumps=wire.dumps)
      if req.stream:
        return await self._sse(request, fmt.events(req, reply))
      return web.json_response(fmt.response(req, reply), dumps=wire.dumps)

    return handle

  def _history(self, body):
    prev = body.get("previous_response_id") if isinstance(body, dict) else None
    if prev is None:
      return None
    if prev not in self._responses:
      raise ProxyError(f"previous response {prev!r} is unknown to this server (responses are "
                       "kept in memory only); send the full input instead.",
                       param="previous_response_id")
    return list(self._responses[prev])

  def _store_response(self, rid, req, reply):
    conv = [m for m in req.messages if m.role != "system"]
    conv.append(Message("assistant", reply.content, list(reply.tool_calls)))
    self._responses[rid] = conv
    while len(self._responses) > _STORED_RESPONSES:
      self._responses.popitem(last=False)

  async def _sse(self, request: web.Request, chunks) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache", "Connection": "keep-alive"})
    await resp.prepare(request)
    await resp.write(b"".join(chunks))
    await resp.write_eof()
    return resp

  async def _count_tokens(self, request: web.Request) -> web.Response:
    session = self._session(request)
    body = await self._json(request)
    req = anthropic_messages.parse(body, request.headers, count_only=True)
    if not req.messages:
      return web.json_response({"input_tokens": 0})
    n = self.service.count_tokens(req, session)
    return web.json_response({"input_tokens": n})

  async def _models(self, request: web.Request) -> web.Response:
    if request.match_info.get("sid") is not None:
      self._session_for_read(request)
    name = self.config.model_name
    model = {"id": name, "object": "model", "created": 0, "owned_by": "legorl",
             "type": "model", "display_name": name, "created_at": "1970-01-01T00:00:00Z",
             "context_window": self.service.max_len}
    return web.json_response({"object": "list", "data": [model], "has_more": False,
                              "first_id": name, "last_id": name})

  def _session_for_read(self, request: web.Request) -> Session:
    return self._session(request, create=False)

  async def _trajectory(self, request: web.Request) -> web.Response:
    session = self._session_for_read(request)
    return web.json_response(session.trajectory(), dumps=wire.dumps)

  async def _delete_session(self, request: web.Request) -> web.Response:
    session = self._session_for_read(request)
    self.sessions.pop(session.id)
    return web.json_response({"deleted": session.id})

  async def _create_session(self, request: web.Request) -> web.Response:
    admin = self.config.admin_token
    if admin is not None:
      token = _token(request)
      if token is None or not secrets.compare_digest(token.encode(), admin.encode()):
        raise ProxyError("creating sessions needs the server's admin token.", status=403,
                         code="permission_denied")
    raw = await request.read()
    body = wire.require_object(_parse_body(raw) if raw.strip() else {})
    sid = body.get("session_id")
    if sid is not None and not isinstance(sid, str):
      wire.bad("'session_id' must be a string.", "session_id")
    try:
      h = self.create_session(sid)
    except errors.ConfigError as e:
      raise ProxyError(str(e), status=409 if "exists" in str(e) else 400) from None
    return web.json_response({"session_id": h.session_id, "token": h.token,
                              "base_url": h.base_url, "openai_base_url": h.openai_base_url})

  async def _health(self, request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "sessions": len(self.sessions),
                              "model": self.config.model_name})


def _parse_body(raw: bytes):
  """A request body as JSON, or a 400 ``invalid_json`` naming the problem (``safe_json``)."""
  try:
    return safe_json.loads(raw, what="request body")
  except InvalidJSONError as e:
    raise ProxyError(str(e), status=e.status, code=e.code) from None
