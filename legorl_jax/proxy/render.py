"""Neutral conversation -> prompt ids (splicing recorded generations), and output -> Reply.

Prompts are rendered once per call through the tokenizer's chat template (natively for the
bundled template, see ``chatml``). An assistant message that maps to a recorded generation is
rendered with a sentinel as its content; the text is then cut at the sentinels, the pieces are
tokenized, and each sentinel is replaced by the exact ids that were sampled for that message
(Invariant 1: no retokenization). When those ids end with the end-of-turn token, the
template's own copy of it right after the sentinel is skipped; whatever the template writes
after it (ChatML: ``\\n``) stays, as prompt tokens with mask 0, so the result equals a
one-shot render. Text is tokenized turn by turn through a cache (``pieces``), so the history a
harness resends on every call is not tokenized again.
"""

from __future__ import annotations

import json
import secrets
from typing import Mapping, Sequence

from legorl_jax import errors
from legorl_jax.models import tokenizer as tokenization
from legorl_jax.proxy import chatml
from legorl_jax.proxy.pieces import PieceEncoder
from legorl_jax.proxy.types import Message, Reply, RenderedRequest, ToolCall, new_id
from legorl_jax.utils import safe_json
from legorl_jax.sampling.params import Completion


class ChatRenderer:
  """Renders neutral requests with one tokenizer's chat template and parses its outputs."""

  def __init__(self, tokenizer, chat_template: str | None = None, *,
               cache_chars: int = 32 << 20, native: bool = True):
    """``cache_chars``: size of the tokenized-piece cache (0: none). ``native``: render the
    bundled template natively (False: always through `transformers`)."""
    self.tokenizer = tokenizer
    self.chat_template = chat_template
    self.stop_ids = tuple(tokenization.stop_token_ids(tokenizer))
    self._stop_set = frozenset(self.stop_ids)
    self._stop_text = {i: tokenizer.decode([i], skip_special_tokens=False) for i in self.stop_ids}
    self.pieces = PieceEncoder(tokenizer, cache_chars)
    template = chat_template or getattr(tokenizer, "chat_template", None)
    self._native = chatml.native_renderer(template) if native else None
    # Sentinels are fixed per renderer so that a resent history renders to the same text (and
    # hits the piece cache); the nonce keeps them out of reach of message contents.
    self._nonce = secrets.token_hex(8)

  # -- prompts ----------------------------------------------------------------------------------
  def encode(self, text: str) -> list[int]:
    return self.pieces.encode(text)

  def render(self, request: RenderedRequest, splices: Mapping[int, Sequence[int]] | None = None
             ) -> list[int]:
    """Prompt ids for ``request``; ``splices`` maps message index -> recorded sampled ids.

    A final unrecorded assistant message with text (Anthropic prefill) is continued rather
    than closed.
    """
    splices = dict(splices or {})
    msgs = list(request.messages)
    last = len(msgs) - 1
    prefill = False
    if msgs and msgs[-1].role == "assistant" and last not in splices and not msgs[-1].tool_calls:
      if msgs[-1].content.strip():
        prefill = True
      else:  # An empty trailing assistant turn asks for nothing: drop it.
        msgs.pop()
    sentinels = {i: f"\u27e6splice-{self._nonce}-{i}\u27e7" for i in splices}
    tools_key = request.tools_key()
    text = self._render_text(msgs, request.tools, sentinels, not prefill, tools_key)
    if prefill:
      text = self._cut_prefill(text, msgs[-1])
    found = _locate(text, sentinels)
    while len(found) < len(sentinels):
      # The template dropped (or moved) a message's content: render those messages normally.
      for i in [i for i in sentinels if i not in found]:
        del splices[i], sentinels[i]
      text = self._render_text(msgs, request.tools, sentinels, not prefill, tools_key)
      if prefill:
        text = self._cut_prefill(text, msgs[-1])
      found = _locate(text, sentinels)
    ids: list[int] = []
    cursor = 0
    for i in sorted(sentinels):
      pos = found[i]
      ids.extend(self.encode(text[cursor:pos]))
      sampled = splices[i]
      ids.extend(sampled)
      cursor = pos + len(sentinels[i])
      if sampled and sampled[-1] in self._stop_set:
        eot = self._stop_text[sampled[-1]]
        if eot and text.startswith(eot, cursor):
          cursor += len(eot)
    ids.extend(self.encode(text[cursor:]))
    if not ids:
      raise errors.ProxyError("The request renders to an empty prompt; send at least one message.")
    return ids

  def _render_text(self, msgs: Sequence[Message], tools, sentinels, add_generation_prompt,
                   tools_key=None):
    out = []
    for i, m in enumerate(msgs):
      if i in sentinels:
        out.append({"role": "assistant", "content": sentinels[i]})
      else:
        out.append(template_message(m))
    if self._native is not None:
      try:
        return self._native(out, tools or None, add_generation_prompt, tools_key or None)
      except chatml.TemplateError as e:
        raise errors.ProxyError(f"The conversation cannot be rendered: {e}") from e
    try:
      return tokenization.render_chat_text(
          self.tokenizer, out, tools=tools or None, add_generation_prompt=add_generation_prompt,
          chat_template=self.chat_template)
    except errors.TokenizerError as e:
      raise errors.ProxyError(f"The conversation cannot be rendered: {e}") from e

  def _cut_prefill(self, text: str, last: Message) -> str:
    """Drops the template's end of the final assistant turn so the model continues it."""
    body = last.content.rstrip()
    at = text.rfind(body) if body else -1
    if at >= 0:
      return text[:at + len(body)]
    return text

  # -- outputs ----------------------------------------------------------------------------------
  def reply(self, request: RenderedRequest, completion: Completion, id_prefix: str) -> Reply:
    """Parses sampled ids into content and tool calls (fresh ids ``id_prefix<hex>``)."""
    ids = list(completion.token_ids)
    if ids and ids[-1] in self._stop_set and completion.finish_reason == "stop":
      ids = ids[:-1]
    text = self.tokenizer.decode(ids, skip_special_tokens=False)
    stop = completion.stop if isinstance(completion.stop, str) else None
    if stop is not None:
      at = text.find(stop)
      if at >= 0:
        text = text[:at]
    calls, bad = [], []
    if request.tools and request.tool_choice != "none":
      content, parsed, bad = tokenization.parse_tool_calls(text)
      for c in parsed:
        calls.append(self._wire_call(request, c, id_prefix))
    else:
      content = text.strip()
    finish = "tool_calls" if calls else completion.finish_reason
    return Reply(content=content, tool_calls=calls, finish_reason=finish,
                 prompt_tokens=completion.prompt_len, completion_tokens=len(completion.token_ids),
                 cached_tokens=completion.reused_prefix_len, stop=stop, unparsed=bad)

  @staticmethod
  def _wire_call(request: RenderedRequest, call: dict, id_prefix: str) -> ToolCall:
    spec = request.tool_specs.get(call["name"])
    args = call["arguments"]
    if spec is None:
      return ToolCall(id=new_id(id_prefix), name=call["name"], arguments=args)
    if spec.kind == "custom":
      raw = args.get("input") if isinstance(args, dict) and len(args) == 1 else None
      args = {"input": raw if isinstance(raw, str) else json.dumps(args, ensure_ascii=False)}
    return ToolCall(id=new_id(id_prefix), name=call["name"], arguments=args, kind=spec.kind,
                    namespace=spec.namespace)


def _locate(text: str, sentinels: Mapping[int, str]) -> dict[int, int]:
  """Positions of the sentinels found in message order (one forward scan of ``text``)."""
  out, cursor = {}, 0
  for i in sorted(sentinels):
    pos = text.find(sentinels[i], cursor)
    if pos >= 0:
      out[i] = pos
      cursor = pos + len(sentinels[i])
  return out


def template_message(m: Message) -> dict:
  """A neutral message as the chat template receives it (OpenAI-style dict)."""
  if m.role == "tool":
    return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
  out = {"role": m.role, "content": m.content}
  if m.role == "assistant" and m.tool_calls:
    out["tool_calls"] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in m.tool_calls]
  return out


def normalize_arguments(args):
  """Arguments compared by value: a JSON string and the dict it encodes are equal."""
  if isinstance(args, str):
    s = args.strip()
    if not s:
      return {}
    try:
      return safe_json.loads(s, what="tool-call arguments")
    except errors.InvalidJSONError:
      return s
  return args


def same_calls(echoed: Sequence[ToolCall], recorded: Sequence[ToolCall]) -> bool:
  """Whether a harness sent back the calls we generated. Harnesses may add defaulted
  arguments when they echo a call (Claude Code adds ``"replace_all": false`` to ``Edit``), so
  every recorded argument must come back unchanged but extra echoed keys are allowed; the
  recorded ids are what gets spliced, so the extras never reach the training tokens."""
  return len(echoed) == len(recorded) and all(
      x.id == y.id and x.name == y.name
      and _args_cover(normalize_arguments(x.arguments), normalize_arguments(y.arguments))
      for x, y in zip(echoed, recorded))


def _args_cover(echoed, recorded) -> bool:
  if isinstance(echoed, dict) and isinstance(recorded, dict):
    return all(k in echoed and echoed[k] == v for k, v in recorded.items())
  return echoed == recorded
