"""Policy backends: what produces the tokens behind the proxy.

The proxy renders a prompt, asks a backend for a ``Completion`` and records whatever comes
back, so every backend goes through the same recorder. ``EngineBackend`` samples from the
policy; ``ScriptedBackend`` answers with text chosen by a Python function (tokenized, logprobs
0.0), for scripted policies and tests of harness plumbing.
"""

from __future__ import annotations

import inspect
import time
from typing import Awaitable, Callable, Protocol, Sequence, runtime_checkable

from legorl_jax import errors
from legorl_jax.models import tokenizer as tokenization
from legorl_jax.proxy.types import RenderedRequest
from legorl_jax.sampling.params import Completion, SamplingParams


@runtime_checkable
class PolicyBackend(Protocol):
  """Produces one completion. ``max_len``: most prompt + sampled tokens it can hold."""

  max_len: int

  async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                     session_id: str | None, request: RenderedRequest) -> Completion:
    ...


class EngineBackend:
  """Samples from a running ``legorl_jax.sampling.Engine`` (session ids drive prefix reuse)."""

  def __init__(self, engine):
    self.engine = engine
    self.max_len = int(engine.max_len)

  @property
  def params_version(self) -> int:
    return self.engine.params_version

  async def generate(self, prompt_ids, sampling, *, session_id=None, request=None) -> Completion:
    return await self.engine.agenerate(prompt_ids, sampling, session_id=session_id)


ReplyFn = Callable[[RenderedRequest], "str | Awaitable[str]"]


class ScriptedBackend:
  """Answers with ``reply_fn(request)`` text, tokenized, ended by the end-of-turn token.

  The text is what an assistant turn of the chat template holds, e.g. ``"<tool_call>\\n{...}
  \\n</tool_call>"``. Logprobs are 0.0; ``max_tokens`` truncates (finish "length").
  """

  def __init__(self, tokenizer, reply_fn: ReplyFn, max_len: int = 32768, params_version: int = 0):
    self.tokenizer = tokenizer
    self.reply_fn = reply_fn
    self.max_len = int(max_len)
    self.params_version = params_version
    self._eot = tokenization.special_token_ids(tokenizer)["im_end"]
    if self._eot is None:
      self._eot = tokenization.special_token_ids(tokenizer)["eos"]

  async def generate(self, prompt_ids, sampling, *, session_id=None, request=None) -> Completion:
    t0 = time.perf_counter()
    text = self.reply_fn(request)
    if inspect.isawaitable(text):
      text = await text
    if not isinstance(text, str):
      raise errors.SamplingError(f"ScriptedBackend reply_fn returned {type(text).__name__}, "
                                 "expected str.")
    ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self._eot]
    if len(prompt_ids) + sampling.max_tokens > self.max_len:
      raise errors.ContextLengthError(
          f"prompt of {len(prompt_ids)} tokens + max_tokens={sampling.max_tokens} exceeds "
          f"max_len={self.max_len}.")
    finish, stop = "stop", self._eot
    if len(ids) > sampling.max_tokens:
      ids, finish, stop = ids[:sampling.max_tokens], "length", None
    total = time.perf_counter() - t0
    return Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish,
                      prompt_len=len(prompt_ids), reused_prefix_len=0,
                      params_version=self.params_version, stop=stop,
                      timings=dict(queued=0.0, prefill=0.0, decode=total, total=total))
