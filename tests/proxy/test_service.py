"""Sampling options: request values, server defaults, caps, forced values, context clamping."""

import pytest

from legorl_jax.errors import ProxyError
from legorl_jax.proxy import ProxyConfig, ProxyService, ScriptedBackend, anthropic_messages
from legorl_jax.proxy import openai_chat, openai_responses
from tests.proxy.conftest import scripted_reply


def _service(tokenizer, **config):
  return ProxyService(ScriptedBackend(tokenizer, scripted_reply, max_len=1000), tokenizer,
                      ProxyConfig(**config))


def test_request_values_are_mapped(tokenizer):
  s = _service(tokenizer)
  req = openai_chat.parse({"model": "m", "messages": [{"role": "user", "content": "x"}],
                           "temperature": 0.3, "top_p": 0.9, "max_tokens": 7, "stop": "END",
                           "seed": 2**32 + 5})
  p = s.sampling_params(req, 100)
  assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.seed) == (0.3, 0.9, 7, ("END",), 5)
  assert set(p.stop_token_ids) == {tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                   tokenizer.convert_tokens_to_ids("<|endoftext|>")}
  req = anthropic_messages.parse({"model": "m", "max_tokens": 9, "top_k": 40,
                                  "stop_sequences": ["a", "b"],
                                  "messages": [{"role": "user", "content": "x"}]})
  p = s.sampling_params(req, 100)
  assert (p.max_tokens, p.top_k, p.stop, p.temperature) == (9, 40, ("a", "b"), 1.0)
  req = openai_responses.parse({"model": "m", "input": "x", "max_output_tokens": 11})
  assert s.sampling_params(req, 100).max_tokens == 11


def test_defaults_caps_and_forced_values(tokenizer):
  s = _service(tokenizer, default_temperature=0.6, default_max_tokens=50, max_tokens_cap=20,
               force_top_p=0.95)
  req = openai_chat.parse({"model": "m", "messages": [{"role": "user", "content": "x"}],
                           "top_p": 0.1})
  p = s.sampling_params(req, 100)
  assert (p.temperature, p.max_tokens, p.top_p) == (0.6, 20, 0.95)
  s = _service(tokenizer, force_temperature=0.0)
  req.temperature = 1.5
  p = s.sampling_params(req, 100)
  assert p.temperature == 0.0 and p.max_tokens == 900  # no request / default: what fits


def test_context_clamp_and_overflow(tokenizer):
  s = _service(tokenizer)
  req = openai_chat.parse({"model": "m", "max_tokens": 500,
                           "messages": [{"role": "user", "content": "x"}]})
  assert s.sampling_params(req, 990).max_tokens == 10
  assert s.sampling_params(req, 999).max_tokens == 1
  with pytest.raises(ProxyError) as e:
    s.sampling_params(req, 1000)
  assert e.value.status == 400 and e.value.code == "context_length_exceeded"
  assert "prompt is too long: 1000 tokens" in str(e.value)


# -- session seeds ---------------------------------------------------------------------------
def test_derive_seed_is_a_stable_uint32():
  from legorl_jax.proxy.service import derive_seed
  # Fixed values: a resumed run must derive the seeds the interrupted one derived.
  assert derive_seed(0, "main", 0) == 1711125072
  assert derive_seed("rl", 0, 1, 0, "t", 0) == 4110759029
  seeds = {derive_seed(7, s, i) for s in ("main", "side") for i in range(50)}
  assert len(seeds) == 100 and all(0 <= x < 2**32 for x in seeds)


def _chat(text, seed=None):
  body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
  if seed is not None:
    body["seed"] = seed
  return openai_chat.parse(body)


def test_session_seed_makes_sampling_independent_of_arrival_order(engine, tokenizer):
  """Two seeded sessions, each making two calls, run concurrently in one order and then
  sequentially in the other: every call samples the same tokens, which are what the engine
  samples for the same prompt with the derived seed passed explicitly (the reference)."""
  import asyncio

  from legorl_jax.proxy import EngineBackend
  from legorl_jax.proxy.service import derive_seed
  from legorl_jax.sampling import SamplingParams

  def run(order, concurrent):
    s = ProxyService(EngineBackend(engine), tokenizer, ProxyConfig(force_temperature=1.0))
    for name in ("a", "b"):
      s.sessions.create(name)
      s.set_session_seed(name, 11 if name == "a" else 12)

    async def calls(name):
      sess = s.sessions.get(name)
      for i in range(2):
        await s.complete(_chat(f"session {name}, call {i}"), sess)
      return [(c.prompt_ids.tolist(), c.token_ids) for c in sess.calls]

    async def main():
      if concurrent:
        return dict(zip(order, await asyncio.gather(*(calls(n) for n in order))))
      return {n: await calls(n) for n in order}
    return asyncio.run(main())

  first, second = run(("a", "b"), True), run(("b", "a"), False)
  assert first == second
  stop_ids = ProxyService(EngineBackend(engine), tokenizer).renderer.stop_ids
  for name, seed in (("a", 11), ("b", 12)):
    for i, (prompt, ids) in enumerate(first[name]):
      ref = engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=8,
                                                   stop_token_ids=stop_ids,
                                                   seed=derive_seed(seed, "main", i)))
      assert ids == list(ref.token_ids)
  assert first["a"][0][1] != first["b"][0][1]  # different sessions, different draws


def test_request_seed_wins_over_session_seed(tokenizer):
  from legorl_jax.proxy.service import derive_seed
  s = _service(tokenizer)
  sess = s.sessions.create("x")
  assert s.request_seed(sess, "main") is None  # unseeded: the engine's own draws
  s.set_session_seed("x", 3)
  got = [s.request_seed(sess, "main") for _ in range(2)]
  assert got == [derive_seed(3, "main", i) for i in range(2)]
  assert s.request_seed(sess, "side") == derive_seed(3, "side", 0)  # streams count apart
  seed = s.request_seed(sess, "main")
  assert s.sampling_params(_chat("x", seed=9), 10, default_seed=seed).seed == 9
  assert s.sampling_params(_chat("x"), 10, default_seed=seed).seed == seed
  with pytest.raises(ProxyError, match="no such session"):
    s.set_session_seed("missing", 1)
