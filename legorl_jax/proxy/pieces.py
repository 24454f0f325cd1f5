"""Tokenization of prompt text in cached pieces, so a resent history is not tokenized again.

Harnesses resend the whole conversation on every call: a 60 kB prompt costs tens of ms to
tokenize, and all but the last turn or two were tokenized on the previous call. A fast
(`tokenizers`) tokenizer extracts added tokens before normalizing and pre-tokenizing, so text
cut right before a special token (not ``lstrip``, not ``normalized``, not ``single_word``)
tokenizes to the same ids as a whole: ``encode(a + b) == encode(a) + encode(b)`` when ``b``
starts with such a token. Chat templates open every turn with one (``<|im_start|>``,
``<|start_header_id|>``...), so each turn is one piece, looked up in an LRU cache keyed by its
text (shared by sessions: system prompts and tool blocks repeat across them).

The construction checks that property on a probe text; a tokenizer that breaks it is encoded
whole (correct, uncached).
"""

from __future__ import annotations

import array
import collections
import logging
import re
import threading

log = logging.getLogger(__name__)

# Probe text for the split property: spaces, newlines, unicode, digits and JSON around the cuts.
_PROBE_PARTS = ("system\n  You are a helper.", "\n", "user\nHi  there \u00e9t\u00e9 123\n\n",
                "assistant\n {\"a\": 1}\n", "  \n", "user\n\t tab ", "", "assistant\n")


class PieceEncoder:
  """``encode(text) -> list[int]`` equal to the tokenizer's one-shot encoding, memoized by piece.

  ``max_chars``: the cache holds pieces up to this many characters in all (least recently
  used dropped first); 0 disables caching. Thread-safe.
  """

  def __init__(self, tokenizer, max_chars: int = 32 << 20):
    self.tokenizer = tokenizer
    self.max_chars = int(max_chars)
    # The Rust tokenizer directly: same ids as ``tokenizer.encode``, without its Python layers.
    self._fast = getattr(tokenizer, "backend_tokenizer", None)
    self._cache: collections.OrderedDict[str, array.array] = collections.OrderedDict()
    self._chars = 0
    self._lock = threading.Lock()
    self.hits = self.misses = 0
    self._split = None
    boundaries = self._boundary_tokens()
    if boundaries and self.max_chars > 0:
      alternatives = "|".join(re.escape(t) for t in sorted(boundaries, key=len, reverse=True))
      self._boundary_re = re.compile(f"({alternatives})")
      self._split = self._split_text
      probe = "".join(p + boundaries[i % len(boundaries)] for i, p in enumerate(_PROBE_PARTS * 2))
      if self._encode_pieces(probe, cache=False) != self._encode_whole(probe):
        log.warning("tokenizer %s does not tokenize text cut before special tokens like the "
                    "whole text; prompts are tokenized whole (slower).",
                    getattr(tokenizer, "name_or_path", type(tokenizer).__name__))
        self._split = None

  def _boundary_tokens(self) -> list[str]:
    """Special added tokens that text can be cut before without changing the ids."""
    if self._fast is None:
      return []
    decoder = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
    added = [getattr(t, "content", None) or "" for _, t in sorted(decoder.items())]
    out = []
    for _, tok in sorted(decoder.items()):
      content = getattr(tok, "content", None)
      if (content and getattr(tok, "special", False) and not getattr(tok, "lstrip", False)
          and not getattr(tok, "normalized", False) and not getattr(tok, "single_word", False)
          and not any(_straddles(other, content) for other in added if other != content)):
        out.append(content)
    return out

  def _split_text(self, text: str) -> list[str]:
    """``text`` cut right before every boundary token."""
    parts = self._boundary_re.split(text)  # [text, token, text, token, text, ...]
    out = [parts[0]] if parts[0] else []
    out.extend([parts[k] + parts[k + 1] for k in range(1, len(parts), 2)])
    return out

  def _encode_whole(self, text: str) -> list[int]:
    if not text:
      return []
    if self._fast is not None:
      return self._fast.encode(text, add_special_tokens=False).ids
    return list(self.tokenizer.encode(text, add_special_tokens=False))

  def _encode_pieces(self, text: str, cache: bool = True) -> list[int]:
    pieces = [p for p in self._split(text) if p]
    if not cache:
      return [i for p in pieces for i in self._encode_whole(p)]
    cached = self._cache
    with self._lock:  # one pass under the lock: hits are most pieces
      found = [cached.get(p) for p in pieces]
      for p, hit in zip(pieces, found):
        if hit is not None:
          cached.move_to_end(p)
    ids: list[int] = []
    misses = 0
    for p, hit in zip(pieces, found):
      if hit is None:
        hit = self._store(p, array.array("i", self._encode_whole(p)))
        misses += 1
      ids.extend(hit)
    self.hits += len(pieces) - misses
    self.misses += misses
    return ids

  def _store(self, piece: str, ids: array.array) -> array.array:
    if len(piece) > self.max_chars:
      return ids
    with self._lock:
      if piece not in self._cache:
        self._cache[piece] = ids
        self._chars += len(piece)
        while self._chars > self.max_chars:
          old, _ = self._cache.popitem(last=False)
          self._chars -= len(old)
    return ids

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens added), as one ``tokenizer.encode`` gives."""
    if not text:
      return []
    if self._split is None:
      return self._encode_whole(text)
    return self._encode_pieces(text)

  @property
  def cached_chars(self) -> int:
    return self._chars

  def clear(self):
    with self._lock:
      self._cache.clear()
      self._chars = 0


def _straddles(other: str, boundary: str) -> bool:
  """Whether added token ``other`` could match across a cut made right before ``boundary``."""
  return any(boundary.startswith(other[k:]) or other[k:].startswith(boundary)
             for k in range(1, len(other)))
