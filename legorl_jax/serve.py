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
  ap.add_argument("--max_len", type=int, default=4096)
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


def build_server(args):
  """Model, tokenizer, engine and (not yet started) ProxyServer from parsed arguments."""
  from legorl_jax.models import create_model, from_pretrained, pretrained
  from legorl_jax.models.tokenizer import load_tokenizer
  from legorl_jax.proxy import EngineBackend, ProxyConfig, ProxyServer
  from legorl_jax.sampling import Engine

  path = pathlib.Path(args.model).expanduser()
  if pretrained.is_pretrained_ref(args.model):  # a named model or .gguf -> its cached HF dir
    path = pretrained.resolve_pretrained(args.model)
  if path.is_dir():
    model = from_pretrained(path)
    tokenizer = load_tokenizer(args.tokenizer or path)
  else:
    model = create_model(args.model, seed=args.seed)
    tokenizer = load_tokenizer(args.tokenizer)
  max_len = min(args.max_len, model.config.max_position_embeddings)
  buckets = tuple(b for b in (64, 256, 1024) if b < max_len) + (min(max_len, 1024),)
  engine = Engine(model, max_batch=args.max_batch, max_len=max_len, prefill_buckets=buckets,
                  decode_chunk=args.decode_chunk, seed=args.seed, decode_fn=tokenizer)
  admin = os.environ.get(args.admin_token_env) if args.admin_token_env else None
  config = ProxyConfig(model_name=args.model_name, default_temperature=args.temperature,
                       force_temperature=args.force_temperature,
                       max_tokens_cap=args.max_tokens_cap,
                       auto_create_sessions=not args.no_auto_sessions, admin_token=admin,
                       token_cache_chars=int(args.token_cache_mb * (1 << 20)))
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
