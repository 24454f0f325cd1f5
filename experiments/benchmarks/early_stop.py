"""Latency of short requests: a decode chunk that every row finishes early stops early.

Agent harness calls often end on a stop token a few tokens into a decode chunk. The decode
loop exits once every row has finished instead of running the chunk's remaining steps. This
times ``--requests`` greedy requests of ``--new_tokens`` tokens (fewer than ``--decode_chunk``)
on preset ``small`` one after another and prints the median latency. Prints one JSON line.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.early_stop
"""

from __future__ import annotations

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models import create_model  # noqa: E402
from legorl_jax.sampling import Engine, SamplingParams  # noqa: E402

flags.DEFINE_string("preset", "small", "Model preset (random weights).")
flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per request.")
flags.DEFINE_integer("new_tokens", 3, "Greedy tokens per request (fewer than --decode_chunk).")
flags.DEFINE_integer("decode_chunk", 16, "Decode steps per engine call.")
flags.DEFINE_integer("requests", 20, "Timed requests, one after another.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  args = FLAGS
  model = create_model(args.preset, seed=0)
  params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens)
  rng = np.random.default_rng(0)
  vocab = model.config.vocab_size
  with Engine(model, max_batch=4, max_len=512, prefill_buckets=(args.prompt_len,),
              prefill_rows=(1,), decode_rows=(1, 4), attn_buckets=(128, 512),
              decode_chunk=args.decode_chunk) as engine:
    for _ in range(3):  # compile
      engine.generate(rng.integers(0, vocab, args.prompt_len).tolist(), params)
    secs, got = [], []
    for _ in range(args.requests):
      with common.Timer() as t:
        done = engine.generate(rng.integers(0, vocab, args.prompt_len).tolist(), params)
      secs.append(t.wall)
      got.append(len(done.token_ids))
  assert set(got) == {args.new_tokens}, got
  common.emit(dict(benchmark="early_stop", preset=args.preset, prompt_len=args.prompt_len,
                   new_tokens=args.new_tokens, decode_chunk=args.decode_chunk,
                   requests=args.requests, backend=jax.default_backend(),
                   latency_p50_ms=round(float(np.median(secs)) * 1e3, 1),
                   latency_min_ms=round(float(np.min(secs)) * 1e3, 1)))


if __name__ == "__main__":
  app.run(main)
