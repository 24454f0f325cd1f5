"""Latency the LLM proxy adds over the sampling engine, at 1 and 64 concurrent sessions.

Each session runs a multi-turn chat conversation (the previous reply sent back, so splicing
and segment recording are on the path) against a proxy over HTTP on 127.0.0.1. For every
request, overhead = client end-to-end latency - the engine's own time for that same request
(``Completion.timings["total"]``: queueing + prefill + decode), so both come from one run.
Tiny random policy, greedy, few new tokens: engine time is small and the proxy's share shows.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.proxy
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.proxy --concurrency 1,64 --turns 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models import create_model  # noqa: E402
from legorl_jax.models.tokenizer import load_tokenizer  # noqa: E402
from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer  # noqa: E402
from legorl_jax.sampling import Engine  # noqa: E402


class TimedBackend(EngineBackend):
  """Records the engine's time of each session's latest call."""

  def __init__(self, engine):
    super().__init__(engine)
    self.last_total: dict[str, float] = {}

  async def generate(self, prompt_ids, sampling, *, session_id=None, request=None):
    c = await super().generate(prompt_ids, sampling, session_id=session_id, request=request)
    self.last_total[session_id] = c.timings["total"]
    return c


async def _session(http, server, backend, idx, turns, max_tokens, out):
  h = server.create_session(session_id=f"bench-{idx}-{time.monotonic_ns()}")
  headers = {"Authorization": f"Bearer {h.token}"}
  conv = [{"role": "system", "content": "You are a coding agent."},
          {"role": "user", "content": f"Session {idx}: fix the failing test in calc.py."}]
  for turn in range(turns):
    body = {"model": "policy", "messages": conv, "temperature": 0, "max_tokens": max_tokens}
    t0 = time.perf_counter()
    async with http.post(h.openai_base_url + "/chat/completions", json=body,
                         headers=headers) as r:
      data = await r.json()
      assert r.status == 200, data
    e2e = time.perf_counter() - t0
    engine = backend.last_total[f"{h.session_id}/main"]
    out.append((e2e, engine))
    conv += [{"role": "assistant", "content": data["choices"][0]["message"]["content"]},
             {"role": "user", "content": f"Turn {turn}: continue."}]
  traj = server.sessions.get(h.session_id).trajectory()
  assert len(traj["segments"]) == 1, "the conversation should stay one segment"


async def _level(server, backend, concurrency, turns, max_tokens):
  out: list = []
  conn = aiohttp.TCPConnector(limit=0)
  async with aiohttp.ClientSession(connector=conn) as http:
    await asyncio.gather(*[_session(http, server, backend, i, turns, max_tokens, out)
                           for i in range(concurrency)])
  e2e = np.array([x[0] for x in out]) * 1e3
  eng = np.array([x[1] for x in out]) * 1e3
  over = e2e - eng
  return {"requests": len(out), "overhead_p50_ms": round(float(np.percentile(over, 50)), 3),
          "overhead_p99_ms": round(float(np.percentile(over, 99)), 3),
          "engine_p50_ms": round(float(np.percentile(eng, 50)), 3),
          "e2e_p50_ms": round(float(np.percentile(e2e, 50)), 3)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--concurrency", default="1,64")
  ap.add_argument("--turns", type=int, default=10)
  ap.add_argument("--max_tokens", type=int, default=4)
  ap.add_argument("--max_len", type=int, default=512)
  args = ap.parse_args()
  levels = [int(c) for c in args.concurrency.split(",")]
  tokenizer = load_tokenizer()
  batch = max(levels)
  engine = Engine(create_model(args.preset, seed=0), max_batch=batch, max_len=args.max_len,
                  prefill_buckets=(128,), prefill_rows=sorted({1, min(4, batch)}),
                  decode_rows=sorted({r for r in (1, 4, 16, 64) if r < batch} | {batch}),
                  attn_buckets=(args.max_len,), decode_chunk=args.max_tokens, decode_fn=tokenizer)
  engine.warmup()  # compile every bucket shape before timing
  engine.start()
  backend = TimedBackend(engine)
  server = ProxyServer(backend, tokenizer, ProxyConfig()).start()
  result = {"benchmark": "proxy", "preset": args.preset, "api": "chat",
            "max_tokens": args.max_tokens, "turns": args.turns}
  try:
    asyncio.run(_level(server, backend, 1, 2, args.max_tokens))  # warm the HTTP path
    for c in levels:
      result[f"sessions_{c}"] = asyncio.run(_level(server, backend, c, args.turns,
                                                   args.max_tokens))
  finally:
    server.stop()
    engine.stop()
  print(json.dumps(result))


if __name__ == "__main__":
  main()
