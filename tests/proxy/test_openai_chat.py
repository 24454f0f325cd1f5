"""OpenAI Chat Completions through the official SDK (scripted policy: exact expected text)."""

import json

import openai
import pytest

from legorl_jax.models.tokenizer import render_chat
from tests.proxy.conftest import CHAT_TOOLS, http


def _client(server, handle=None):
  if handle is None:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="anything", max_retries=0)
  return openai.OpenAI(base_url=handle.openai_base_url, api_key=handle.token, max_retries=0)


@pytest.mark.parametrize("route", ["anonymous", "session"])
def test_tool_loop_non_streaming(scripted_server, tokenizer, route):
  h = scripted_server.create_session() if route == "session" else None
  client = _client(scripted_server, h)
  conv = [{"role": "system", "content": "You are an agent."},
          {"role": "user", "content": "Weather in Paris?"}]
  r = client.chat.completions.create(model="gpt-x", messages=conv, tools=CHAT_TOOLS,
                                     tool_choice="auto", reasoning_effort="high",
                                     prompt_cache_key="k", metadata={"a": "b"})
  assert r.model == "gpt-x" and r.object == "chat.completion"
  choice = r.choices[0]
  assert choice.finish_reason == "tool_calls" and choice.message.content is None
  call = choice.message.tool_calls[0]
  assert call.id.startswith("call_") and call.function.name == "get_weather"
  assert json.loads(call.function.arguments) == {"city": "Paris"}
  prompt = render_chat(tokenizer, conv, tools=CHAT_TOOLS)
  assert r.usage.prompt_tokens == len(prompt)
  conv.append(choice.message.model_dump(exclude_none=True))
  conv.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
  r = client.chat.completions.create(model="gpt-x", messages=conv, tools=CHAT_TOOLS,
                                     max_completion_tokens=100)
  assert r.choices[0].message.content == "The weather is sunny."
  assert r.choices[0].finish_reason == "stop"
  if h is not None:
    conv.append({"role": "assistant", "content": "The weather is sunny."})
    traj = scripted_server.sessions.get(h.session_id).trajectory()
    (seg,) = traj["segments"]
    # Scripted replies are canonical tokenizations: the recording IS the one-shot render
    # (up to the template's "\n" after the final turn).
    one_shot = render_chat(tokenizer, conv, tools=CHAT_TOOLS, add_generation_prompt=False)
    assert seg["token_ids"] == one_shot[:-1]
    assert sum(seg["loss_mask"]) == sum(len(c["token_ids"]) for c in traj["calls"])
    assert traj["calls"][1]["spliced_messages"] == 1


def _raw_events(url, token, body):
  status, text = http("POST", url, token, body)
  assert status == 200, text
  lines = [ln for ln in text.split("\n\n") if ln]
  assert all(ln.startswith("data: ") for ln in lines)
  assert lines[-1] == "data: [DONE]"
  return [json.loads(ln[6:]) for ln in lines[:-1]]


def test_streaming_tool_call_deltas_and_usage(scripted_server):
  h = scripted_server.create_session()
  body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
          "tools": CHAT_TOOLS, "messages": [{"role": "user", "content": "Weather?"}]}
  chunks = _raw_events(h.openai_base_url + "/chat/completions", h.token, body)
  assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
  deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
            if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
  assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "get_weather"
  assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"city": "Paris"}
  assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
  assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
  assert all("usage" in c for c in chunks)
  # Without include_usage there is no usage chunk.
  body["stream_options"] = None
  chunks = _raw_events(h.openai_base_url + "/chat/completions", h.token, body)
  assert all(c["choices"] for c in chunks)


def test_streaming_with_sdk_accumulates(scripted_server):
  client = _client(scripted_server, scripted_server.create_session())
  msgs = [{"role": "user", "content": "hi"}]
  with client.chat.completions.stream(model="m", messages=msgs) as stream:
    final = stream.get_final_completion()
  assert final.choices[0].message.content == "Hello from the scripted policy."
  with client.chat.completions.stream(model="m", messages=msgs, tools=CHAT_TOOLS) as stream:
    final = stream.get_final_completion()
  (call,) = final.choices[0].message.tool_calls
  assert call.function.name == "get_weather"


def test_n_greater_than_one_refused(scripted_server):
  client = _client(scripted_server)
  with pytest.raises(openai.BadRequestError) as e:
    client.chat.completions.create(model="m", n=2, messages=[{"role": "user", "content": "x"}])
  assert e.value.body["param"] == "n" and "n=1" in e.value.body["message"]


def test_schema_errors_in_openai_shape(scripted_server):
  client = _client(scripted_server)
  for kwargs in ({"messages": []}, {"messages": [{"role": "robot", "content": "x"}]},
                 {"messages": [{"role": "user", "content": "x"}], "temperature": 7},
                 {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}):
    with pytest.raises(openai.BadRequestError) as e:
      client.chat.completions.create(model="m", **kwargs)
    assert e.value.status_code == 400 and e.value.type == "invalid_request_error"


def test_stop_strings_cut_the_text(engine_server):
  """Seeded output A B C...: asking again (same seed) with stop=<a later piece> returns the text
  before it; the recorded ids are the first call's, cut after the token completing the stop."""
  h = engine_server.create_session()
  client = _client(engine_server, h)
  msgs = [{"role": "user", "content": "Say something."}]
  kw = dict(model="m", messages=msgs, temperature=1.0, seed=1234, max_tokens=24)
  full = client.chat.completions.create(**kw)
  text = full.choices[0].message.content
  stop = next(text[i:i + 3] for i in range(4, len(text) - 3) if text[i:i + 3].strip()
              and text.find(text[i:i + 3]) == i)
  r = client.chat.completions.create(stop=[stop], **kw)
  assert r.choices[0].finish_reason == "stop"
  assert r.choices[0].message.content == text[:text.find(stop)].strip()
  calls = engine_server.sessions.get(h.session_id).calls
  assert calls[1].finish_reason == "stop" and len(calls[1].token_ids) < len(calls[0].token_ids)
  assert calls[1].token_ids == calls[0].token_ids[:len(calls[1].token_ids)]
