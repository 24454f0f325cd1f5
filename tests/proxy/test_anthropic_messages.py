"""Anthropic Messages through the official SDK (scripted policy)."""

import json

import anthropic
import pytest

from legorl_jax.models.tokenizer import render_chat
from tests.proxy.conftest import ANTHROPIC_TOOLS, CHAT_TOOLS, http

SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
          {"type": "text", "text": " Be terse."}]


def _client(server, handle=None):
  if handle is None:
    return anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
  return anthropic.Anthropic(base_url=handle.base_url, api_key=handle.token, max_retries=0)


@pytest.mark.parametrize("route", ["anonymous", "session"])
def test_tool_loop(scripted_server, tokenizer, route):
  h = scripted_server.create_session() if route == "session" else None
  client = _client(scripted_server, h)
  msgs = [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
  kw = dict(model="claude-sonnet-4-5", max_tokens=200, system=SYSTEM, tools=ANTHROPIC_TOOLS,
            metadata={"user_id": "u"}, thinking={"type": "disabled"},
            extra_body={"context_management": {"edits": []}},
            extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
  m = client.messages.create(messages=msgs, **kw)
  assert m.type == "message" and m.role == "assistant" and m.stop_reason == "tool_use"
  (use,) = m.content
  assert use.type == "tool_use" and use.id.startswith("toolu_") and use.input == {"city": "Paris"}
  msgs.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
  msgs.append({"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]})
  with client.messages.stream(messages=msgs, **kw) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
  assert text == "The weather is sunny." and final.stop_reason == "end_turn"
  assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
  if h is not None:
    conv = [{"role": "system", "content": "You are Claude Code. Be terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": use.id, "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "sunny"},
            {"role": "assistant", "content": text}]
    (seg,) = scripted_server.sessions.get(h.session_id).trajectory()["segments"]
    assert seg["token_ids"] == render_chat(tokenizer, conv, tools=CHAT_TOOLS,
                                           add_generation_prompt=False)[:-1]


def test_beta_route_and_raw_event_sequence(scripted_server):
  h = scripted_server.create_session()
  body = {"model": "c", "max_tokens": 100, "stream": True, "tools": ANTHROPIC_TOOLS,
          "messages": [{"role": "user", "content": "Weather?"}]}
  status, text = http("POST", h.base_url + "/v1/messages?beta=true", h.token, body,
                      headers={"anthropic-version": "2023-06-01"})
  assert status == 200, text
  events = []
  for block in text.strip().split("\n\n"):
    ev, data = block.split("\n")
    assert ev.startswith("event: ") and data.startswith("data: ")
    payload = json.loads(data[6:])
    assert payload["type"] == ev[7:]
    events.append(payload)
  assert [e["type"] for e in events] == [
      "message_start", "content_block_start", "content_block_delta", "content_block_stop",
      "message_delta", "message_stop"]
  assert events[1]["content_block"]["type"] == "tool_use"
  assert events[2]["delta"]["type"] == "input_json_delta"
  assert json.loads(events[2]["delta"]["partial_json"]) == {"city": "Paris"}
  assert events[4]["delta"]["stop_reason"] == "tool_use" and events[4]["usage"]["output_tokens"]


def test_system_role_inside_messages_and_count_tokens(scripted_server, tokenizer):
  client = _client(scripted_server)
  msgs = [{"role": "user", "content": "hi"}, {"role": "system", "content": "Reminder."},
          {"role": "user", "content": "again"}]
  n = client.messages.count_tokens(model="c", messages=msgs, system="Top.")
  conv = [{"role": "system", "content": "Top."}, {"role": "user", "content": "hi"},
          {"role": "system", "content": "Reminder."}, {"role": "user", "content": "again"}]
  assert n.input_tokens == len(render_chat(tokenizer, conv))
  m = client.messages.create(model="c", max_tokens=50, messages=msgs, system="Top.")
  assert m.content[0].text == "Hello from the scripted policy."
  assert m.usage.input_tokens == n.input_tokens


def test_max_tokens_stop_reason(scripted_server):
  m = _client(scripted_server).messages.create(
      model="c", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
  assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2


def test_errors_in_anthropic_shape(scripted_server):
  client = _client(scripted_server)
  with pytest.raises(anthropic.BadRequestError) as e:
    client.messages.create(model="c", max_tokens=5, messages=[{"role": "robot", "content": "x"}])
  assert e.value.body == {"type": "error", "error": {
      "type": "invalid_request_error", "message": e.value.body["error"]["message"]}}
  status, body = http("POST", scripted_server.url + "/v1/messages", None,
                      {"model": "c", "messages": [{"role": "user", "content": "x"}]})
  assert status == 400 and body["type"] == "error" and "max_tokens" in body["error"]["message"]
