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
