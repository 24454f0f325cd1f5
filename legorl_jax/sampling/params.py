"""Request-side types of the sampling engine: what to sample and what came back."""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
from legorl_jax import errors


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How one completion is sampled.

  temperature: 0 = greedy. top_p: nucleus mass in (0, 1], 1 disables. top_k: 0 disables.
  max_tokens: most tokens to sample. stop_token_ids: finish after sampling any of these (the
  stop token is part of the completion). stop: strings; the completion is cut after the first
  token whose text completes one of them (needs an engine ``decode_fn``). seed: makes the draw
  reproducible (same seed + same prompt -> same tokens, whatever else is batched alongside).
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_tokens: int = 256
  stop_token_ids: tuple[int, ...] = ()
  stop: tuple[str, ...] = ()
  seed: int | None = None

  def __post_init__(self):
    def bad(field, why):
      raise errors.ConfigError(f"SamplingParams.{field}={getattr(self, field)!r}: {why}")

    if isinstance(self.stop, str):
      object.__setattr__(self, "stop", (self.stop,))
    object.__setattr__(self, "stop", tuple(self.stop))
    object.__setattr__(self, "stop_token_ids", tuple(
        int(t) if _is_int(t) else t for t in self.stop_token_ids))
    if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
        or self.temperature < 0:
      bad("temperature", "must be a finite number >= 0 (0 = greedy).")
    if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
      bad("top_p", "must be in (0, 1]; use 1.0 to disable nucleus sampling.")
    if not _is_int(self.top_k) or self.top_k < 0:
      bad("top_k", "must be an int >= 0; use 0 to disable top-k.")
    if not _is_int(self.max_tokens) or self.max_tokens < 1:
      bad("max_tokens", "must be an int >= 1.")
    if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
      bad("stop_token_ids", "must be non-negative token ids.")
    if not all(isinstance(s, str) and s for s in self.stop):
      bad("stop", "must be non-empty strings.")
    if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**32):
      bad("seed", "must be None or an int in [0, 2**32).")


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


@dataclasses.dataclass
class Completion:
  """One finished request.

  token_ids / logprobs: the sampled tokens and the logprob each was drawn with (see
  ``legorl_jax.sampling.sample`` for the convention). finish_reason: "stop" (stop id or stop
  string) or "length" (max_tokens). stop: the stop id or string that ended it, if any.
  prompt_len: prompt tokens. reused_prefix_len: prompt tokens whose K/V came from the cache.
  params_version: the engine's parameter version the whole completion was sampled with.
  timings: host wall-clock seconds -- queued, prefill, decode, total (device work is dispatched
  asynchronously, so prefill compute mostly shows up under decode).
  routes: None, or (engines that record routes: mixture-of-experts policies) the experts each
  token of ``prompt + token_ids`` was routed to in every sparse layer, int8/int16
  ``[prompt_len + len(token_ids), L_moe, k]``: the routes of the very K/V and hidden states the
  sampled logprobs came from (a reused prefix's included). The last sampled token is never fed
  back, so its row is -1 (no route), as is any row the engine did not compute.
  """

  token_ids: list[int]
  logprobs: list[float]
  finish_reason: str
  prompt_len: int
  reused_prefix_len: int
  params_version: int
  stop: int | str | None = None
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  routes: np.ndarray | None = dataclasses.field(default=None, repr=False)
