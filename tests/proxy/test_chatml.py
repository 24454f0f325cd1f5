"""The native ChatML renderer against the bundled template rendered by `transformers` (Jinja)."""

import json
import random

import pytest

from legorl_jax.models.chat_template import CHAT_TEMPLATE
from legorl_jax.models.tokenizer import render_chat_text
from legorl_jax.proxy import chatml

_WORDS = ["fix", " the", "\n", "  ", "test", "\u00e9t\u00e9", "{", "}", '"', "<tool_call>", "\t",
          "<|im_end|>", "x = 1\n", "\u4e2d\u6587", "</tool_response>", "", " ", "\\n", "0"]


def _text(rnd, n=6):
  return "".join(rnd.choice(_WORDS) for _ in range(rnd.randint(0, n)))


def _call(rnd, i):
  kind = rnd.randrange(5)
  args = ({"path": _text(rnd), "n": rnd.randint(0, 9), "ok": rnd.random() < .5}, "",
          "   ", json.dumps({"q": _text(rnd)}), {"nested": {"a": [1, "\u00e9"]}})[kind]
  return {"id": f"call_{i}", "type": "function",
          "function": {"name": rnd.choice(["read", "edit", "g\u00e9t"]), "arguments": args}}


def _conversation(rnd):
  msgs = []
  if rnd.random() < 0.7:
    msgs.append({"role": rnd.choice(["system", "developer"]), "content": _text(rnd, 12)})
  for i in range(rnd.randint(1, 9)):
    role = rnd.choice(["user", "assistant", "assistant", "tool", "tool", "system"])
    if role == "assistant":
      m = {"role": "assistant", "content": _text(rnd)}
      if rnd.random() < 0.6:
        m["tool_calls"] = [_call(rnd, f"{i}_{j}") for j in range(rnd.randint(1, 3))]
    elif role == "tool":
      m = {"role": "tool", "tool_call_id": f"call_{i}", "content": _text(rnd)}
    else:
      m = {"role": role, "content": _text(rnd)}
    msgs.append(m)
  return msgs


def _tools(rnd):
  if rnd.random() < 0.4:
    return None
  return [{"type": "function", "function": {
      "name": f"tool_{k}", "description": _text(rnd),
      "parameters": {"type": "object", "properties": {"p": {"type": "string",
                                                            "description": _text(rnd)}}}}}
          for k in range(rnd.randint(1, 3))]


def test_native_equals_jinja_on_random_conversations(tokenizer):
  assert tokenizer.chat_template == CHAT_TEMPLATE
  render = chatml.native_renderer(CHAT_TEMPLATE)
  rnd = random.Random(0)
  for trial in range(300):
    msgs, tools = _conversation(rnd), _tools(rnd)
    for gen in (True, False):
      ref = render_chat_text(tokenizer, msgs, tools=tools, add_generation_prompt=gen)
      key = f"k{trial}" if trial % 2 else None
      assert render(msgs, tools, gen, key) == ref, (trial, msgs, tools)


def test_tool_block_cache_is_keyed(tokenizer):
  render = chatml.ChatMLRenderer().render
  msgs = [{"role": "user", "content": "hi"}]
  a = [{"type": "function", "function": {"name": "a"}}]
  b = [{"type": "function", "function": {"name": "b"}}]
  assert render(msgs, a, True, "ka") == render_chat_text(tokenizer, msgs, tools=a)
  assert render(msgs, b, True, "kb") == render_chat_text(tokenizer, msgs, tools=b)
  assert render(msgs, a, True, "ka") == render_chat_text(tokenizer, msgs, tools=a)


def test_only_the_bundled_template_is_native():
  assert chatml.native_renderer(CHAT_TEMPLATE) is not None
  assert chatml.native_renderer(CHAT_TEMPLATE + " ") is None
  assert chatml.native_renderer(None) is None


def test_unknown_role_raises():
  with pytest.raises(chatml.TemplateError, match="Unknown message role"):
    chatml.ChatMLRenderer().render([{"role": "robot", "content": "x"}])
