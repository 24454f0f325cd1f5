"""Latency the LLM proxy adds over the sampling engine, at 1 and 64 concurrent sessions.

Each session runs a multi-turn chat conversation (the previous reply sent back, so splicing
and segment recording are on the path) against a proxy over HTTP on 127.0.0.1. The clients
run in a separate process, as harnesses do (an in-process client would share the server's
GIL and bill its own JSON work to the proxy). For every request, overhead = client
end-to-end latency - the engine's own time for that same request (the recorded call's
``timings["total"]``: queueing + prefill + decode), so both come from one run.

Two scenarios:
  chat   (default) the tiny random policy on the engine, short messages, greedy, few new
         tokens: engine time is small and the proxy's share shows.
  agent  agent-sized requests (a ~6 kB system prompt, 12 tool schemas, ~1 kB tool results,
         growing to ~60 kB bodies) answered by a scripted policy that calls a tool every
         turn: the cost of rendering, tokenizing and recording long resent histories.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.proxy
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.proxy --scenario agent --turns 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

_WORDS = ("the of and to in file test function error return value import class def self "
          "assert path line module config").split()
_TOOL_REPLY = ('<tool_call>\n{"name": "tool_3", "arguments": {"path": "src/calc.py"}}\n'
               '</tool_call>')


def _words(rnd: random.Random, n: int) -> str:
  return " ".join(rnd.choice(_WORDS) for _ in range(n))


def _agent_prompt(seed: int = 0):
  """System prompt and tool schemas of an agent-sized request (same for every session)."""
  rnd = random.Random(seed)
  tools = [{"type": "function", "function": {
      "name": f"tool_{i}", "description": _words(rnd, 60),
      "parameters": {"type": "object", "properties": {
          p: {"type": "string", "description": _words(rnd, 12)} for p in ("path", "text", "mode")},
          "required": ["path"]}}} for i in range(12)]
  return _words(rnd, 1000), tools


# -- client process (no JAX) -----------------------------------------------------------------
async def _client_session(http, handle, idx, args, out):
  base_url, token = handle
  headers = {"Authorization": f"Bearer {token}"}
  rnd = random.Random(idx)
  if args["scenario"] == "agent":
    system, tools = _agent_prompt()
  else:
    system, tools = "You are a coding agent.", None
  conv = [{"role": "system", "content": system},
          {"role": "user", "content": f"Session {idx}: fix the failing test in calc.py."}]
  times = []
  for turn in range(args["turns"]):
    body = {"model": "policy", "messages": conv, "temperature": 0,
            "max_tokens": args["max_tokens"]}
    if tools:
      body["tools"] = tools
    t0 = time.perf_counter()
    async with http.post(base_url + "/v1/chat/completions", json=body, headers=headers) as r:
      data = await r.json()
      assert r.status == 200, data
    times.append(time.perf_counter() - t0)
    msg = data["choices"][0]["message"]
    conv.append({k: v for k, v in msg.items() if v is not None})
    for c in msg.get("tool_calls") or ():
      conv.append({"role": "tool", "tool_call_id": c["id"],
                   "content": _words(rnd, rnd.randint(100, 300))})
    if not msg.get("tool_calls"):
      conv.append({"role": "user", "content": f"Turn {turn}: continue."})
  out[idx] = times


async def _client_level(handles, args):
  import aiohttp
  out = [None] * len(handles)
  async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
    await asyncio.gather(*[_client_session(http, h, i, args, out)
                           for i, h in enumerate(handles)])
  return out


def _client_main(conn):
  """Runs levels sent by the server process: (handles, args) -> per-session e2e seconds."""
  while True:
    job = conn.recv()
    if job is None:
      return
    try:
      conn.send(asyncio.run(_client_level(*job)))
    except Exception as e:  # noqa: BLE001 -- reported to the server process
      conn.send(e)


# -- server process ---------------------------------------------------------------------------
def _level(server, conn, concurrency, args, repeats=1):
  """Pooled over ``repeats`` rounds (so the 1-session percentiles rest on enough requests)."""
  e2e, eng = [], []
  for _ in range(repeats):
    a, b = _round(server, conn, concurrency, args)
    e2e += a
    eng += b
  e2e, eng = np.array(e2e) * 1e3, np.array(eng) * 1e3
  over = e2e - eng
  return {"requests": len(over), "overhead_p50_ms": round(float(np.percentile(over, 50)), 3),
          "overhead_p99_ms": round(float(np.percentile(over, 99)), 3),
          "engine_p50_ms": round(float(np.percentile(eng, 50)), 3),
          "e2e_p50_ms": round(float(np.percentile(e2e, 50)), 3)}


def _round(server, conn, concurrency, args):
  handles = [server.create_session(session_id=f"bench-{concurrency}-{i}-{time.monotonic_ns()}")
             for i in range(concurrency)]
  conn.send(([(h.base_url, h.token) for h in handles], args))
  e2e_per_session = conn.recv()
  if isinstance(e2e_per_session, Exception):
    raise e2e_per_session
  e2e, eng = [], []
  for h, times in zip(handles, e2e_per_session):
    session = server.sessions.get(h.session_id)
    calls = session.calls
    assert len(calls) == len(times), (len(calls), len(times))
    assert len(session.segments()) == 1, "the conversation should stay one segment"
    e2e += times
    eng += [c.timings["total"] for c in calls]
  return e2e, eng


def _backend(args, batch, tokenizer):
  from legorl_jax.proxy import EngineBackend, ScriptedBackend
  if args.scenario == "agent":
    return ScriptedBackend(tokenizer, lambda req: _TOOL_REPLY, max_len=1 << 20), None
  from legorl_jax.models import create_model
  from legorl_jax.sampling import Engine
  engine = Engine(create_model(args.preset, seed=0), max_batch=batch, max_len=args.max_len,
                  prefill_buckets=(128,), prefill_rows=sorted({1, min(4, batch)}),
                  decode_rows=sorted({r for r in (1, 4, 16, 64) if r < batch} | {batch}),
                  attn_buckets=(args.max_len,), decode_chunk=args.max_tokens,
                  decode_fn=tokenizer)
  engine.warmup()  # compile every bucket shape before timing
  engine.start()
  return EngineBackend(engine), engine


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--scenario", default="chat", choices=("chat", "agent"))
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--concurrency", default="1,64")
  ap.add_argument("--turns", type=int, default=10)
  ap.add_argument("--single_repeats", type=int, default=5,
                  help="1-session conversations run one after another (pooled)")
  ap.add_argument("--max_tokens", type=int, default=4)
  ap.add_argument("--max_len", type=int, default=512)
  args = ap.parse_args()
  from legorl_jax.models.tokenizer import load_tokenizer
  from legorl_jax.proxy import ProxyConfig, ProxyServer

  levels = [int(c) for c in args.concurrency.split(",")]
  tokenizer = load_tokenizer()
  backend, engine = _backend(args, max(levels), tokenizer)
  server = ProxyServer(backend, tokenizer, ProxyConfig()).start()
  ctx = multiprocessing.get_context("spawn")
  conn, child_conn = ctx.Pipe()
  client = ctx.Process(target=_client_main, args=(child_conn,), daemon=True)
  client.start()
  job = {"scenario": args.scenario, "turns": args.turns, "max_tokens": args.max_tokens}
  result = {"benchmark": "proxy", "scenario": args.scenario, "preset": args.preset,
            "api": "chat", "max_tokens": args.max_tokens, "turns": args.turns,
            "client": "separate process"}
  try:
    _level(server, conn, 1, dict(job, turns=2))  # warm the HTTP path
    for c in levels:
      result[f"sessions_{c}"] = _level(server, conn, c, job,
                                       args.single_repeats if c == 1 else 1)
  finally:
    conn.send(None)
    client.join(30)
    server.stop()
    if engine is not None:
      engine.stop()
  result["load_avg_1m"] = round(os.getloadavg()[0], 2)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
