"""Proxy fault kit: malformed, oversized and truncated request bodies sent as raw bytes to the
proxy's Unix socket, and an engine that raises mid-request. Each scenario returns a
``faultkit.Outcome``; the proxy must answer with a clear status and keep serving the harness.
"""

from __future__ import annotations

import json
import os
import socket

from legorl_jax.harnesses.builtin import BuiltinAdapter
from legorl_jax.rewards import status as st
from tests.reliability.faultkit import SOLVED, FaultEnv, Outcome, expect_attempts

def raw_request(uds: str, data: bytes, read: bool = True, timeout: float = 10.0) -> int | None:
  """Sends raw bytes to the proxy's Unix socket; returns the HTTP status (None: no answer)."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.settimeout(timeout)
    s.connect(uds)
    s.sendall(data)
    if not read:
      return None
    head = b""
    try:
      while b"\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
          break
        head += chunk
    except (socket.timeout, ConnectionResetError):
      return None
  parts = head.split(b" ", 2)
  return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _post(path: str, body: bytes, *, length: int | None = None, ctype=b"application/json",
          token: str = "not-a-token") -> bytes:
  n = len(body) if length is None else length
  return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: " + ctype +
          b"\r\nAuthorization: Bearer " + token.encode() + b"\r\nContent-Length: " +
          str(n).encode() + b"\r\nConnection: close\r\n\r\n" + body)


def bad_bodies(max_body_bytes: int) -> dict[str, tuple[bytes, bool]]:
  """name -> (raw request, whether an answer is expected)."""
  chat = "/v1/chat/completions"
  return {
      "garbage": (_post(chat, os.urandom(4096)), True),
      "not_json": (_post(chat, b"{'model': policy, messages: ["), True),
      "json_array": (_post(chat, b"[1, 2, 3]"), True),
      "wrong_types": (_post(chat, b'{"model": 7, "messages": "hi", "max_tokens": "lots"}'), True),
      "deep_nesting": (_post(chat, b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}"), True),
      "bad_utf8": (_post(chat, b'{"model": "policy", "messages": [{"role": "user", "content": "\xff\xfe"}]}'), True),
      "responses_garbage": (_post("/v1/responses", b"\x00\x01\x02" * 1000), True),
      "messages_garbage": (_post("/v1/messages", b"}{" * 1000), True),
      "oversized": (_post(chat, b"x" * (max_body_bytes + 1024)), True),
      "oversized_claimed": (_post(chat, b"{}", length=max_body_bytes * 4), True),
      "truncated": (_post(chat, b'{"model": "policy", "mess', length=4096), False),
      "not_http": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(300), True),
  }


def proxy_bad_bodies(env: FaultEnv, backend="local") -> Outcome:
  """While a trial waits on the model, the proxy is sent garbage, truncated and oversized
  bodies: each gets a 4xx (or a dropped connection), the proxy stays healthy and the trial
  is solved."""
  answers: dict[str, int | None] = {}

  def hook():
    for name, (data, read) in bad_bodies(env.proxy.config.max_body_bytes).items():
      try:
        answers[name] = raw_request(env.proxy.uds, data, read=read)
      except (BrokenPipeError, ConnectionResetError):
        answers[name] = None
    answers["health"] = raw_request(env.proxy.uds, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n")

  env.policy.arm(hook)

  def check(o, results):
    bad = {k: v for k, v in answers.items()
           if k != "health" and v is not None and not 400 <= v < 500}
    if bad or answers.get("health") != 200:
      return f"proxy answers {answers}"
    return expect_attempts(SOLVED)(o, results)

  o = env.run("proxy_bad_bodies", BuiltinAdapter(), backend, check=check)
  o.detail = (o.detail + " " if o.detail else "") + json.dumps(answers)
  return o


def engine_raises(env: FaultEnv, engine, proxy, backend="local") -> Outcome:
  """The sampling engine's decode step raises during a request (a real ``Engine`` behind the
  proxy): that request fails with a 5xx, the harness retries, the trial ends with a policy
  outcome and the engine keeps serving."""
  original = engine._device.decode_step  # noqa: SLF001 -- the fault is injected into the engine itself
  failed0 = engine.stats().get("failed", 0)

  def failing(*args, **kwargs):
    engine._device.decode_step = original  # noqa: SLF001
    raise RuntimeError("injected decode failure")

  engine._device.decode_step = failing  # noqa: SLF001

  def check(o, results):
    r = results[0]
    failed = engine.stats().get("failed", 0) - failed0
    if failed < 1:
      return "the injected failure did not hit a request"
    if not r.trajectory or not r.trajectory.calls:
      return "no model call was recorded after the failure"
    if st.is_infrastructure(r.status):
      return f"final status {r.status}"
    return ""

  try:
    return env.run("engine_raises", BuiltinAdapter(max_tokens=32), backend, proxy=proxy,
                   timeout_s=180.0, max_turns=3, check=check)
  finally:
    engine._device.decode_step = original  # noqa: SLF001
