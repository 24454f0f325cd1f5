"""Invariants 1 and 2 through the real engine and the official SDKs.

For a multi-turn tool loop on each API (the harness sends back the assistant message its SDK
returned, adds a tool result or a user turn, calls again), the recording must be one segment
whose sampled tokens, re-scored by a teacher-forced forward of the same parameters, give the
recorded logprobs (|delta| < 1e-5, and the argmax under greedy sampling), and whose prompt
tokens equal a one-shot chat-template render of the final conversation outside the assistant
bodies.
"""

import anthropic
import openai
import pytest

from legorl_jax.models.tokenizer import render_chat
from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer
from tests.proxy.conftest import (ANTHROPIC_TOOLS, CHAT_TOOLS, FORCE_TOOL, RESPONSES_TOOLS,
                                  check_segment_logprobs, http)

SYSTEM = "You are a careful agent. Use tools when useful."


def _trajectory(handle):
  status, body = http("GET", f"{handle.base_url}/trajectory", handle.token)
  assert status == 200, body
  return body


def _strip_bodies(ids, mask, tokenizer):
  """Splits a sequence into (non-assistant tokens, bodies).

  With a mask: bodies are the mask-1 runs, plus a following mask-0 ``<|im_end|>`` (the
  template closing a turn that ended by length). Without: bodies run from after each
  ``<|im_start|>assistant\\n`` header through ``<|im_end|>``.
  """
  im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
  header = tokenizer.encode("assistant\n", add_special_tokens=False)
  keep, bodies, i = [], [], 0
  while i < len(ids):
    if mask is not None and mask[i] == 1:
      j = i
      while j < len(ids) and mask[j] == 1:
        j += 1
      if j < len(ids) and ids[j] == im_end and ids[j - 1] != im_end:
        j += 1
      bodies.append(ids[i:j])
      i = j
    elif mask is None and ids[i] == im_start and ids[i + 1:i + 1 + len(header)] == header:
      keep.extend(ids[i:i + 1 + len(header)])
      s = i + 1 + len(header)
      e = ids.index(im_end, s) + 1 if im_end in ids[s:] else len(ids)
      bodies.append(ids[s:e])
      i = e
    else:
      keep.append(ids[i])
      i += 1
  return keep, bodies


def _check_one_shot(segment, conversation, tools, tokenizer):
  one_shot = render_chat(tokenizer, conversation, tools=tools, add_generation_prompt=False)
  keep_seg, bodies_seg = _strip_bodies(segment["token_ids"], segment["loss_mask"], tokenizer)
  keep_ref, bodies_ref = _strip_bodies(one_shot, None, tokenizer)
  assert len(bodies_seg) == len(bodies_ref)
  # The recording stops at the last sampled token; the one-shot render closes the final turn.
  assert keep_seg == keep_ref[:len(keep_seg)]
  assert keep_ref[len(keep_seg):] == tokenizer.encode("\n", add_special_tokens=False)


def _check_recording(traj, model, tokenizer, conversation, tools, temperature, scripted_calls):
  assert len(traj["segments"]) == 1, [c["new_segment"] for c in traj["calls"]]
  seg = traj["segments"][0]
  assert seg["reason"] == "first_call" and seg["stream"] == "main" and seg["train"]
  assert [c["new_segment"] for c in traj["calls"]][1:] == [None] * (len(traj["calls"]) - 1)
  assert all(c["temperature"] == temperature for c in traj["calls"])
  assert sum(seg["loss_mask"]) == sum(len(c["token_ids"]) for c in traj["calls"])
  for c in traj["calls"]:  # each call's sampled ids sit at its offset, mask 1
    o = c["sample_offset"]
    assert seg["token_ids"][o:o + len(c["token_ids"])] == c["token_ids"]
    assert seg["logprobs"][o:o + len(c["token_ids"])] == c["logprobs"]
    assert set(seg["loss_mask"][o:o + len(c["token_ids"])]) == {1}
    assert seg["token_ids"][:len(c["prompt_ids"])] == c["prompt_ids"]
  checked = check_segment_logprobs(model, seg, temperature, scripted_calls, traj["calls"])
  assert checked >= 20
  _check_one_shot(seg, conversation, tools, tokenizer)


@pytest.mark.slow
def test_chat_tool_loop(engine_server, model, tokenizer):
  h = engine_server.create_session()
  client = openai.OpenAI(base_url=h.openai_base_url, api_key=h.token, max_retries=0)
  conv = [{"role": "system", "content": SYSTEM},
          {"role": "user", "content": f"Weather in Paris? {FORCE_TOOL}"}]
  kw = dict(model="policy", tools=CHAT_TOOLS, temperature=0, max_tokens=12)
  r = client.chat.completions.create(messages=conv, **dict(kw, max_tokens=32))
  call = r.choices[0].message.tool_calls[0]
  assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
  conv.append(r.choices[0].message.model_dump(exclude_none=True))
  conv.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
  # Sampled turn, streamed: rebuild the assistant message from the deltas as a harness does.
  text, finish = "", None
  for chunk in client.chat.completions.create(messages=conv, stream=True,
                                              stream_options={"include_usage": True}, **kw):
    if chunk.choices:
      text += chunk.choices[0].delta.content or ""
      finish = chunk.choices[0].finish_reason or finish
  assert finish in ("stop", "length")
  conv.append({"role": "assistant", "content": text})
  conv.append({"role": "user", "content": "Thanks. And tomorrow?"})
  r = client.chat.completions.create(messages=conv, **kw)
  conv.append({"role": "assistant", "content": r.choices[0].message.content})
  traj = _trajectory(h)
  assert len(traj["calls"]) == 3 and traj["calls"][2]["spliced_messages"] == 2
  _check_recording(traj, model, tokenizer, conv, CHAT_TOOLS, 0.0, scripted_calls=[0])


@pytest.mark.slow
def test_responses_tool_loop(engine_server, model, tokenizer):
  h = engine_server.create_session()
  client = openai.OpenAI(base_url=h.openai_base_url, api_key=h.token, max_retries=0)
  items = [{"role": "developer", "content": "Be brief."},
           {"role": "user", "content": f"Weather in Paris? {FORCE_TOOL}"}]
  kw = dict(model="policy", instructions=SYSTEM, tools=RESPONSES_TOOLS, temperature=0,
            max_output_tokens=12, store=False)
  with client.responses.stream(input=items, **dict(kw, max_output_tokens=32)) as stream:
    r = stream.get_final_response()
  fc = [o for o in r.output if o.type == "function_call"][0]
  assert fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.id.startswith("fc_")
  items += [o.model_dump(exclude_none=True) for o in r.output]
  items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"})
  r = client.responses.create(input=items, **kw)
  assert r.output[0].type == "message"
  items += [o.model_dump(exclude_none=True) for o in r.output]
  items.append({"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]})
  events = list(client.responses.create(input=items, stream=True, **kw))
  assert events[-1].type in ("response.completed", "response.incomplete")  # incomplete: length
  final = events[-1].response
  conv = [{"role": "system", "content": SYSTEM}, {"role": "system", "content": "Be brief."},
          {"role": "user", "content": f"Weather in Paris? {FORCE_TOOL}"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"id": fc.call_id, "type": "function",
               "function": {"name": "get_weather", "arguments": fc.arguments}}]},
          {"role": "tool", "tool_call_id": fc.call_id, "content": "sunny"},
          {"role": "assistant", "content": r.output_text},
          {"role": "user", "content": "And tomorrow?"},
          {"role": "assistant", "content": final.output_text}]
  traj = _trajectory(h)
  _check_recording(traj, model, tokenizer, conv, CHAT_TOOLS, 0.0, scripted_calls=[0])


@pytest.mark.slow
def test_anthropic_tool_loop_sampled(engine_server, model, tokenizer):
  """Temperature 0.7: logprobs follow log_softmax(logits / 0.7)."""
  h = engine_server.create_session()
  client = anthropic.Anthropic(base_url=h.base_url, api_key=h.token, max_retries=0)
  msgs = [{"role": "user", "content": f"Weather in Paris? {FORCE_TOOL}"}]
  kw = dict(model="claude-policy", max_tokens=12, extra_body={"temperature": 0.7},
            tools=ANTHROPIC_TOOLS,
            system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}])
  m = client.messages.create(messages=msgs, **dict(kw, max_tokens=32))
  use = [b for b in m.content if b.type == "tool_use"][0]
  assert m.stop_reason == "tool_use" and use.input == {"city": "Paris"}
  msgs.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
  msgs.append({"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "rain"}]},
      {"type": "text", "text": "Summarise."}]})
  with client.messages.stream(messages=msgs, **kw) as stream:
    m2 = stream.get_final_message()
  msgs.append({"role": "assistant", "content": [b.model_dump() for b in m2.content]})
  msgs.append({"role": "user", "content": "Once more."})
  m3 = client.messages.create(messages=msgs, **kw)
  text2 = "".join(b.text for b in m2.content if b.type == "text")
  conv = [{"role": "system", "content": SYSTEM},
          {"role": "user", "content": f"Weather in Paris? {FORCE_TOOL}"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"id": use.id, "type": "function",
               "function": {"name": "get_weather", "arguments": use.input}}]},
          {"role": "tool", "tool_call_id": use.id, "content": "rain"},
          {"role": "user", "content": "Summarise."},
          {"role": "assistant", "content": text2},
          {"role": "user", "content": "Once more."},
          {"role": "assistant", "content": "".join(b.text for b in m3.content)}]
  traj = _trajectory(h)
  _check_recording(traj, model, tokenizer, conv, CHAT_TOOLS, 0.7, scripted_calls=[0])


@pytest.mark.slow
def test_force_temperature_is_used_and_recorded(engine, model, tokenizer):
  """A trainer forces its temperature whatever the harness asks; logprobs follow it."""
  server = ProxyServer(EngineBackend(engine), tokenizer,
                       ProxyConfig(force_temperature=0.5, max_tokens_cap=10)).start()
  try:
    h = server.create_session()
    client = openai.OpenAI(base_url=h.openai_base_url, api_key=h.token, max_retries=0)
    conv = [{"role": "user", "content": "Write a poem."}]
    r = client.chat.completions.create(model="p", messages=conv, temperature=1.9, max_tokens=64)
    assert r.usage.completion_tokens == 10  # capped
    traj = server.sessions.get(h.session_id).trajectory()
    assert traj["calls"][0]["temperature"] == 0.5 and traj["calls"][0]["max_tokens"] == 10
    assert check_segment_logprobs(model, traj["segments"][0], 0.5) == 10
  finally:
    server.stop()


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_prompt_longer_than_context_is_refused(engine_server, api):
  h = engine_server.create_session()
  huge = "word " * 3000
  if api == "chat":
    client = openai.OpenAI(base_url=h.openai_base_url, api_key=h.token, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
      client.chat.completions.create(model="p", messages=[{"role": "user", "content": huge}])
    assert e.value.code == "context_length_exceeded"
  else:
    client = anthropic.Anthropic(base_url=h.base_url, api_key=h.token, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
      client.messages.create(model="p", max_tokens=5, messages=[{"role": "user", "content": huge}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in e.value.body["error"]["message"]


def test_max_tokens_clamped_to_context(engine_server, tokenizer):
  """A prompt that fits leaves room for fewer tokens than asked: max_tokens is clamped."""
  h = engine_server.create_session()
  client = openai.OpenAI(base_url=h.openai_base_url, api_key=h.token, max_retries=0)
  n = len(tokenizer.encode("word " * 1010))
  text = "word " * (1010 - (n - 1010) - 12)
  r = client.chat.completions.create(model="p", messages=[{"role": "user", "content": text}],
                                     max_tokens=500, temperature=0)
  assert r.usage.prompt_tokens + r.usage.completion_tokens <= 1024
  assert r.choices[0].finish_reason == "length"
