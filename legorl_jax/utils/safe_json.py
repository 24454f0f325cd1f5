"""The one parser for JSON that comes from outside: request bodies, tool-call arguments a model
or a harness wrote, task files, checkpoint and tokenizer files, verifier reports.

Why not ``json.loads`` directly: CPython's decoder recurses once per nesting level, and whether
``[[[[...`` 900 levels deep parses or raises ``RecursionError`` depends on how deep the *caller's*
stack already is (the aiohttp handler, a worker thread, a test runner). ``loads`` bounds the
nesting *before* decoding, with a scan that does not recurse, so the outcome depends only on the
text. It also refuses what would otherwise turn into surprises later: integers with more digits
than any real field has and floats that overflow to infinity. Every refusal is one ``errors.InvalidJSONError`` (a ``ValueError``)
whose message names the problem; HTTP layers answer it with a 400.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from legorl_jax.errors import InvalidJSONError

# Deepest nesting accepted. Real payloads are shallow: a Chat Completions body with tool schemas
# nests ~12 levels, a SWE-bench record ~4. Far below CPython's recursion limit (1000), so the
# decoder never comes near it, whatever the caller's stack depth.
MAX_DEPTH = 256
# Longest integer literal accepted (digits, sign excluded); a 64-bit value has at most 20.
MAX_INT_DIGITS = 64

# A JSON string literal (no recursion in the regex engine: one flat loop).
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
  """Deepest bracket nesting of ``text`` outside string literals (no recursion; O(len))."""
  depth = deepest = 0
  for m in _BRACKETS.finditer(_STRING.sub('""', text)):
    if m.group() in "[{":
      depth += 1
      if depth > deepest:
        deepest = depth
    else:
      depth -= 1
  return deepest


class _LongInteger(Exception):
  def __init__(self, digits: int):
    self.digits = digits


def _parse_int(s: str) -> int:
  if len(s.lstrip("-")) > MAX_INT_DIGITS:
    raise _LongInteger(len(s.lstrip("-")))
  return int(s)


def _long_integer_error(text: str, digits: int) -> InvalidJSONError:
  """Names the field that holds the over-long integer, where a key precedes it."""
  m = re.search(r'"((?:[^"\\]|\\.){1,80})"\s*:\s*-?\d{%d}' % (MAX_INT_DIGITS + 1), text)
  where = f" in field {m.group(1)!r}" if m else ""
  return InvalidJSONError(f"the integer{where} has {digits} digits (at most {MAX_INT_DIGITS} "
                          "are accepted)")


def _parse_float(s: str) -> float:
  v = float(s)
  if not math.isfinite(v):
    raise InvalidJSONError(f"the number {s[:40]!r} overflows a 64-bit float")
  return v


def loads(data: str | bytes | bytearray, *, what: str = "JSON input",
          max_depth: int = MAX_DEPTH) -> Any:
  """Parses ``data`` as JSON, or raises ``InvalidJSONError`` naming ``what`` and the problem.

  Refused: text that is not UTF-8, not JSON, nested deeper than ``max_depth``, integers longer
  than ``MAX_INT_DIGITS`` digits, numbers that overflow a float. ``NaN``/``Infinity`` parse as
  the stdlib does, so the field validators downstream name the field they do not fit.
  """
  if isinstance(data, (bytes, bytearray)):
    try:
      data = bytes(data).decode("utf-8-sig" if data[:3] == b"\xef\xbb\xbf" else "utf-8")
    except UnicodeDecodeError as e:
      raise InvalidJSONError(f"{what} is not valid UTF-8 (byte {e.start}); send UTF-8 text") from None
  # Each nesting level needs its own opening bracket, so text with at most ``max_depth`` of
  # them cannot nest deeper: the common small payload skips the scan (two C-speed counts
  # instead of a regex pass). Brackets inside strings only make the count an overestimate.
  if data.count("[") + data.count("{") > max_depth:
    depth = nesting_depth(data)
    if depth > max_depth:
      raise InvalidJSONError(f"{what} nests {depth} levels deep; at most {max_depth} are accepted")
  try:
    return json.loads(data, parse_int=_parse_int, parse_float=_parse_float)
  except _LongInteger as e:
    raise InvalidJSONError(f"{what}: {_long_integer_error(data, e.digits)}") from None
  except InvalidJSONError as e:
    raise InvalidJSONError(f"{what}: {e}") from None
  except json.JSONDecodeError as e:
    raise InvalidJSONError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column "
                           f"{e.colno}") from None
  except (ValueError, RecursionError) as e:  # RecursionError: unreachable below MAX_DEPTH
    raise InvalidJSONError(f"{what} is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None


def load(f, *, what: str | None = None, max_depth: int = MAX_DEPTH) -> Any:
  """``loads`` of an open file's whole content (``what`` defaults to the file's name)."""
  return loads(f.read(), what=what or getattr(f, "name", "JSON file"), max_depth=max_depth)
