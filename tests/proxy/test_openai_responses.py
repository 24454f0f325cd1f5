"""OpenAI Responses (Codex's API) through the official SDK (scripted policy)."""

import json

import openai
import pytest

from legorl_jax.models.tokenizer import render_chat
from legorl_jax.proxy import ProxyServer, ScriptedBackend
from tests.proxy.conftest import CHAT_TOOLS, RESPONSES_TOOLS, http


def _client(server, handle=None):
  if handle is None:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
  return openai.OpenAI(base_url=handle.openai_base_url, api_key=handle.token, max_retries=0)


@pytest.mark.parametrize("route", ["anonymous", "session"])
def test_tool_loop_streaming(scripted_server, tokenizer, route):
  h = scripted_server.create_session() if route == "session" else None
  client = _client(scripted_server, h)
  items = [{"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": "Sandbox: workspace-write."}]},
           {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
  kw = dict(model="gpt-5-codex", instructions="You are Codex.", tools=RESPONSES_TOOLS,
            tool_choice="auto", parallel_tool_calls=False, store=False,
            include=["reasoning.encrypted_content"], reasoning={"effort": "low"},
            prompt_cache_key="abc")
  with client.responses.stream(input=items, **kw) as stream:
    r = stream.get_final_response()
  assert r.status == "completed" and r.usage.output_tokens > 0
  (fc,) = r.output
  assert fc.type == "function_call" and json.loads(fc.arguments) == {"city": "Paris"}
  # Codex sends back reasoning items too; they carry no prompt text.
  items += [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"}]
  items += [o.model_dump(exclude_none=True) for o in r.output]
  items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"})
  with client.responses.stream(input=items, **kw) as stream:
    r2 = stream.get_final_response()
  assert r2.output_text == "The weather is sunny."
  if h is not None:
    conv = [{"role": "system", "content": "You are Codex."},
            {"role": "system", "content": "Sandbox: workspace-write."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": fc.call_id, "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": fc.call_id, "content": "sunny"},
            {"role": "assistant", "content": "The weather is sunny."}]
    (seg,) = scripted_server.sessions.get(h.session_id).trajectory()["segments"]
    assert seg["token_ids"] == render_chat(tokenizer, conv, tools=CHAT_TOOLS,
                                           add_generation_prompt=False)[:-1]


def test_raw_event_sequence(scripted_server):
  body = {"model": "m", "stream": True, "tools": RESPONSES_TOOLS, "input": "Weather?"}
  status, text = http("POST", scripted_server.url + "/v1/responses", None, body)
  assert status == 200
  events = []
  for block in text.strip().split("\n\n"):
    ev, data = block.split("\n")
    payload = json.loads(data[6:])
    assert payload["type"] == ev[7:]
    events.append(payload)
  assert [e["type"] for e in events] == [
      "response.created", "response.in_progress", "response.output_item.added",
      "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"]
  assert [e["sequence_number"] for e in events] == list(range(len(events)))
  done = events[-1]["response"]
  assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + \
      done["usage"]["output_tokens"]
  assert done["output"][0]["call_id"] == events[2]["item"]["call_id"]
  # A text answer: content part and output_text events.
  status, text = http("POST", scripted_server.url + "/v1/responses", None,
                      {"model": "m", "stream": True, "input": "hi"})
  kinds = [json.loads(b.split("\n")[1][6:])["type"] for b in text.strip().split("\n\n")]
  assert kinds[2:8] == ["response.output_item.added", "response.content_part.added",
                        "response.output_text.delta", "response.output_text.done",
                        "response.content_part.done", "response.output_item.done"]


def test_namespace_and_custom_tools(tokenizer):
  """Namespaced functions render as ``ns.name`` and come back with their namespace; custom
  (free-form) tools take a string input."""
  replies = iter([
      '<tool_call>\n{"name": "crm.lookup", "arguments": {"q": "acme"}}\n</tool_call>',
      '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}\n'
      '</tool_call>', "ok"])
  seen = []

  def reply(req):
    seen.append(req)
    return next(replies)

  server = ProxyServer(ScriptedBackend(tokenizer, reply, max_len=1024), tokenizer).start()
  try:
    h = server.create_session()
    client = _client(server, h)
    tools = [{"type": "namespace", "name": "crm", "description": "Customer records.",
              "tools": [{"type": "function", "name": "lookup", "parameters": {
                  "type": "object", "properties": {"q": {"type": "string"}}}}]},
             {"type": "custom", "name": "apply_patch", "description": "Patch files.",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
             {"type": "web_search"}]
    r = client.responses.create(model="m", input="find acme", tools=tools)
    (fc,) = r.output
    assert fc.type == "function_call" and fc.name == "lookup" and fc.namespace == "crm"
    assert [t["function"]["name"] for t in seen[0].tools] == ["crm.lookup", "apply_patch"]
    items = [{"role": "user", "content": "find acme"}]
    items += [fc.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": fc.call_id, "output": "found"}]
    r = client.responses.create(model="m", input=items, tools=tools)
    (ct,) = r.output
    assert ct.type == "custom_tool_call" and ct.input == "*** Begin Patch"
    items += [ct.model_dump(exclude_none=True),
              {"type": "custom_tool_call_output", "call_id": ct.call_id, "output": "done"}]
    r = client.responses.create(model="m", input=items, tools=tools)
    assert r.output_text == "ok"
    traj = server.sessions.get(h.session_id).trajectory()
    assert len(traj["segments"]) == 1 and traj["calls"][2]["spliced_messages"] == 2
  finally:
    server.stop()


def test_previous_response_id(scripted_server):
  client = _client(scripted_server)
  r1 = client.responses.create(model="m", input="Weather?", tools=RESPONSES_TOOLS)
  (fc,) = r1.output
  r2 = client.responses.create(
      model="m", previous_response_id=r1.id, tools=RESPONSES_TOOLS,
      input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "cold"}])
  assert r2.output_text == "The weather is cold."
  with pytest.raises(openai.BadRequestError) as e:
    client.responses.create(model="m", previous_response_id="resp_nope", input="x")
  assert e.value.body["param"] == "previous_response_id"


def test_incomplete_on_max_output_tokens(scripted_server):
  r = _client(scripted_server).responses.create(model="m", input="hi", max_output_tokens=3)
  assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
  assert r.usage.output_tokens == 3
