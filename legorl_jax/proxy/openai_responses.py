"""OpenAI Responses (``POST /v1/responses``), the API Codex speaks.

Input items map to neutral messages: ``instructions`` and ``developer`` / ``system`` items
to system messages; consecutive assistant-side items (assistant message, ``function_call``,
``custom_tool_call``, ``reasoning``) to one assistant message; ``*_call_output`` items to tool
messages. Tools: ``function``; ``custom`` (free-form input, rendered as a function taking
``{"input": string}``); ``namespace`` (a group; members are rendered as
``<namespace>.<name>`` and calls carry the namespace back). Built-in tools are ignored.
"""

from __future__ import annotations

import time
from typing import Iterator

from legorl_jax.errors import ProxyError
from legorl_jax.proxy import wire
from legorl_jax.proxy.types import Message, Reply, RenderedRequest, ToolCall, ToolSpec, new_id

API = "responses"
_ASSISTANT_ITEMS = ("function_call", "custom_tool_call", "reasoning")


def parse(body, headers=None, history: list[Message] | None = None) -> RenderedRequest:
  """``history``: the conversation of ``previous_response_id``, when the server stored it."""
  body = wire.require_object(body)
  messages: list[Message] = []
  instructions = body.get("instructions")
  if instructions:
    messages.append(Message("system", wire.content_text(instructions, "instructions")))
  messages.extend(history or ())
  inp = body.get("input")
  if isinstance(inp, str):
    messages.append(Message("user", inp))
  elif isinstance(inp, list):
    messages.extend(_items(inp))
  elif inp is not None:
    wire.bad("'input' must be a string or an array of input items.", "input")
  if not any(m.role != "system" for m in messages):
    wire.bad("'input' must hold at least one item.", "input")
  tools, specs = _tools(wire.listing(body, "tools"))
  meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
  hint = (headers or {}).get("x-legorl-stream") or meta.get("legorl_stream")
  extra = {k: body.get(k) for k in ("instructions", "tools", "tool_choice", "parallel_tool_calls",
                                     "store", "reasoning", "text", "metadata",
                                     "previous_response_id")}
  return RenderedRequest(
      api=API, model=str(body.get("model") or ""), messages=messages, tools=tools,
      tool_specs=specs, tool_choice=_tool_choice(body.get("tool_choice")),
      max_tokens=wire.number(body, "max_output_tokens", 1, 1 << 31, integer=True),
      temperature=wire.number(body, "temperature", 0, 2),
      top_p=wire.number(body, "top_p", 0, 1, lo_open=True), stream=bool(body.get("stream")),
      stream_hint=hint if isinstance(hint, str) else None, extra=extra)


def _tool_choice(v):
  if isinstance(v, dict):
    return str(v.get("name") or "required")
  return v if v in ("none", "auto", "required") else "auto"


def _function(name, description, parameters) -> dict:
  fn = {"name": name}
  if description:
    fn["description"] = description
  fn["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
  return {"type": "function", "function": fn}


def _tools(raw: list) -> tuple[list[dict], dict[str, ToolSpec]]:
  tools, specs = [], {}

  def add(t, namespace=None, ns_description=None, where=""):
    kind, name = t.get("type"), t.get("name")
    if kind not in ("function", "custom"):
      return
    if not isinstance(name, str) or not name:
      wire.bad(f"{where}.name must be a non-empty string.", where)
    full = f"{namespace}.{name}" if namespace else name
    desc = t.get("description") or ""
    if ns_description:
      desc = f"[{namespace}: {ns_description}] {desc}".strip()
    if kind == "function":
      tools.append(_function(full, desc, t.get("parameters")))
    else:
      fmt = t.get("format") if isinstance(t.get("format"), dict) else {}
      hint = fmt.get("definition") if fmt.get("type") == "grammar" else None
      schema = {"type": "object", "properties": {"input": {
          "type": "string", "description": "Raw tool input (free-form text)"
          + (f" following this {fmt.get('syntax', 'grammar')} grammar:\n{hint}" if hint else "")}},
          "required": ["input"]}
      tools.append(_function(full, desc, schema))
    specs[full] = ToolSpec(name, kind, namespace)

  for i, t in enumerate(raw):
    if not isinstance(t, dict):
      wire.bad(f"tools[{i}] must be an object.", f"tools[{i}]")
    if t.get("type") == "namespace":
      members = t.get("tools")
      if not isinstance(members, list) or not isinstance(t.get("name"), str):
        wire.bad(f"tools[{i}] (namespace) needs a name and a 'tools' array.", f"tools[{i}]")
      for j, member in enumerate(members):
        if isinstance(member, dict):
          add(member, t["name"], t.get("description"), f"tools[{i}].tools[{j}]")
    else:
      add(t, where=f"tools[{i}]")
  return tools, specs


def _items(items: list) -> list[Message]:
  out: list[Message] = []
  group: Message | None = None  # The open assistant message that calls are appended to.
  for i, it in enumerate(items):
    p = f"input[{i}]"
    if not isinstance(it, dict):
      wire.bad(f"{p} must be an object.", p)
    kind = it.get("type", "message")
    if kind == "message":
      role = it.get("role")
      text = wire.content_text(it.get("content"), f"{p}.content")
      if role == "assistant":
        if group is None or group.tool_calls:
          group = Message("assistant", text)
          out.append(group)
        else:
          group.content += text
        continue
      if role not in ("user", "system", "developer"):
        wire.bad(f"{p}.role={role!r} must be user, assistant, system or developer.", f"{p}.role")
      out.append(Message("system" if role == "developer" else role, text))
      group = None
    elif kind in _ASSISTANT_ITEMS:
      if group is None:
        group = Message("assistant", "")
        out.append(group)
      if kind == "function_call":
        name = it.get("name")
        if not isinstance(name, str):
          wire.bad(f"{p}.name must be a string.", f"{p}.name")
        ns = it.get("namespace")
        args = it.get("arguments", "")
        group.tool_calls.append(ToolCall(
            id=str(it.get("call_id") or ""), name=f"{ns}.{name}" if ns else name,
            arguments=args if isinstance(args, (str, dict)) else str(args), namespace=ns))
      elif kind == "custom_tool_call":
        ns = it.get("namespace")
        name = str(it.get("name") or "")
        group.tool_calls.append(ToolCall(
            id=str(it.get("call_id") or ""), name=f"{ns}.{name}" if ns else name,
            arguments={"input": str(it.get("input") or "")}, kind="custom", namespace=ns))
    elif kind in ("function_call_output", "custom_tool_call_output"):
      out.append(Message("tool", wire.content_text(it.get("output"), f"{p}.output"),
                         tool_call_id=str(it.get("call_id") or "")))
      group = None
    # Other items (item_reference, built-in tool calls, ...) carry nothing we can render.
  return out


# -- responses ------------------------------------------------------------------------------------
def _usage(reply: Reply) -> dict:
  return {"input_tokens": reply.prompt_tokens,
          "input_tokens_details": {"cached_tokens": reply.cached_tokens},
          "output_tokens": reply.completion_tokens,
          "output_tokens_details": {"reasoning_tokens": 0},
          "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def output_items(reply: Reply) -> list[dict]:
  """The response's output items (message first, then one item per tool call)."""
  items = []
  if reply.content or not reply.tool_calls:
    items.append({"type": "message", "id": new_id("msg_"), "status": "completed",
                  "role": "assistant", "content": [{"type": "output_text", "text": reply.content,
                                                    "annotations": [], "logprobs": []}]})
  for c in reply.tool_calls:
    bare = c.name.split(".", 1)[1] if c.namespace and c.name.startswith(c.namespace + ".") \
        else c.name
    if c.kind == "custom":
      item = {"type": "custom_tool_call", "id": new_id("ctc_"), "call_id": c.id, "name": bare,
              "input": c.arguments.get("input", "") if isinstance(c.arguments, dict) else
              str(c.arguments), "status": "completed"}
    else:
      item = {"type": "function_call", "id": new_id("fc_"), "call_id": c.id, "name": bare,
              "arguments": c.arguments_json, "status": "completed"}
    if c.namespace:
      item["namespace"] = c.namespace
    items.append(item)
  return items


def response(req: RenderedRequest, reply: Reply, *, response_id: str | None = None,
             items: list[dict] | None = None, status: str | None = None) -> dict:
  items = output_items(reply) if items is None else items
  status = status or ("incomplete" if reply.finish_reason == "length" else "completed")
  x = req.extra
  return {
      "id": response_id or new_id("resp_"), "object": "response", "created_at": int(time.time()),
      "status": status, "error": None, "model": req.model,
      "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
      "instructions": x.get("instructions"), "output": items,
      "parallel_tool_calls": x.get("parallel_tool_calls", True) is not False,
      "tool_choice": x.get("tool_choice") or "auto", "tools": x.get("tools") or [],
      "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_tokens,
      "previous_response_id": x.get("previous_response_id"), "store": x.get("store"),
      "reasoning": x.get("reasoning") or {"effort": None, "summary": None},
      "text": x.get("text") or {"format": {"type": "text"}}, "metadata": x.get("metadata") or {},
      "usage": _usage(reply) if status != "in_progress" else None}


def events(req: RenderedRequest, reply: Reply, response_id: str) -> Iterator[bytes]:
  """The Responses event sequence for a finished reply (each item added, streamed, done)."""
  seq = iter(range(1 << 30))
  items = output_items(reply)

  def ev(kind, **data):
    return wire.sse({"type": kind, "sequence_number": next(seq), **data}, kind)

  shell = response(req, reply, response_id=response_id, items=[], status="in_progress")
  yield ev("response.created", response=shell)
  yield ev("response.in_progress", response=shell)
  for idx, item in enumerate(items):
    iid = item["id"]
    if item["type"] == "message":
      text = item["content"][0]["text"]
      yield ev("response.output_item.added", output_index=idx,
               item=dict(item, status="in_progress", content=[]))
      part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
      yield ev("response.content_part.added", item_id=iid, output_index=idx, content_index=0,
               part=part)
      if text:
        yield ev("response.output_text.delta", item_id=iid, output_index=idx, content_index=0,
                 delta=text, logprobs=[])
      yield ev("response.output_text.done", item_id=iid, output_index=idx, content_index=0,
               text=text, logprobs=[])
      yield ev("response.content_part.done", item_id=iid, output_index=idx, content_index=0,
               part=dict(part, text=text))
    elif item["type"] == "function_call":
      yield ev("response.output_item.added", output_index=idx,
               item=dict(item, status="in_progress", arguments=""))
      yield ev("response.function_call_arguments.delta", item_id=iid, output_index=idx,
               delta=item["arguments"])
      yield ev("response.function_call_arguments.done", item_id=iid, output_index=idx,
               name=item["name"], arguments=item["arguments"])
    else:
      yield ev("response.output_item.added", output_index=idx,
               item=dict(item, status="in_progress", input=""))
      yield ev("response.custom_tool_call_input.delta", item_id=iid, output_index=idx,
               delta=item["input"])
      yield ev("response.custom_tool_call_input.done", item_id=iid, output_index=idx,
               input=item["input"])
    yield ev("response.output_item.done", output_index=idx, item=item)
  final = response(req, reply, response_id=response_id, items=items)
  yield ev("response.incomplete" if final["status"] == "incomplete" else "response.completed",
           response=final)


def error(e: ProxyError) -> dict:
  kind = {403: "permission_error", 404: "not_found_error", 500: "server_error"}.get(
      e.status, "invalid_request_error")
  code = None if e.code == "invalid_request_error" else e.code
  return {"error": {"message": str(e), "type": kind, "param": e.param, "code": code}}
