"""A native renderer of the bundled ChatML template, text-identical to its Jinja rendering.

The proxy renders the full conversation on every call; through `transformers` and Jinja that
costs ~0.1 ms per message (sandboxed attribute access, the ``{% generation %}`` extension,
copies of every message), i.e. most of the proxy's own latency on a long agent session. For
the bundled template (``legorl_jax.models.chat_template.CHAT_TEMPLATE``) this module writes
the same text with plain string operations. It is used only when the template in use is that
exact source; any other template goes through `transformers`. tests/proxy/test_chatml.py
checks the equality on random conversations against the Jinja rendering.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any, Callable, Mapping, Sequence

from legorl_jax.models import chat_template as ct

_S, _E = ct.IM_START, ct.IM_END
_TOOLS_HEAD = ("# Tools\n\nThese functions are available. Their JSON signatures are listed "
               "inside <tools></tools>, one per line:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nTo call functions, write one block per call:\n<tool_call>\n"
               '{"name": <function name>, "arguments": <JSON object of arguments>}\n'
               f"</tool_call>{_E}\n")
_TOOL_BLOCKS = 256  # rendered tool blocks kept, by tool-set key (LRU)


class TemplateError(ValueError):
  """The conversation breaks a rule of the template (the Jinja version raises too)."""


def _tojson(x) -> str:
  # transformers' ``tojson`` filter: json.dumps, non-ASCII kept, default separators.
  return json.dumps(x, ensure_ascii=False)


def _text(content) -> str:
  """The template's ``text`` macro."""
  if isinstance(content, str):
    return content
  if content is None:
    return ""
  if isinstance(content, Mapping):
    raise TemplateError("Message content must be a string or a list of text parts, got a "
                        "mapping.")
  if isinstance(content, (list, tuple)):
    out = []
    for part in content:
      if isinstance(part, str):
        out.append(part)
      elif isinstance(part, Mapping) and part.get("type") == "text":
        out.append(str(part.get("text", "")))
      else:
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        raise TemplateError(f"Only text content parts can be rendered, got type {kind}.")
    return "".join(out)
  return str(content)


class ChatMLRenderer:
  """``render(messages, tools, add_generation_prompt) -> str`` for the bundled template.

  ``messages`` are OpenAI-style dicts as ``render.template_message`` builds them. The tools
  block (often tens of kB of JSON schemas, identical on every call of a session) is cached by
  ``tools_key``.
  """

  def __init__(self):
    self._blocks: collections.OrderedDict[str, str] = collections.OrderedDict()
    self._lock = threading.Lock()

  def _tools_block(self, tools: Sequence[Any], key: str | None) -> str:
    if key is not None:
      with self._lock:
        hit = self._blocks.get(key)
        if hit is not None:
          self._blocks.move_to_end(key)
          return hit
    block = "".join(["\n" + _tojson(t) for t in tools])
    if key is not None:
      with self._lock:
        self._blocks[key] = block
        while len(self._blocks) > _TOOL_BLOCKS:
          self._blocks.popitem(last=False)
    return block

  def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
             add_generation_prompt: bool = True, tools_key: str | None = None) -> str:
    out: list[str] = []
    add = out.append
    n = len(messages)
    if tools:
      add(f"{_S}system\n")
      if n and messages[0].get("role") in ("system", "developer"):
        add(_text(messages[0].get("content")) + "\n\n")
      add(_TOOLS_HEAD)
      add(self._tools_block(tools, tools_key))
      add(_TOOLS_TAIL)
    prev_role = None
    for i, m in enumerate(messages):
      role = m.get("role")
      if role in ("system", "developer"):
        if not (i == 0 and tools):
          add(f"{_S}system\n{_text(m.get('content'))}{_E}\n")
      elif role == "user":
        add(f"{_S}user\n{_text(m.get('content'))}{_E}\n")
      elif role == "assistant":
        body = _text(m.get("content"))
        add(f"{_S}assistant\n")
        add(body)
        for j, call in enumerate(m.get("tool_calls") or ()):
          if isinstance(call, Mapping) and "function" in call:
            call = call["function"]
          if body or j:
            add("\n")
          add('<tool_call>\n{"name": ' + _tojson(call.get("name")) + ', "arguments": ')
          args = call.get("arguments")
          if isinstance(args, str):
            add(args if args.strip() else "{}")
          elif args is not None:
            add(_tojson(args))
          else:
            add("{}")
          add("}\n</tool_call>")
        add(f"{_E}\n")
      elif role == "tool":
        if prev_role != "tool":
          add(f"{_S}user")
        add(f"\n<tool_response>\n{_text(m.get('content'))}\n</tool_response>")
        if i == n - 1 or messages[i + 1].get("role") != "tool":
          add(f"{_E}\n")
      else:
        raise TemplateError(f"Unknown message role {role}; expected system, developer, user, "
                            "assistant or tool.")
      prev_role = role
    if add_generation_prompt:
      add(f"{_S}assistant\n")
    return "".join(out)


def native_renderer(template: str | None) -> Callable[..., str] | None:
  """A native ``render`` for ``template`` when one exists (the bundled template), else None."""
  if template == ct.CHAT_TEMPLATE:
    return ChatMLRenderer().render
  return None
