"""OpenAI Chat Completions (``POST /v1/chat/completions``): parse, format, stream, errors."""

from __future__ import annotations

import time
from typing import Iterator

from legorl_jax.errors import ProxyError
from legorl_jax.proxy import wire
from legorl_jax.proxy.types import Message, Reply, RenderedRequest, ToolCall, ToolSpec, new_id

API = "chat"
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def parse(body, headers=None) -> RenderedRequest:
  body = wire.require_object(body)
  n = body.get("n")
  if n is not None and n != 1:
    wire.bad(f"'n'={n!r} is not supported: this server samples one choice per request; send "
             "n=1 (or omit it) and repeat the request for more samples.", "n")
  raw = wire.listing(body, "messages", required=True)
  if not raw:
    wire.bad("'messages' must hold at least one message.", "messages")
  messages = [_message(m, i) for i, m in enumerate(raw)]
  tools, specs = [], {}
  for i, t in enumerate(wire.listing(body, "tools")):
    if not isinstance(t, dict):
      wire.bad(f"tools[{i}] must be an object.", f"tools[{i}]")
    fn = t.get("function") if t.get("type", "function") == "function" else None
    if fn is None:
      continue  # Non-function tools (built-ins) cannot be rendered; ignored.
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
      wire.bad(f"tools[{i}].function.name must be a non-empty string.", f"tools[{i}]")
    tools.append({"type": "function", "function": {
        k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None}})
    specs[fn["name"]] = ToolSpec(fn["name"])
  max_tokens = wire.number(body, "max_completion_tokens", 1, 1 << 31, integer=True)
  if max_tokens is None:
    max_tokens = wire.number(body, "max_tokens", 1, 1 << 31, integer=True)
  opts = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
  hint = (headers or {}).get("x-legorl-stream")
  meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
  return RenderedRequest(
      api=API, model=str(body.get("model") or ""), messages=messages, tools=tools,
      tool_specs=specs, tool_choice=_tool_choice(body.get("tool_choice")),
      max_tokens=max_tokens, temperature=wire.number(body, "temperature", 0, 2),
      top_p=wire.number(body, "top_p", 0, 1, lo_open=True),
      stop=wire.stop_strings(body.get("stop"), "stop"),
      seed=wire.number(body, "seed", -(1 << 63), 1 << 64, integer=True),
      stream=bool(body.get("stream")), stream_usage=bool(opts.get("include_usage")),
      stream_hint=hint or meta.get("legorl_stream"))


def _tool_choice(v):
  if isinstance(v, dict):
    fn = v.get("function")
    return fn.get("name", "required") if isinstance(fn, dict) else "required"
  return v if v in ("none", "auto", "required") else "auto"


def _message(m, i: int) -> Message:
  p = f"messages[{i}]"
  if not isinstance(m, dict):
    wire.bad(f"{p} must be an object.", p)
  role = m.get("role")
  text = wire.content_text(m.get("content"), f"{p}.content")
  if role in ("system", "developer"):
    return Message("system", text)
  if role == "user":
    return Message("user", text)
  if role == "assistant":
    calls = []
    raw = m.get("tool_calls") or []
    if not isinstance(raw, list):
      wire.bad(f"{p}.tool_calls must be an array.", f"{p}.tool_calls")
    if m.get("function_call") and not raw:  # Legacy single function call.
      raw = [{"id": "", "function": m["function_call"]}]
    for j, c in enumerate(raw):
      fn = c.get("function") if isinstance(c, dict) else None
      if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        wire.bad(f"{p}.tool_calls[{j}].function.name must be a string.", f"{p}.tool_calls")
      args = fn.get("arguments", "")
      calls.append(ToolCall(id=str(c.get("id") or ""), name=fn["name"],
                            arguments=args if isinstance(args, (str, dict)) else str(args)))
    return Message("assistant", text, calls)
  if role in ("tool", "function"):
    return Message("tool", text, tool_call_id=str(m.get("tool_call_id") or m.get("name") or ""))
  wire.bad(f"{p}.role={role!r} is not one of system, developer, user, assistant, tool.",
           f"{p}.role")


# -- responses ------------------------------------------------------------------------------------
def _usage(reply: Reply) -> dict:
  return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
          "total_tokens": reply.prompt_tokens + reply.completion_tokens,
          "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
          "completion_tokens_details": {"reasoning_tokens": 0}}


def _wire_calls(reply: Reply) -> list[dict]:
  return [{"id": c.id, "type": "function",
           "function": {"name": c.name, "arguments": c.arguments_json}} for c in reply.tool_calls]


def response(req: RenderedRequest, reply: Reply) -> dict:
  msg = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else ""),
         "refusal": None}
  if reply.tool_calls:
    msg["tool_calls"] = _wire_calls(reply)
  return {"id": new_id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()),
          "model": req.model, "system_fingerprint": None,
          "choices": [{"index": 0, "message": msg, "logprobs": None,
                       "finish_reason": _FINISH[reply.finish_reason]}],
          "usage": _usage(reply)}


def events(req: RenderedRequest, reply: Reply) -> Iterator[bytes]:
  """SSE chunks: role, content, tool-call deltas (id+name, then arguments), finish, usage."""
  base = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk",
          "created": int(time.time()), "model": req.model, "system_fingerprint": None}

  def chunk(delta, finish=None):
    out = dict(base, choices=[{"index": 0, "delta": delta, "logprobs": None,
                               "finish_reason": finish}])
    if req.stream_usage:
      out["usage"] = None
    return wire.sse(out)

  yield chunk({"role": "assistant", "content": ""})
  if reply.content:
    yield chunk({"content": reply.content})
  for i, c in enumerate(reply.tool_calls):
    yield chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                 "function": {"name": c.name, "arguments": ""}}]})
    yield chunk({"tool_calls": [{"index": i, "function": {"arguments": c.arguments_json}}]})
  yield chunk({}, _FINISH[reply.finish_reason])
  if req.stream_usage:
    yield wire.sse(dict(base, choices=[], usage=_usage(reply)))
  yield wire.sse("[DONE]")


def error(e: ProxyError) -> dict:
  kind = {401: "invalid_request_error", 403: "permission_error", 404: "not_found_error",
          413: "invalid_request_error", 500: "server_error"}.get(e.status, "invalid_request_error")
  code = None if e.code == "invalid_request_error" else e.code
  return {"error": {"message": str(e), "type": kind, "param": e.param, "code": code}}
