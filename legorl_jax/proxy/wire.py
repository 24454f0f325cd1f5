"""Small helpers shared by the wire formats: field validation, content text, SSE framing."""

from __future__ import annotations

import json
import math
from typing import Any

from legorl_jax.errors import ProxyError

_MISSING = object()


def bad(message: str, param: str | None = None, code: str = "invalid_request_error"):
  raise ProxyError(message, status=400, code=code, param=param)


def require_object(body: Any, what: str = "request body") -> dict:
  if not isinstance(body, dict):
    bad(f"The {what} must be a JSON object, got {type(body).__name__}.")
  return body


def number(body: dict, key: str, lo: float, hi: float, *, integer: bool = False,
           lo_open: bool = False):
  """body[key] as a number in [lo, hi] (or (lo, hi]); None when absent or null."""
  v = body.get(key)
  if v is None:
    return None
  ok = isinstance(v, (int, float)) and not isinstance(v, bool)
  if ok and isinstance(v, float):
    ok = math.isfinite(v) and (not integer or v.is_integer())
  if ok:  # compared exactly: a JSON integer may be far beyond any float
    ok = (v > lo if lo_open else v >= lo) and v <= hi
  if not ok:
    kind = "an integer" if integer else "a number"
    left = "(" if lo_open else "["
    got = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
    bad(f"'{key}' must be {kind} in {left}{lo}, {hi}], got {got}.", key)
  return int(v) if integer else float(v)


def string(body: dict, key: str, default: Any = _MISSING, param: str | None = None) -> Any:
  v = body.get(key, _MISSING)
  if v is _MISSING or v is None:
    if default is _MISSING:
      bad(f"'{param or key}' is required.", param or key)
    return default
  if not isinstance(v, str):
    bad(f"'{param or key}' must be a string, got {type(v).__name__}.", param or key)
  return v


def listing(body: dict, key: str, required: bool = False) -> list:
  v = body.get(key)
  if v is None:
    if required:
      bad(f"'{key}' is required and must be an array.", key)
    return []
  if not isinstance(v, list):
    bad(f"'{key}' must be an array, got {type(v).__name__}.", key)
  return v


def stop_strings(v, param: str) -> tuple[str, ...]:
  if v is None:
    return ()
  if isinstance(v, str):
    return (v,) if v else ()
  if isinstance(v, list) and all(isinstance(s, str) for s in v):
    return tuple(s for s in v if s)
  bad(f"'{param}' must be a string or an array of strings.", param)


_TEXT_PART_TYPES = ("text", "input_text", "output_text")


def content_text(content, param: str) -> str:
  """Text of a message content: a string, or a list of parts (text kept, media noted)."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, dict):
    content = [content]
  if not isinstance(content, list):
    bad(f"'{param}' must be a string or an array of content parts.", param)
  out = []
  for part in content:
    if isinstance(part, str):
      out.append(part)
      continue
    if not isinstance(part, dict):
      bad(f"'{param}' holds a content part that is not an object.", param)
    kind = part.get("type")
    if kind in _TEXT_PART_TYPES or (kind is None and "text" in part):
      text = part.get("text", "")
      if not isinstance(text, str):
        bad(f"'{param}' holds a text part whose 'text' is not a string.", param)
      out.append(text)
    elif kind == "refusal":
      out.append(str(part.get("refusal", "")))
    elif kind in ("image", "image_url", "input_image"):
      out.append("[image]")
    elif kind in ("document", "file", "input_file"):
      out.append("[file]")
    elif kind == "tool_result":  # A nested result (Anthropic) rendered as its text.
      out.append(content_text(part.get("content"), param))
    # Other parts (thinking, cache markers, ...) carry no prompt text.
  return "".join(out)


def dumps(obj) -> str:
  return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(data, event: str | None = None) -> bytes:
  """One server-sent event; ``data`` is JSON-encoded unless it is already a string."""
  payload = data if isinstance(data, str) else dumps(data)
  head = f"event: {event}\n" if event else ""
  return f"{head}data: {payload}\n\n".encode()
