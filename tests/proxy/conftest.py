"""Shared fixtures: the bundled tokenizer, a tiny random policy on a small engine, and servers.

One engine (tiny preset, fp32, a single attention bucket so few shapes compile) is shared by
every proxy test; servers run on 127.0.0.1 with random ports on background threads.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax.models import create_model
from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer, ScriptedBackend
from legorl_jax.sampling import Engine

MAX_LEN = 1024
WEATHER_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                '</tool_call>')
FORCE_TOOL = "[call the tool]"  # a user message containing this gets WEATHER_CALL back

CHAT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather of a city.",
                    "input_schema": CHAT_TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
                    "parameters": CHAT_TOOLS[0]["function"]["parameters"]}]


def scripted_reply(req) -> str:
  """A deterministic scripted policy: calls the tool first, then answers with its result."""
  last = req.messages[-1]
  if last.role == "tool":
    return f"The weather is {last.content}."
  if req.tools:
    return WEATHER_CALL
  return "Hello from the scripted policy."


class ToolForcingBackend:
  """The engine, except that a user turn containing FORCE_TOOL is answered with a tool call.

  Random weights never write a well-formed tool call; this lets engine-backed tests run real
  tool loops (the forced turns are scripted, logprob 0; every other turn is sampled).
  """

  def __init__(self, engine_backend, scripted):
    self.engine_backend, self.scripted = engine_backend, scripted
    self.max_len = engine_backend.max_len

  async def generate(self, prompt_ids, sampling, *, session_id=None, request=None):
    last = request.messages[-1]
    if last.role == "user" and FORCE_TOOL in last.content:
      return await self.scripted.generate(prompt_ids, sampling, session_id=session_id,
                                          request=request)
    return await self.engine_backend.generate(prompt_ids, sampling, session_id=session_id,
                                              request=request)


@pytest.fixture(scope="session")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="session")
def model():
  return create_model("tiny", seed=0)


@pytest.fixture(scope="session")
def engine(model, tokenizer):
  eng = Engine(model, max_batch=4, max_len=MAX_LEN, prefill_buckets=(256,), prefill_rows=(1,),
               decode_rows=(4,), attn_buckets=(MAX_LEN,), decode_chunk=8, seed=0,
               decode_fn=tokenizer)
  eng.start()
  yield eng
  eng.stop()


@pytest.fixture(scope="session")
def engine_server(engine, tokenizer):
  backend = ToolForcingBackend(EngineBackend(engine),
                               ScriptedBackend(tokenizer, lambda r: WEATHER_CALL, max_len=MAX_LEN))
  server = ProxyServer(backend, tokenizer, ProxyConfig(max_tokens_cap=32)).start()
  yield server
  server.stop()


@pytest.fixture(scope="session")
def scripted_server(tokenizer):
  server = ProxyServer(ScriptedBackend(tokenizer, scripted_reply, max_len=MAX_LEN), tokenizer,
                       ProxyConfig(model_name="scripted")).start()
  yield server
  server.stop()


def rescore(model, token_ids, temperature):
  """Teacher-forced logprobs: out[t] = log p(token_ids[t] | token_ids[:t]), out[0] = 0.

  The sampler's convention: log_softmax(logits / temperature), greedy (0) -> log_softmax(logits).
  Computed in float64 NumPy from the model's float32 logits.
  """
  logits = np.asarray(model(jnp.asarray([token_ids], jnp.int32))[0], np.float64)  # [T, V]
  if temperature > 0:
    logits = logits / temperature
  logits = logits - logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  out = np.zeros(len(token_ids))
  out[1:] = logp[np.arange(len(token_ids) - 1), np.asarray(token_ids[1:])]
  argmax = np.zeros(len(token_ids), np.int64)
  argmax[1:] = logp[:-1].argmax(-1)
  return out, argmax


def check_segment_logprobs(model, segment, temperature, skip_calls=(), calls=None):
  """Every sampled (mask 1) token of ``segment`` rescored: |delta logprob| < 1e-5, and under
  greedy sampling the sampled id is the teacher-forced argmax. ``skip_calls``: scripted calls."""
  ids, mask, logps = segment["token_ids"], segment["loss_mask"], segment["logprobs"]
  assert len(ids) == len(mask) == len(logps)
  ref, argmax = rescore(model, ids, temperature)
  skip = np.zeros(len(ids), bool)
  for i in skip_calls:
    c = calls[i]
    skip[c["sample_offset"]:c["sample_offset"] + len(c["token_ids"])] = True
  checked = 0
  for t in range(len(ids)):
    if mask[t] == 0:
      assert logps[t] == 0.0
      continue
    if skip[t]:
      continue
    assert abs(ref[t] - logps[t]) < 1e-5, (t, ref[t], logps[t])
    if temperature == 0:
      assert argmax[t] == ids[t], t
    checked += 1
  return checked


def dump(obj) -> str:
  return json.dumps(obj, sort_keys=True)


def http(method, url, token=None, body=None, headers=None, raw=None, timeout=60):
  """A plain HTTP request (urllib): returns (status, parsed JSON or text)."""
  import urllib.error
  import urllib.request
  data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
  req = urllib.request.Request(url, data=data, method=method)
  req.add_header("Content-Type", "application/json")
  if token is not None:
    req.add_header("Authorization", f"Bearer {token}")
  for k, v in (headers or {}).items():
    req.add_header(k, v)
  try:
    with urllib.request.urlopen(req, timeout=timeout) as resp:
      status, text = resp.status, resp.read().decode()
  except urllib.error.HTTPError as e:
    status, text = e.code, e.read().decode()
  try:
    return status, json.loads(text)
  except ValueError:
    return status, text
