"""Which stream a call belongs to: the agent's main loop, or a side call.

Harnesses make calls that are not the agent acting: conversation titles, topic detection,
summaries, sub-agents with their own prompt and tools. Those are recorded in their own streams
and (by default) not trained on. The classifier is a plain function
``(request, main_signature) -> stream name`` so a harness adapter can pass its own.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable

from legorl_jax.proxy.types import RenderedRequest

MAIN = "main"
StreamClassifier = Callable[[RenderedRequest, "tuple[str, str] | None"], str]

_TITLE_RE = re.compile(r"\btitles?\b|\btopic\b", re.IGNORECASE)
_SUMMARY_RE = re.compile(r"\bsummar(?:y|ies|ize|ise|izing|ising)\b", re.IGNORECASE)
# Title / summary prompts are short (OpenCode's title prompt is ~2.1k characters); a long
# system prompt (agents send 8-60k) is an agent's, whatever it mentions.
_SIDE_PROMPT_CHARS = 4000
_NAME_RE = re.compile(r"[^A-Za-z0-9_.:-]+")


def sanitize_stream_name(name: str) -> str:
  name = _NAME_RE.sub("-", str(name)).strip("-")[:64]
  return name or MAIN


def default_stream_classifier(request: RenderedRequest,
                              main_signature: tuple[str, str] | None) -> str:
  """Classifies one call.

  1. An explicit hint (``x-legorl-stream`` header, request metadata) wins.
  2. A call with the main loop's system prompt or tool set belongs to "main" (the main loop's
     system prompt may change, e.g. a date line; its tools rarely do).
  3. A tool-less call whose (short) system prompt asks for a title / topic or a summary is "title" /
     "summary".
  4. The first other call defines the main loop.
  5. Anything else is a side stream named after its system prompt: "subagent-<hash>" when it
     has tools, "side-<hash>" otherwise.
  """
  if request.stream_hint:
    return sanitize_stream_name(request.stream_hint)
  system, tools = request.system_text(), request.tools_key()
  if main_signature is not None:
    main_system, main_tools = main_signature
    if system == main_system or (tools and tools == main_tools):
      return MAIN
  if not request.tools and len(system) <= _SIDE_PROMPT_CHARS:
    if _TITLE_RE.search(system):
      return "title"
    if _SUMMARY_RE.search(system):
      return "summary"
  if main_signature is None:
    return MAIN
  digest = hashlib.sha256(system.encode()).hexdigest()[:8]
  return f"subagent-{digest}" if request.tools else f"side-{digest}"
