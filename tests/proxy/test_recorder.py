"""Segments, streams and splicing, driven through ProxyService with a scripted policy."""

import asyncio
import copy

import pytest

from legorl_jax import errors
from legorl_jax.models.tokenizer import render_chat
from legorl_jax.proxy import ProxyConfig, ProxyService, ScriptedBackend, openai_chat
from tests.proxy.conftest import CHAT_TOOLS, WEATHER_CALL, scripted_reply


@pytest.fixture
def service(tokenizer):
  return ProxyService(ScriptedBackend(tokenizer, scripted_reply, max_len=1024), tokenizer)


def _call(service, session, messages, tools=CHAT_TOOLS, **kw):
  req = openai_chat.parse(dict({"model": "m", "messages": messages, "tools": tools}, **kw))
  reply = asyncio.run(service.complete(req, session))
  msg = {"role": "assistant", "content": reply.content}
  if reply.tool_calls:
    msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
        "name": c.name, "arguments": c.arguments_json}} for c in reply.tool_calls]
  return reply, msg


def _loop(service, session, system="You are an agent."):
  conv = [{"role": "system", "content": system}, {"role": "user", "content": "Weather?"}]
  reply, msg = _call(service, session, conv)
  conv += [msg, {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "sunny"}]
  _, msg = _call(service, session, conv)
  conv.append(msg)
  return conv


def test_loop_is_one_segment_equal_to_one_shot_render(service, tokenizer):
  s = service.sessions.create("a")
  conv = _loop(service, s)
  (seg,) = s.segments()
  assert seg.token_ids == render_chat(tokenizer, conv, tools=CHAT_TOOLS,
                                      add_generation_prompt=False)[:-1]
  calls = s.calls
  for c in calls:  # mask 1 exactly on sampled ids
    o = c.sample_offset
    assert seg.loss_mask[o:o + len(c.token_ids)] == [1] * len(c.token_ids)
  assert sum(seg.loss_mask) == sum(len(c.token_ids) for c in calls)
  assert calls[1].new_segment is None and calls[1].spliced_messages == 1


@pytest.mark.parametrize("edit,reason", [
    ("user_edited", "history_rewritten"), ("compacted", "compacted"),
    ("regenerate", "regenerated"), ("assistant_edited", "assistant_unmatched"),
    ("system_changed", "system_changed")])
def test_rewritten_history_starts_a_new_segment(service, edit, reason):
  s = service.sessions.create("b")
  conv = _loop(service, s)
  conv = copy.deepcopy(conv)
  if edit == "user_edited":
    conv[1]["content"] = "Weather in Rome?"  # e.g. an injected reminder
    conv.append({"role": "user", "content": "thanks"})
  elif edit == "compacted":
    conv = [conv[0], {"role": "user", "content": "Summary: it is sunny. Continue."}]
  elif edit == "regenerate":
    conv = conv[:4]
  elif edit == "assistant_edited":
    conv[-1]["content"] = "The weather is probably sunny."
    conv.append({"role": "user", "content": "thanks"})
  else:
    conv[0]["content"] = "You are an agent. Today is Monday."
    conv.append({"role": "user", "content": "thanks"})
  _call(service, s, conv)
  segs = s.segments()
  assert len(segs) == 2 and segs[1].reason == reason and segs[1].stream == "main"
  assert s.calls[-1].new_segment == reason
  assert segs[1].loss_mask[:len(s.calls[-1].prompt_ids)] == [0] * len(s.calls[-1].prompt_ids)


def test_length_finished_turn_is_closed_with_masked_template_tokens(tokenizer):
  service = ProxyService(ScriptedBackend(tokenizer, lambda r: "one two three four five six",
                                         max_len=1024), tokenizer)
  s = service.sessions.create("c")
  conv = [{"role": "user", "content": "count"}]
  reply, msg = _call(service, s, conv, tools=None, max_tokens=3)
  assert reply.finish_reason == "length"
  conv += [msg, {"role": "user", "content": "go on"}]
  _call(service, s, conv, tools=None, max_tokens=3)
  (seg,) = s.segments()
  first = s.calls[0]
  end = first.sample_offset + len(first.token_ids)
  im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
  assert seg.token_ids[end] == im_end and seg.loss_mask[end] == 0  # added by the template


def test_side_streams_are_excluded_from_training(service):
  s = service.sessions.create("d")
  title = [{"role": "system", "content": "You are a title generator. Output only a title."},
           {"role": "user", "content": "Weather?"}]
  _call(service, s, title, tools=None)  # before the main loop starts
  _loop(service, s)
  summary = [{"role": "system", "content": "Summarize the conversation so far."},
             {"role": "user", "content": "..."}]
  _call(service, s, summary, tools=None)
  sub = [{"role": "system", "content": "You are a search sub-agent."},
         {"role": "user", "content": "find files"}]
  other_tools = [dict(CHAT_TOOLS[0], function=dict(CHAT_TOOLS[0]["function"], name="grep"))]
  _call(service, s, sub, tools=other_tools)
  req = openai_chat.parse({"model": "m", "messages": sub}, {"x-legorl-stream": "judge"})
  asyncio.run(service.complete(req, s))
  traj = s.trajectory()
  assert [x["stream"] for x in traj["segments"]] == ["main"]
  side = {x["stream"] for x in traj["side_segments"]}
  assert side == {"title", "summary", "judge"} | {x for x in side if x.startswith("subagent-")}
  assert len(side) == 4 and not any(x["train"] for x in traj["side_segments"])


def test_parallel_subagents_each_continue_their_segment(service):
  s = service.sessions.create("e")
  _loop(service, s)
  sub_tools = [dict(CHAT_TOOLS[0], function=dict(CHAT_TOOLS[0]["function"], name="grep"))]
  convs = [[{"role": "system", "content": "Sub-agent."}, {"role": "user", "content": f"task {i}"}]
           for i in range(2)]
  for _ in range(2):  # interleaved turns of two sub-agents with the same prompt and tools
    for conv in convs:
      _, msg = _call(service, s, conv, tools=sub_tools)
      conv += [msg, {"role": "user", "content": "next"}]
  subs = [seg for seg in s.segments(train_only=False) if seg.stream.startswith("subagent-")]
  assert len(subs) == 2 and all(len(seg.calls) == 2 for seg in subs)


def test_train_streams_config_opts_side_streams_in(tokenizer):
  service = ProxyService(ScriptedBackend(tokenizer, scripted_reply, max_len=1024), tokenizer,
                         ProxyConfig(train_streams=("main", "title")))
  s = service.sessions.create("f")
  _call(service, s, [{"role": "system", "content": "Generate a title."},
                     {"role": "user", "content": "x"}], tools=None)
  assert [x["stream"] for x in s.trajectory()["segments"]] == ["title"]


def test_tool_call_matched_by_id_even_if_harness_reformats_arguments(service, tokenizer):
  """Clients re-serialise arguments (spacing, key order); ids still map to the sampled ids."""
  s = service.sessions.create("g")
  conv = [{"role": "user", "content": "Weather?"}]
  reply, msg = _call(service, s, conv)
  msg["tool_calls"][0]["function"]["arguments"] = '{"city":"Paris"}'
  conv += [msg, {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "sunny"}]
  _call(service, s, conv)
  assert len(s.segments()) == 1
  sampled = s.calls[0].token_ids
  assert tokenizer.decode(sampled, skip_special_tokens=False) == WEATHER_CALL + "<|im_end|>"


def test_a_taken_trajectory_does_not_change_with_later_calls(service):
  s = service.sessions.create("alias")
  conv = _loop(service, s)
  taken = s.trajectory()
  frozen = copy.deepcopy(taken)
  _call(service, s, conv + [{"role": "user", "content": "And tomorrow?"}])
  assert len(s.trajectory()["calls"]) == len(frozen["calls"]) + 1
  assert taken == frozen  # no list of the taken dict is the live segment's


def test_a_call_that_finishes_after_the_trial_ended_is_refused_and_not_recorded(service):
  s = service.sessions.create("late")
  conv = _loop(service, s)
  assert service.sessions.pop("late") is s  # what a trial does when it collects its trajectory
  final = copy.deepcopy(s.trajectory())
  with pytest.raises(errors.ProxyError, match="has ended") as e:
    _call(service, s, conv + [{"role": "user", "content": "And tomorrow?"}])
  assert e.value.status == 409 and e.value.code == "session_closed"
  assert s.trajectory() == final
