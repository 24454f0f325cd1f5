"""The API-neutral request and reply that the three wire formats are converted to and from.

Every wire API (OpenAI chat, OpenAI Responses, Anthropic Messages) is parsed into one
``RenderedRequest``: a conversation of system / user / assistant (+ tool calls with ids) /
tool (+ tool_call_id) messages and JSON-schema function tools. The prompt is rendered from it
by the tokenizer's chat template, and the policy's output comes back as a ``Reply`` that each
API formats in its own shape. Backends see the same ``RenderedRequest`` (a scripted policy can
choose its text from it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass
class ToolCall:
  """One tool call of an assistant message.

  ``arguments`` is a dict (parsed JSON) or, when a client sent something that is not a JSON
  object, the raw string. ``kind`` is "function" or "custom" (a Responses free-form tool, whose
  input string travels as ``{"input": ...}``); ``namespace`` is the Responses tool group.
  """

  id: str
  name: str
  arguments: Any = dataclasses.field(default_factory=dict)
  kind: str = "function"
  namespace: str | None = None

  @property
  def arguments_json(self) -> str:
    """The arguments as the JSON string OpenAI-style clients expect."""
    if isinstance(self.arguments, str):
      return self.arguments
    return json.dumps(self.arguments, ensure_ascii=False)


@dataclasses.dataclass
class Message:
  role: str  # system | user | assistant | tool
  content: str = ""
  tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
  tool_call_id: str | None = None


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """How a rendered tool name maps back to the wire: kind, namespace and the bare name."""

  name: str
  kind: str = "function"
  namespace: str | None = None


@dataclasses.dataclass
class RenderedRequest:
  """A parsed request in API-neutral form (plus, once rendered, its prompt ids).

  tools: JSON-schema function definitions ``{"type": "function", "function": {...}}`` as the
  chat template receives them; ``tool_specs`` maps each rendered name back to the wire.
  tool_choice: "auto", "none", "required" or a tool name. Sampling fields are None when the
  request did not set them (server defaults apply). ``stream_hint`` is an explicit stream
  name from the client (``x-legorl-stream`` header or request metadata).
  """

  api: str  # "chat" | "responses" | "messages"
  model: str
  messages: list[Message]
  tools: list[dict] = dataclasses.field(default_factory=list)
  tool_specs: dict[str, ToolSpec] = dataclasses.field(default_factory=dict)
  tool_choice: Any = "auto"
  max_tokens: int | None = None
  temperature: float | None = None
  top_p: float | None = None
  top_k: int | None = None
  stop: tuple[str, ...] = ()
  seed: int | None = None
  stream: bool = False
  stream_usage: bool = False
  stream_hint: str | None = None
  extra: dict = dataclasses.field(default_factory=dict)  # API-specific echo fields
  prompt_ids: list[int] | None = None
  # Memo of tools_key(): a call asks for it several times (stream, render, record) and tool
  # sets run to tens of kB of JSON. Reset it if ``tools`` is replaced after a call.
  _tools_key: str | None = dataclasses.field(default=None, init=False, repr=False,
                                             compare=False)

  def system_text(self) -> str:
    return "\n\n".join(m.content for m in self.messages if m.role == "system")

  def tools_key(self) -> str:
    """A short digest of the tool set as sent (empty string when there are no tools).

    Key order counts: the chat template renders the tools in the order they came, so two
    orderings are two prompts (and the rendered tool block is cached by this key).
    """
    if self._tools_key is None:
      if not self.tools:
        self._tools_key = ""
      else:
        blob = json.dumps(self.tools, ensure_ascii=False).encode()
        self._tools_key = hashlib.sha256(blob).hexdigest()[:16]
    return self._tools_key


@dataclasses.dataclass
class Reply:
  """What the policy answered, ready to be formatted by any API.

  finish_reason: "stop", "length" or "tool_calls"; ``stop`` is the stop string that ended it,
  if any. ``cached_tokens`` is the prompt prefix served from the KV cache.
  """

  content: str
  tool_calls: list[ToolCall]
  finish_reason: str
  prompt_tokens: int
  completion_tokens: int
  cached_tokens: int = 0
  stop: str | None = None
  unparsed: list[str] = dataclasses.field(default_factory=list)


def new_id(prefix: str, nbytes: int = 12) -> str:
  """A random id such as ``call_3f9a...`` (24 hex digits by default)."""
  return f"{prefix}{secrets.token_hex(nbytes)}"
