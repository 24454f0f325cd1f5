"""Prompt rendering with splices, and output parsing."""

from legorl_jax.models.tokenizer import render_chat
from legorl_jax.proxy import ChatRenderer, Message, RenderedRequest
from legorl_jax.proxy.types import ToolSpec
from legorl_jax.sampling.params import Completion
from tests.proxy.conftest import CHAT_TOOLS


def _req(messages, tools=()):
  return RenderedRequest(api="chat", model="m", messages=messages, tools=list(tools),
                         tool_specs={t["function"]["name"]: ToolSpec(t["function"]["name"])
                                     for t in tools})


def test_splice_keeps_non_canonical_sampled_ids(tokenizer):
  """The sampler wrote "hello world" one character per token; the harness sends the text back.
  The prompt must hold those sampled ids, not the tokenizer's canonical encoding."""
  r = ChatRenderer(tokenizer)
  im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
  text = "hello world"
  sampled = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(ch))[0] for ch in text]
  sampled[5] = tokenizer.encode(" ", add_special_tokens=False)[0]
  assert tokenizer.decode(sampled) == text and sampled != tokenizer.encode(text)
  conv = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
  msgs = [Message(m["role"], m["content"]) for m in conv]
  ids = r.render(_req(msgs), {2: sampled + [im_end]})
  one_shot = render_chat(tokenizer, conv)
  canonical = tokenizer.encode(text, add_special_tokens=False)
  at = len(render_chat(tokenizer, conv[:2]))  # the assistant body starts here
  assert one_shot[at:at + len(canonical)] == canonical
  assert ids == one_shot[:at] + sampled + one_shot[at + len(canonical):]


def test_prefill_is_continued(tokenizer):
  r = ChatRenderer(tokenizer)
  msgs = [Message("user", "Write JSON."), Message("assistant", '{"a":')]
  ids = r.render(_req(msgs))
  expected = render_chat(tokenizer, [{"role": "user", "content": "Write JSON."}])
  expected += tokenizer.encode('{"a":', add_special_tokens=False)
  assert ids == expected


def _completion(tokenizer, text, finish="stop"):
  ids = tokenizer.encode(text, add_special_tokens=False)
  im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
  return Completion(token_ids=ids + ([im_end] if finish == "stop" else []),
                    logprobs=[0.0] * (len(ids) + 1), finish_reason=finish, prompt_len=10,
                    reused_prefix_len=4, params_version=0,
                    stop=im_end if finish == "stop" else None)


def test_reply_parsing(tokenizer):
  r = ChatRenderer(tokenizer)
  req = _req([Message("user", "x")], CHAT_TOOLS)
  text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>')
  reply = r.reply(req, _completion(tokenizer, text), "call_")
  assert reply.finish_reason == "tool_calls" and reply.cached_tokens == 4
  (call,) = reply.tool_calls
  assert call.name == "get_weather" and call.arguments == {"city": "Oslo"}
  assert call.id.startswith("call_") and len(call.id) == 29
  # The malformed call is returned as text, never dropped.
  assert reply.content.startswith("Let me check.") and '"arguments": [1]' in reply.content
  assert len(reply.unparsed) == 1
  # tool_choice "none": no parsing at all.
  req.tool_choice = "none"
  reply = r.reply(req, _completion(tokenizer, text, "length"), "call_")
  assert reply.tool_calls == [] and reply.content == text and reply.finish_reason == "length"


def test_empty_trailing_assistant_turn_is_dropped(tokenizer):
  r = ChatRenderer(tokenizer)
  ids = r.render(_req([Message("user", "hi"), Message("assistant", "")]))
  assert ids == render_chat(tokenizer, [{"role": "user", "content": "hi"}])
