"""Stop strings on token ids: where to cut a completion so ids, logprobs and text agree."""

from __future__ import annotations

from typing import Callable, Sequence

DecodeFn = Callable[[Sequence[int]], str]


def as_decode_fn(tokenizer_or_fn) -> DecodeFn | None:
  """Accepts None, a callable ``ids -> str`` or a tokenizer with ``.decode``."""
  if tokenizer_or_fn is None or not hasattr(tokenizer_or_fn, "decode"):
    return tokenizer_or_fn
  return lambda ids: tokenizer_or_fn.decode(list(ids))


def find_stop(decode: DecodeFn, ids: Sequence[int], stops: Sequence[str],
              checked: int = 0) -> tuple[int, str] | None:
  """First token boundary at which the decoded text contains a stop string.

  Args:
    decode: token ids -> text.
    ids: the completion so far.
    stops: stop strings.
    checked: a prefix length already known to contain no stop string.
  Returns:
    ``(n, stop)``: keep ``ids[:n]`` -- the shortest prefix whose text contains ``stop``; the
    cut is at a token boundary, so the kept text may run past the stop string by the rest of
    the last token. None if no stop string occurs.
  """
  if not stops or len(ids) <= checked:
    return None
  text = decode(ids)
  if not any(s in text for s in stops):
    return None
  lo, hi = checked, len(ids)  # invariant: ids[:lo] has no stop, ids[:hi] has one.
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if any(s in decode(ids[:mid]) for s in stops):
      hi = mid
    else:
      lo = mid
  text = decode(ids[:hi])
  first = min((text.find(s), i) for i, s in enumerate(stops) if s in text)
  return hi, stops[first[1]]
