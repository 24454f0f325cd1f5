"""HTTP layer: sessions and tokens, routes, error shapes, robustness under fuzzing, Unix socket."""

import asyncio
import http.client as http_client
import json
import random
import tempfile
import threading
import time

import aiohttp
import openai
import pytest

from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer, ScriptedBackend
from legorl_jax.utils import safe_json
from tests.proxy.conftest import ANTHROPIC_TOOLS, CHAT_TOOLS, RESPONSES_TOOLS, http, scripted_reply

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_session_token_bound_on_first_use(scripted_server):
  base = scripted_server.url + "/sess/harness-1"
  status, _ = http("POST", base + "/v1/chat/completions", "tok-A", CHAT)
  assert status == 200
  status, body = http("POST", base + "/v1/chat/completions", "tok-B", CHAT)
  assert status == 403 and body["error"]["type"] == "permission_error"
  status, body = http("POST", base + "/v1/messages", "tok-B",
                      {"model": "m", "max_tokens": 5, "messages": CHAT["messages"]})
  assert status == 403 and body["error"]["type"] == "permission_error"  # Anthropic shape
  status, _ = http("POST", base + "/v1/chat/completions", None, CHAT)
  assert status == 401
  status, _ = http("GET", base + "/trajectory", "tok-B")
  assert status == 403
  status, traj = http("GET", base + "/trajectory", "tok-A")
  assert status == 200 and len(traj["calls"]) == 1
  # x-api-key (Anthropic clients) is a bearer token too.
  status, _ = http("POST", base + "/v1/chat/completions", None, CHAT,
                   headers={"x-api-key": "tok-A"})
  assert status == 200


def test_unknown_session_is_404(scripted_server):
  status, body = http("GET", scripted_server.url + "/sess/nobody/trajectory", "t")
  assert status == 404 and "nobody" in body["error"]["message"]
  status, _ = http("GET", scripted_server.url + "/sess/nobody/v1/models", "t")
  assert status == 404


def test_trainer_sessions_without_auto_create(tokenizer):
  server = ProxyServer(ScriptedBackend(tokenizer, scripted_reply, max_len=1024), tokenizer,
                       ProxyConfig(auto_create_sessions=False, admin_token="admin-secret")).start()
  try:
    status, _ = http("POST", server.url + "/sess/made-up/v1/chat/completions", "t", CHAT)
    assert status == 404
    status, _ = http("POST", server.url + "/sess", "wrong", {})
    assert status == 403
    status, made = http("POST", server.url + "/sess", "admin-secret", {"session_id": "trial-7"})
    assert status == 200 and made["session_id"] == "trial-7"
    status, _ = http("POST", made["openai_base_url"] + "/chat/completions", "t", CHAT)
    assert status == 403  # the token was bound at creation
    client = openai.OpenAI(base_url=made["openai_base_url"], api_key=made["token"], max_retries=0)
    client.chat.completions.create(**CHAT)
    traj = server.sessions.get("trial-7").trajectory()
    assert len(traj["segments"]) == 1
    status, _ = http("POST", server.url + "/sess", "admin-secret", {"session_id": "trial-7"})
    assert status == 409
    status, _ = http("DELETE", server.url + "/sess/trial-7", made["token"])
    assert status == 200 and server.sessions.get("trial-7") is None
  finally:
    server.stop()


def test_models_route(scripted_server):
  for url in (scripted_server.url + "/v1/models", scripted_server.url + "/models"):
    status, body = http("GET", url)
    assert status == 200 and body["data"][0]["id"] == "scripted"
  models = openai.OpenAI(base_url=scripted_server.url + "/v1", api_key="k").models.list()
  assert [m.id for m in models] == ["scripted"]


def test_large_body_with_unknown_fields(scripted_server):
  body = dict(CHAT, thinking={"type": "enabled"}, context_management={"edits": []},
              reasoning_effort="high", prompt_cache_key="x", metadata={"k": "v"},
              unknown_vendor_field={"deep": [1, 2, {"x": None}]},
              messages=[{"role": "system", "content": "rules " * 15000},
                        {"role": "user", "content": "hi"}])
  assert len(json.dumps(body)) > 90_000
  status, _ = http("POST", scripted_server.url + "/v1/chat/completions", None, body,
                   headers={"x-stainless-lang": "python", "openai-beta": "x"})
  assert status == 400  # 15000 words do not fit a 1024-token context, but it parsed
  body["messages"][0]["content"] = "rules " * 100
  body["unknown_padding"] = "p" * 80_000
  status, out = http("POST", scripted_server.url + "/v1/chat/completions", None, body)
  assert status == 200 and out["choices"][0]["message"]["content"]


def test_engine_failure_fails_only_that_request(tokenizer):
  def reply(req):
    if req.messages[-1].content == "boom":
      raise RuntimeError("backend exploded")
    return "fine"

  server = ProxyServer(ScriptedBackend(tokenizer, reply, max_len=1024), tokenizer).start()
  try:
    status, body = http("POST", server.url + "/v1/chat/completions", None,
                        {"model": "m", "messages": [{"role": "user", "content": "boom"}]})
    assert status == 500 and body["error"]["type"] == "server_error"
    status, body = http("POST", server.url + "/v1/messages", None, {
        "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "boom"}]})
    assert status == 500 and body["error"]["type"] == "api_error"
    status, body = http("POST", server.url + "/v1/chat/completions", None, CHAT)
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine"
  finally:
    server.stop()


def _fuzz_bodies(rng: random.Random):
  valid = [CHAT, {"model": "m", "input": "hi", "tools": RESPONSES_TOOLS},
           {"model": "m", "max_tokens": 5, "tools": ANTHROPIC_TOOLS,
            "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
           dict(CHAT, tools=CHAT_TOOLS, stream=True)]
  junk = [None, 0, -1, 1e308, "", "x", [], {}, [None], {"": {}}, True, "\u0000", {"a": [1]}]
  for _ in range(30):
    base = json.dumps(rng.choice(valid))
    kind = rng.randrange(5)
    if kind == 0:  # truncated JSON
      yield base[:rng.randrange(len(base))].encode()
    elif kind == 1:  # random bytes
      yield bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif kind == 2:  # valid JSON, wrong types in random fields
      obj = json.loads(base)
      for key in rng.sample(sorted(obj), k=min(len(obj), 2)):
        obj[key] = rng.choice(junk)
      yield json.dumps(obj).encode()
    elif kind == 3:  # nested junk inside messages / input
      obj = json.loads(base)
      key = "messages" if "messages" in obj else "input"
      obj[key] = [rng.choice(junk), {"role": rng.choice(["user", "assistant", "tool", 5]),
                                     "content": rng.choice(junk)}]
      yield json.dumps(obj).encode()
    else:  # deep nesting
      yield ("[" * rng.randrange(1, 5000)).encode()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                                   "/v1/messages/count_tokens", "/sess/fuzz/v1/chat/completions",
                                   "/sess/fuzz/v1/messages", "/sess", "/sess/fuzz/trajectory"])
def test_fuzz_every_route_keeps_serving(scripted_server, route):
  rng = random.Random(route)
  for raw in _fuzz_bodies(rng):
    status, body = http("POST", scripted_server.url + route, "fuzz-token", raw=raw)
    assert status in (200, 400, 404, 405), (status, raw[:80], body)
    if status != 200:
      err = body["error"]
      assert isinstance(err, dict) and isinstance(err["message"], str)
      if "messages" in route:
        assert body["type"] == "error"
  status, _ = http("POST", scripted_server.url + "/v1/chat/completions", None, CHAT)
  assert status == 200


_ROUTE_BODY = {"/v1/chat/completions": CHAT, "/sess/fuzz/v1/chat/completions": CHAT,
               "/v1/responses": {"model": "m", "input": "hi"},
               "/v1/messages": {"model": "m", "max_tokens": 5, "messages": CHAT["messages"]},
               "/sess/fuzz/v1/messages": {"model": "m", "max_tokens": 5,
                                          "messages": CHAT["messages"]},
               "/v1/messages/count_tokens": {"model": "m", "messages": CHAT["messages"]},
               "/sess": {}}


@pytest.mark.parametrize("route", sorted(_ROUTE_BODY))
def test_nesting_on_both_sides_of_the_limit_on_every_route(scripted_server, route):
  """A nested value inside an otherwise valid body: at the bound it is accepted by the JSON
  layer (whatever the route then says of the field), one level past it and far past it (5,000,
  100,000 levels, closed or not) it is a 400 that names the nesting, never a 500. The bound is
  checked before decoding, so the outcome does not depend on the handler's stack depth."""
  limit = safe_json.MAX_DEPTH
  prefix = json.dumps(_ROUTE_BODY[route])[:-1] + (', ' if _ROUTE_BODY[route] else '') + '"x": '
  for inner, closed in ((limit - 1, True), (limit, True), (5000, True), (100_000, False)):
    raw = (prefix + "[" * inner + ("]" * inner if closed else "") + "}").encode()
    status, body = http("POST", scripted_server.url + route, "fuzz-token", raw=raw)
    msg = str((body.get("error") or {}).get("message", "")) if isinstance(body, dict) else ""
    if inner + 1 <= limit:
      assert status in (200, 400) and "levels deep" not in msg, (route, inner, status, body)
    else:
      assert status == 400 and f"nests {inner + 1} levels deep" in msg, (route, inner, body)
  status, _ = http("POST", scripted_server.url + "/v1/chat/completions", None, CHAT)
  assert status == 200


def test_oversized_body_is_413(tokenizer):
  server = ProxyServer(ScriptedBackend(tokenizer, scripted_reply, max_len=1024), tokenizer,
                       ProxyConfig(max_body_bytes=10_000)).start()
  try:
    big = dict(CHAT, padding="x" * 20_000)
    status, body = http("POST", server.url + "/v1/messages", None, big)
    assert status == 413 and body["error"]["type"] == "request_too_large"
    status, body = http("POST", server.url + "/v1/chat/completions", None, big)
    assert status == 413 and "error" in body
    status, _ = http("POST", server.url + "/v1/chat/completions", None, CHAT)
    assert status == 200
  finally:
    server.stop()


def test_unix_socket(tokenizer):
  with tempfile.TemporaryDirectory() as tmp:
    path = f"{tmp}/proxy.sock"
    server = ProxyServer(ScriptedBackend(tokenizer, scripted_reply, max_len=1024), tokenizer,
                         port=None, uds=path).start()
    try:
      async def go():
        conn = aiohttp.UnixConnector(path=path)
        async with aiohttp.ClientSession(connector=conn) as s:
          async with s.post("http://localhost/v1/chat/completions", json=CHAT) as r:
            return r.status, await r.json()

      status, body = asyncio.run(go())
      assert status == 200 and body["choices"][0]["message"]["content"]
      assert server.port is None and server.url == "http://localhost"  # no TCP listener
    finally:
      server.stop()


@pytest.mark.parametrize("route,field", [
    ("/v1/chat/completions", "max_tokens"), ("/v1/chat/completions", "seed"),
    ("/v1/messages", "max_tokens"), ("/v1/messages", "top_k"),
    ("/v1/responses", "max_output_tokens")])
def test_integer_beyond_any_float_is_a_400_naming_the_field(scripted_server, route, field):
  body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
  if route == "/v1/responses":
    body = {"model": "m", "input": "hi"}
  body[field] = 10 ** 400  # valid JSON; float(v) overflows
  status, out = http("POST", scripted_server.url + route, None, body)
  assert status == 400, out
  assert field in json.dumps(out) and len(json.dumps(out)) < 1000


class _HangingBackend:
  """Never answers; notes when a request arrives and when its handler is cancelled."""

  def __init__(self):
    self.max_len, self.params_version = 1024, 0
    self.started, self.cancelled = threading.Event(), threading.Event()

  async def generate(self, prompt_ids, sampling, *, session_id=None, request=None):
    self.started.set()
    try:
      await asyncio.sleep(60)
    except asyncio.CancelledError:
      self.cancelled.set()
      raise


def _hang_up_after(server, started, body):
  conn = http_client.HTTPConnection("127.0.0.1", server.port, timeout=10)
  conn.request("POST", "/v1/chat/completions", json.dumps(body),
               {"Content-Type": "application/json"})
  assert started()
  conn.close()  # the harness was killed: its connection goes away mid-request


def test_client_hanging_up_cancels_its_request(tokenizer, engine):
  backend = _HangingBackend()
  server = ProxyServer(backend, tokenizer).start()
  try:
    _hang_up_after(server, lambda: backend.started.wait(10), CHAT)
    assert backend.cancelled.wait(10)
  finally:
    server.stop()
  # With the real engine: the request stops sampling (counted as cancelled, not failed).
  server = ProxyServer(EngineBackend(engine), tokenizer).start()
  try:
    before = engine.stats()

    def decoding():  # its first chunk sampled
      deadline = time.time() + 10
      while engine.stats()["decode_calls"] == before["decode_calls"] and time.time() < deadline:
        time.sleep(0.002)
      return engine.stats()["decode_calls"] > before["decode_calls"]
    _hang_up_after(server, decoding, dict(CHAT, max_tokens=900, temperature=1.0))
    deadline = time.time() + 20
    while engine.stats()["cancelled"] == before["cancelled"] and time.time() < deadline:
      time.sleep(0.02)
    after = engine.stats()
    assert after["cancelled"] == before["cancelled"] + 1 and after["failed"] == before["failed"]
    assert after["decoded_tokens"] - before["decoded_tokens"] < 900  # stopped early
  finally:
    server.stop()
