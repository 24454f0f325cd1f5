"""Serves a policy behind the LLM proxy: ``python -m legorl_jax.serve --model=PATH_OR_PRESET``.

  python -m legorl_jax.serve --model=tiny --port=8000
  python -m legorl_jax.serve --model=/ckpt/qwen3-0.6b --uds=/tmp/policy.sock --max_len=8192

``--model`` is a Hugging Face directory (config.json + safetensors, loaded with
``from_pretrained``; its tokenizer files are used), a pretrained name or .gguf file (converted
once into ``~/.cache/legorl_jax/models``, see ``models.pretrained``) or a preset name (random
weights, bundled tokenizer). Prints ``listening on URL`` once ready; stops on SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import signal
import sys


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m legorl_jax.serve",
                               description=__doc__.splitlines()[0])
  ap.add_argument("--model", required=True,
                  help="HF checkpoint directory, pretrained name (smollm2-135m-instruct), .gguf "
                       "file or preset name")
  ap.add_argument("--tokenizer", default=None,
                  help="tokenizer dir / hub id (default: the checkpoint's, or the bundled one)")
  ap.add_argument("--host", default="127.0.0.1")
  ap.add_argument("--port", type=int, default=None, help="TCP port (0 = any free port)")
  ap.add_argument("--uds", default=None, help="also (or only) listen on this Unix socket")
  ap.add_argument("--seed", type=int, default=0, help="init seed for preset weights")
  ap.add_argument("--max_batch", type=int, default=8)
  ap.add_argument("--max_len", type=int, default=None,
                  help="context in tokens (default: the model's max_position_embeddings, capped "
                       "by --kv_cache_gb)")
  ap.add_argument("--kv_cache_gb", type=float, default=8.0,
                  help="memory for the KV cache of the --max_batch rows, in GiB; bounds the "
                       "default --max_len")
  ap.add_argument("--prefill_chunk", type=int, default=256,
                  help="prefill chunk length (fixed, aligned to positions: cached prefixes are "
                       "bit-identical to fresh ones)")
  ap.add_argument("--prefix_cache_gb", type=float, default=0.0,
                  help="extra memory for prefixes evicted from the rows, in GiB (LRU)")
  ap.add_argument("--decode_chunk", type=int, default=16)
  ap.add_argument("--model_name", default="legorl-policy")
  ap.add_argument("--temperature", type=float, default=1.0, help="default temperature")
  ap.add_argument("--force_temperature", type=float, default=None)
  ap.add_argument("--max_tokens_cap", type=int, default=None)
  ap.add_argument("--no_auto_sessions", action="store_true",
                  help="unknown /sess/{id} routes get 404 (sessions come from POST /sess)")
  ap.add_argument("--admin_token_env", default=None,
                  help="name of an environment variable holding the token POST /sess needs")
  ap.add_argument("--token_cache_mb", type=float, default=32,
                  help="text of tokenized turns cached across requests, in MB (0 = off)")
  ap.add_argument("--log_level", default="WARNING")
  return ap


def choose_context(config, max_batch: int, max_len: int | None, kv_cache_gb: float,
                   dtype=None) -> int:
  """The engine's context: ``max_len`` if given, else the model's ``max_position_embeddings``
  capped so that ``max_batch`` rows fit in ``kv_cache_gb`` GiB; never past the model's."""
  from legorl_jax import errors
  from legorl_jax.sampling.cache import SCRATCH
  from legorl_jax.sampling.prefix_cache import row_bytes

  limit = int(config.max_position_embeddings)
  if max_len is not None:
    return min(int(max_len), limit)
  per_position = row_bytes(config, 1, dtype) - row_bytes(config, 0, dtype)
  fit = int(kv_cache_gb * (1 << 30) // (max_batch * per_position)) - SCRATCH
  if fit < 2:
    raise errors.ConfigError(
        f"--kv_cache_gb={kv_cache_gb} holds no context for --max_batch={max_batch} rows "
        f"({per_position * max_batch} bytes per position); raise --kv_cache_gb or lower "
        "--max_batch.")
  return min(limit, fit)


def build_server(args):
  """Model, tokenizer, engine and (not yet started) ProxyServer from parsed arguments."""
  from legorl_jax.models import create_model, from_pretrained, pretrained
  from legorl_jax.models.tokenizer import load_tokenizer
  from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer
  from legorl_jax.sampling import Engine
  from legorl_jax.sampling.prefix_cache import row_bytes

  path = pathlib.Path(args.model).expanduser()
  if pretrained.is_pretrained_ref(args.model):  # a named model or .gguf -> its cached HF dir
    path = pretrained.resolve_pretrained(args.model)
  if path.is_dir():
    model = from_pretrained(path)
    tokenizer = load_tokenizer(args.tokenizer or path)
  else:
    model = create_model(args.model, seed=args.seed)
    tokenizer = load_tokenizer(args.tokenizer)
  cfg = model.config
  max_len = choose_context(cfg, args.max_batch, args.max_len, args.kv_cache_gb)
  engine = Engine(model, max_batch=args.max_batch, max_len=max_len,
                  prefill_chunk=min(args.prefill_chunk, max_len), decode_chunk=args.decode_chunk,
                  seed=args.seed, decode_fn=tokenizer, prefix_cache_gb=args.prefix_cache_gb)
  why = ("--max_len" if args.max_len is not None else
         f"max_position_embeddings={cfg.max_position_embeddings}, --kv_cache_gb={args.kv_cache_gb}")
  gib = row_bytes(cfg, max_len, None) / (1 << 30)
  store = engine.stats()["prefix_store_rows"]
  print(f"context: {max_len} tokens ({why}); KV cache {args.max_batch} rows x {gib:.3f} GiB = "
        f"{args.max_batch * gib:.2f} GiB, prefix store {store} rows = {store * gib:.2f} GiB",
        file=sys.stderr, flush=True)
  hint = (f"the server's context is {max_len} tokens: restart `python -m legorl_jax.serve` with "
          f"a larger --max_len (the model allows {cfg.max_position_embeddings})"
          + ("" if args.max_len is not None else " or a larger --kv_cache_gb"))
  admin = os.environ.get(args.admin_token_env) if args.admin_token_env else None
  config = ProxyConfig(model_name=args.model_name, default_temperature=args.temperature,
                       force_temperature=args.force_temperature,
                       max_tokens_cap=args.max_tokens_cap,
                       auto_create_sessions=not args.no_auto_sessions, admin_token=admin,
                       token_cache_chars=int(args.token_cache_mb * (1 << 20)),
                       context_hint=hint)
  port = args.port if args.port is not None else (None if args.uds else 8000)
  server = ProxyServer(EngineBackend(engine), tokenizer, config, host=args.host, port=port,
                       uds=args.uds)
  return engine, server


async def _serve(engine, server):
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGINT, signal.SIGTERM):
    loop.add_signal_handler(sig, stop.set)
  await server.astart()
  where = [server.url] if server.port is not None else []
  where += [f"unix:{server.uds}"] if server.uds else []
  print(f"listening on {' '.join(where)}", flush=True)
  try:
    await stop.wait()
  finally:
    await server.astop()


def main(argv=None):
  args = _parser().parse_args(argv)
  logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
  engine, server = build_server(args)
  engine.start()
  try:
    asyncio.run(_serve(engine, server))
  finally:
    engine.stop()


if __name__ == "__main__":
  main()
