"""Prompt rendering with splices, and output parsing."""

import asyncio

import pytest

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


def _wire_turns(api, tools):
  """(first body, add(body, response) -> next body) for a tool loop on one wire API."""
  if api == "chat":
    body = {"model": "m", "tools": tools, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]}

    def add(b, resp):
      msg = resp["choices"][0]["message"]
      out = [dict(msg)]
      for c in msg.get("tool_calls") or ():
        out.append({"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"})
      if not msg.get("tool_calls"):
        out.append({"role": "user", "content": "And tomorrow?"})
      return dict(b, messages=b["messages"] + out)
  elif api == "messages":
    body = {"model": "m", "max_tokens": 64, "system": "Be brief.", "tools": tools,
            "messages": [{"role": "user", "content": "Weather?"}]}

    def add(b, resp):
      results = [{"type": "tool_result", "tool_use_id": blk["id"], "content": "sunny, 21 C"}
                 for blk in resp["content"] if blk["type"] == "tool_use"]
      nxt = {"role": "user", "content": results or "And tomorrow?"}
      return dict(b, messages=b["messages"] + [
          {"role": "assistant", "content": resp["content"]}, nxt])
  else:
    body = {"model": "m", "instructions": "Be brief.", "tools": tools,
            "input": [{"type": "message", "role": "user", "content": "Weather?"}]}

    def add(b, resp):
      items = [dict(it) for it in resp["output"]]
      for it in resp["output"]:
        if it["type"] == "function_call":
          items.append({"type": "function_call_output", "call_id": it["call_id"],
                        "output": "sunny, 21 C"})
      if not any(it["type"] == "function_call" for it in resp["output"]):
        items.append({"type": "message", "role": "user", "content": "And tomorrow?"})
      return dict(b, input=b["input"] + items)
  return body, add


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_incremental_render_equals_one_shot(tokenizer, api):
  """Through the service (native template, piece cache, splices), every call's prompt equals
  `transformers`' one-shot render + tokenization of the same conversation, and the reference
  renderer's (Jinja, no cache)."""
  from legorl_jax.models.tokenizer import render_chat
  from legorl_jax.proxy import (ProxyConfig, ProxyService, ScriptedBackend, anthropic_messages,
                                openai_chat, openai_responses)
  from legorl_jax.proxy.render import template_message
  from tests.proxy.conftest import ANTHROPIC_TOOLS, RESPONSES_TOOLS, scripted_reply
  fmt = {"chat": openai_chat, "messages": anthropic_messages, "responses": openai_responses}[api]
  tools = {"chat": CHAT_TOOLS, "messages": ANTHROPIC_TOOLS, "responses": RESPONSES_TOOLS}[api]
  service = ProxyService(ScriptedBackend(tokenizer, scripted_reply, max_len=4096), tokenizer,
                         ProxyConfig())
  assert service.renderer._native is not None
  reference = ChatRenderer(tokenizer, native=False, cache_chars=0)
  session = service.sessions.create("s", None)
  body, add = _wire_turns(api, tools)
  for _ in range(5):
    req = fmt.parse(body)
    reply = asyncio.run(service.complete(req, session))
    conv = [template_message(m) for m in req.messages]
    assert req.prompt_ids == render_chat(tokenizer, conv, tools=req.tools or None)
    splices, _ = session.match_assistants(req.messages)
    assert reference.render(req, splices) == req.prompt_ids
    body = add(body, fmt.response(req, reply))
  traj = session.trajectory()
  assert len(traj["segments"]) == 1 and len(traj["calls"]) == 5
  assert [c["spliced_messages"] for c in traj["calls"]] == [0, 1, 2, 3, 4]
  assert service.renderer.pieces.hits > 0


def test_tool_key_order_is_rendered_as_sent(tokenizer):
  """The rendered tool block is cached by the tool set's digest: two key orders of the same
  schema are two different prompts, each equal to its one-shot render."""
  r = ChatRenderer(tokenizer)
  fn = CHAT_TOOLS[0]["function"]
  reordered = [{"type": "function", "function": {k: fn[k] for k in reversed(list(fn))}}]
  msgs = [Message("user", "Weather?")]
  conv = [{"role": "user", "content": "Weather?"}]
  for tools in (CHAT_TOOLS, reordered, CHAT_TOOLS):
    assert r.render(_req(msgs, tools)) == render_chat(tokenizer, conv, tools=tools)
  assert render_chat(tokenizer, conv, tools=CHAT_TOOLS) != render_chat(tokenizer, conv,
                                                                      tools=reordered)
