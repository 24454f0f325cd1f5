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

``--floor`` (chat scenario) also runs the same clients against a bare aiohttp server on the same
engine: it reads the JSON body and samples for a prompt that grows like the proxy's (new tokens
per new message, session prefix reuse) but renders, tokenizes and records nothing and answers a
fixed JSON. Its overhead is what HTTP, the client process and CPU contention alone cost, the
floor under the proxy's figure on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import time

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported (the client process never imports it)

import numpy as np  # noqa: E402

flags.DEFINE_enum("scenario", "chat", ["chat", "agent"], "See the module docstring.")
flags.DEFINE_string("preset", "tiny", "Policy preset on the engine (chat scenario).")
flags.DEFINE_list("concurrency", ["1", "64"], "Concurrent sessions, one level each.")
flags.DEFINE_integer("turns", 10, "Turns per conversation.")
flags.DEFINE_integer("single_repeats", 5,
                     "1-session conversations run one after another (pooled).")
flags.DEFINE_integer("max_tokens", 4, "Sampled tokens per request.")
flags.DEFINE_integer("max_len", 512, "Engine context length.")
flags.DEFINE_bool("floor", False,
                  "Also measure a bare HTTP server on the same engine (chat scenario).")
FLAGS = flags.FLAGS

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
class _FloorServer:
  """Bare aiohttp server on the engine (see the module docstring): the proxy's lower bound."""

  def __init__(self, engine):
    self.engine = engine
    self.engine_times: dict[str, list[float]] = {}
    self._state: dict[str, tuple[list[int], int]] = {}  # session -> (tokens so far, messages)
    self.url = None
    self._loop = self._thread = None

  async def _handle(self, request):
    from aiohttp import web
    from legorl_jax.sampling import SamplingParams
    body = json.loads(await request.read())
    sid = request.match_info["sid"]
    tokens, seen = self._state.get(sid, ([], 0))
    new = body["messages"][seen:]
    chars = sum(len(m.get("content") or "") for m in new)
    prompt = tokens + [(7 * i) % 1000 + 1 for i in range(chars // 4 + 5 * len(new) + 3)]
    done = await self.engine.agenerate(
        prompt, SamplingParams(temperature=0.0, max_tokens=body["max_tokens"]), session_id=sid)
    self._state[sid] = (prompt + done.token_ids, len(body["messages"]) + 1)
    self.engine_times.setdefault(sid, []).append(done.timings["total"])
    return web.json_response({
        "id": "chatcmpl-floor", "object": "chat.completion", "created": 0, "model": "floor",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(done.token_ids),
                  "total_tokens": len(prompt) + len(done.token_ids)}})

  def start(self):
    import threading
    from aiohttp import web
    app = web.Application()
    app.router.add_post("/sess/{sid}/v1/chat/completions", self._handle)
    ready = threading.Event()

    def run():
      self._loop = loop = asyncio.new_event_loop()
      runner = web.AppRunner(app, access_log=None, handle_signals=False)
      loop.run_until_complete(runner.setup())
      site = web.TCPSite(runner, "127.0.0.1", 0)
      loop.run_until_complete(site.start())
      self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
      ready.set()
      loop.run_forever()
      loop.run_until_complete(runner.cleanup())

    self._thread = threading.Thread(target=run, daemon=True)
    self._thread.start()
    ready.wait(30)
    return self

  def stop(self):
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(30)


def _floor_level(floor, conn, concurrency, args, repeats=1):
  e2e, eng = [], []
  for _ in range(repeats):
    sids = [f"floor-{concurrency}-{i}-{time.monotonic_ns()}" for i in range(concurrency)]
    conn.send(([(f"{floor.url}/sess/{sid}", "-") for sid in sids], args))
    out = conn.recv()
    if isinstance(out, Exception):
      raise out
    for sid, times in zip(sids, out):
      assert len(times) == len(floor.engine_times[sid])
      e2e += times
      eng += floor.engine_times[sid]
  return _stats(e2e, eng)


def _stats(e2e, eng):
  e2e, eng = np.array(e2e) * 1e3, np.array(eng) * 1e3
  over = e2e - eng
  return {"requests": len(over), "overhead_p50_ms": round(float(np.percentile(over, 50)), 3),
          "overhead_p99_ms": round(float(np.percentile(over, 99)), 3),
          "engine_p50_ms": round(float(np.percentile(eng, 50)), 3),
          "e2e_p50_ms": round(float(np.percentile(e2e, 50)), 3)}


def _level(server, conn, concurrency, args, repeats=1):
  """Pooled over ``repeats`` rounds (so the 1-session percentiles rest on enough requests)."""
  e2e, eng = [], []
  for _ in range(repeats):
    a, b = _round(server, conn, concurrency, args)
    e2e += a
    eng += b
  return _stats(e2e, eng)


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


def main(argv):
  del argv
  args = FLAGS
  if args.floor and args.scenario != "chat":
    raise app.UsageError("--floor needs --scenario chat (it samples from the engine)")
  from legorl_jax.models.tokenizer import load_tokenizer
  from legorl_jax.proxy import ProxyConfig, ProxyServer

  levels = [int(c) for c in args.concurrency]
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
    if args.floor:
      floor = _FloorServer(engine).start()
      try:
        _floor_level(floor, conn, 1, dict(job, turns=2))
        for c in levels:
          result[f"floor_{c}"] = _floor_level(floor, conn, c, job,
                                              args.single_repeats if c == 1 else 1)
      finally:
        floor.stop()
  finally:
    conn.send(None)
    client.join(30)
    server.stop()
    if engine is not None:
      engine.stop()
  result["load_avg_1m"] = common.load_avg_1m()
  common.emit(result)


if __name__ == "__main__":
  app.run(main)
