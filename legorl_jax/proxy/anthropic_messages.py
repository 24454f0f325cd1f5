"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``).

``tool_result`` blocks inside a user message become tool messages (in order, before the
user's remaining text); ``tool_use`` blocks become assistant tool calls. Thinking blocks and
cache markers carry no prompt text. Tools without an ``input_schema`` (server tools such as
web search) cannot be called by the policy and are ignored.
"""

from __future__ import annotations

from typing import Iterator

from legorl_jax.errors import ProxyError
from legorl_jax.proxy import wire
from legorl_jax.proxy.types import Message, Reply, RenderedRequest, ToolCall, ToolSpec, new_id

API = "messages"


def parse(body, headers=None, *, count_only: bool = False) -> RenderedRequest:
  body = wire.require_object(body)
  messages: list[Message] = []
  system = body.get("system")
  if system is not None:
    text = wire.content_text(system, "system")
    if text:
      messages.append(Message("system", text))
  raw = wire.listing(body, "messages", required=True)
  if not raw and not count_only:
    wire.bad("'messages' must hold at least one message.", "messages")
  for i, m in enumerate(raw):
    messages.extend(_message(m, i))
  tools, specs = [], {}
  for i, t in enumerate(wire.listing(body, "tools")):
    if not isinstance(t, dict):
      wire.bad(f"tools[{i}] must be an object.", f"tools.{i}")
    if "input_schema" not in t:
      continue
    name = t.get("name")
    if not isinstance(name, str) or not name:
      wire.bad(f"tools.{i}.name must be a non-empty string.", f"tools.{i}.name")
    fn = {"name": name, "parameters": t["input_schema"]}
    if t.get("description"):
      fn = {"name": name, "description": t["description"], "parameters": t["input_schema"]}
    tools.append({"type": "function", "function": fn})
    specs[name] = ToolSpec(name)
  max_tokens = wire.number(body, "max_tokens", 1, 1 << 31, integer=True)
  if max_tokens is None and not count_only:
    wire.bad("'max_tokens' is required.", "max_tokens")
  meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
  hint = (headers or {}).get("x-legorl-stream") or meta.get("legorl_stream")
  return RenderedRequest(
      api=API, model=str(body.get("model") or ""), messages=messages, tools=tools,
      tool_specs=specs, tool_choice=_tool_choice(body.get("tool_choice")), max_tokens=max_tokens,
      temperature=wire.number(body, "temperature", 0, 1),
      top_p=wire.number(body, "top_p", 0, 1, lo_open=True),
      top_k=wire.number(body, "top_k", 0, 1 << 31, integer=True),
      stop=wire.stop_strings(body.get("stop_sequences"), "stop_sequences"),
      stream=bool(body.get("stream")), stream_hint=hint if isinstance(hint, str) else None)


def _tool_choice(v):
  if not isinstance(v, dict):
    return "auto"
  kind = v.get("type")
  if kind == "tool":
    return str(v.get("name") or "required")
  return {"any": "required", "none": "none"}.get(kind, "auto")


def _message(m, i: int) -> list[Message]:
  p = f"messages.{i}"
  if not isinstance(m, dict):
    wire.bad(f"{p} must be an object.", p)
  role, content = m.get("role"), m.get("content")
  if role not in ("user", "assistant", "system"):
    wire.bad(f"{p}.role={role!r} must be 'user' or 'assistant'.", f"{p}.role")
  if isinstance(content, str) or content is None:
    return [Message(role, content or "")]
  if not isinstance(content, list):
    wire.bad(f"{p}.content must be a string or an array of content blocks.", f"{p}.content")
  if role == "assistant":
    texts, calls = [], []
    for j, b in enumerate(content):
      if not isinstance(b, dict):
        wire.bad(f"{p}.content.{j} must be an object.", f"{p}.content.{j}")
      if b.get("type") == "tool_use":
        inp = b.get("input", {})
        calls.append(ToolCall(id=str(b.get("id") or ""), name=str(b.get("name") or ""),
                              arguments=inp if isinstance(inp, dict) else {}))
      elif b.get("type") == "text":
        texts.append(wire.content_text([b], f"{p}.content.{j}"))
    return [Message("assistant", "".join(texts), calls)]
  out, texts = [], []
  for j, b in enumerate(content):
    if not isinstance(b, dict):
      wire.bad(f"{p}.content.{j} must be an object.", f"{p}.content.{j}")
    if b.get("type") == "tool_result":
      if texts:
        out.append(Message(role, "".join(texts)))
        texts = []
      text = wire.content_text(b.get("content"), f"{p}.content.{j}.content")
      out.append(Message("tool", text, tool_call_id=str(b.get("tool_use_id") or "")))
    else:
      texts.append(wire.content_text([b], f"{p}.content.{j}"))
  if texts or not out:
    out.append(Message(role, "".join(texts)))
  return out


# -- responses ------------------------------------------------------------------------------------
def _stop_reason(reply: Reply) -> str:
  if reply.tool_calls:
    return "tool_use"
  if reply.finish_reason == "length":
    return "max_tokens"
  return "stop_sequence" if reply.stop else "end_turn"


def _usage(reply: Reply, output_tokens: int) -> dict:
  return {"input_tokens": reply.prompt_tokens - reply.cached_tokens,
          "cache_creation_input_tokens": 0, "cache_read_input_tokens": reply.cached_tokens,
          "output_tokens": output_tokens}


def _blocks(reply: Reply) -> list[dict]:
  out = [{"type": "text", "text": reply.content}] if reply.content or not reply.tool_calls else []
  for c in reply.tool_calls:
    args = c.arguments if isinstance(c.arguments, dict) else {"input": c.arguments}
    out.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
  return out


def response(req: RenderedRequest, reply: Reply) -> dict:
  return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": req.model,
          "content": _blocks(reply), "stop_reason": _stop_reason(reply),
          "stop_sequence": reply.stop, "usage": _usage(reply, reply.completion_tokens)}


def events(req: RenderedRequest, reply: Reply) -> Iterator[bytes]:
  """message_start, per block start / delta(s) / stop, message_delta, message_stop."""
  start = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": req.model,
           "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(reply, 1)}
  yield wire.sse({"type": "message_start", "message": start}, "message_start")
  for i, b in enumerate(_blocks(reply)):
    if b["type"] == "text":
      yield wire.sse({"type": "content_block_start", "index": i,
                      "content_block": {"type": "text", "text": ""}}, "content_block_start")
      if b["text"]:
        yield wire.sse({"type": "content_block_delta", "index": i,
                        "delta": {"type": "text_delta", "text": b["text"]}},
                       "content_block_delta")
    else:
      yield wire.sse({"type": "content_block_start", "index": i,
                      "content_block": dict(b, input={})}, "content_block_start")
      delta = {"type": "input_json_delta", "partial_json": wire.dumps(b["input"])}
      yield wire.sse({"type": "content_block_delta", "index": i, "delta": delta},
                     "content_block_delta")
    yield wire.sse({"type": "content_block_stop", "index": i}, "content_block_stop")
  yield wire.sse({"type": "message_delta",
                  "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": reply.stop},
                  "usage": _usage(reply, reply.completion_tokens)}, "message_delta")
  yield wire.sse({"type": "message_stop"}, "message_stop")


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def error(e: ProxyError) -> dict:
  return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"),
                                     "message": str(e)}}
