"""EngineBackend under concurrency: responses and recordings stay paired with their requests."""

import asyncio

import numpy as np
import pytest
from openai import AsyncOpenAI

from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer
from legorl_jax.sampling import SamplingParams


@pytest.mark.slow
def test_concurrent_sessions_through_the_engine_keep_every_response_and_recording(
    engine, tokenizer):
  """Eight sessions at once against the real engine (more than its 4 rows, so requests queue
  and finish in batches): every response equals its recorded call, and each call's sampled
  ids and logprobs are what the engine gives for the recorded prompt on its own (greedy)."""
  server = ProxyServer(EngineBackend(engine), tokenizer, ProxyConfig(max_tokens_cap=6)).start()
  handles = [server.create_session() for _ in range(8)]

  async def session(h, i):
    client = AsyncOpenAI(base_url=h.openai_base_url, api_key=h.token, max_retries=0)
    msgs = [{"role": "user", "content": f"session {i}: count to {i + 3}"}]
    texts = []
    for turn in range(3):
      r = await client.chat.completions.create(model="m", messages=msgs, temperature=0,
                                               max_tokens=6)
      text = r.choices[0].message.content or ""
      texts.append((text, r.usage.prompt_tokens, r.usage.completion_tokens))
      msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"more {turn}"}]
    await client.close()
    return texts

  async def main():
    return await asyncio.gather(*[session(h, i) for i, h in enumerate(handles)])

  try:
    results = asyncio.run(main())
    for h, texts in zip(handles, results):
      session = server.sessions.get(h.session_id)
      calls = session.calls
      assert len(calls) == 3
      assert len(session.segments()) == 1  # every reply sent back was spliced
      for call, (text, prompt_tokens, completion_tokens) in zip(calls, texts):
        assert call.prompt_ids.size == prompt_tokens
        assert len(call.token_ids) == completion_tokens
        ids = list(call.token_ids)
        if ids and ids[-1] in server.service.renderer.stop_ids:
          ids = ids[:-1]
        assert tokenizer.decode(ids, skip_special_tokens=False).strip() == text
        alone = engine.generate(call.prompt_ids.tolist(), SamplingParams(
            temperature=0.0, max_tokens=call.max_tokens,
            stop_token_ids=server.service.renderer.stop_ids))
        assert alone.token_ids == call.token_ids
        np.testing.assert_allclose(alone.logprobs, call.logprobs, atol=1e-5)
  finally:
    server.stop()
