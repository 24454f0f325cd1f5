"""The fixed shape buckets of the sampling engine.

Every device call the engine makes takes its row count and attention window from a small
sorted set of sizes, so once the set has compiled no request recompiles anything. Shared by
the engine (which checks and builds the sets), the scheduler and the device cache (which pick
from them).
"""

from __future__ import annotations

from typing import Sequence

from legorl_jax import errors


def bucket(buckets: Sequence[int], need: int) -> int:
  """Smallest bucket >= need (the largest one if none is)."""
  for b in buckets:
    if b >= need:
      return b
  return buckets[-1]


def geometric(lo: int, hi: int, factor: int) -> tuple[int, ...]:
  """``lo, lo * factor, ...`` below ``hi``, then ``hi``."""
  out, b = [], lo
  while b < hi:
    out.append(b)
    b *= factor
  return tuple(out) + (hi,)


def fill(step: int, hi: int, per_octave: int = 8) -> tuple[int, ...]:
  """Attention windows that follow the fill: multiples of ``step`` up to ``step * per_octave``,
  then ``per_octave`` evenly spaced sizes per doubling, then ``hi``.

  A decode or prefill call attends over the smallest window covering its longest row, so a
  window is at most ``step`` slots (or an eighth of its size, past ``8 * step``) above what is
  filled. Powers of two waste up to half: a 600-token trial attended over 1,024 slots, ~45% of
  the demo's decode step. The count stays small for long contexts: 48 windows up to 32k at
  ``step=128``; each (rows, window) pair compiles once, on first use.
  """
  if step < 1 or per_octave < 1:
    raise errors.ConfigError(f"Attention window step={step} and per_octave={per_octave} must be "
                             ">= 1.")
  out, b = [], step
  while b < hi:
    out.append(b)
    b += max(step, (1 << (b.bit_length() - 1)) // per_octave)
  return tuple(out) + (hi,)


def checked(name: str, values, limit: int, include_max: bool = False) -> tuple[int, ...]:
  """``values`` sorted and deduplicated; ConfigError unless all are in ``[1, limit]``.
  ``include_max`` appends ``limit`` (so every size up to it has a bucket)."""
  vals = sorted({int(v) for v in values})
  if not vals or vals[0] < 1 or vals[-1] > limit:
    raise errors.ConfigError(f"Engine {name}={tuple(values)} must be integers in [1, {limit}].")
  if include_max and vals[-1] != limit:
    vals.append(limit)
  return tuple(vals)
