"""Session prefix reuse: a multi-turn agent session with and without cached prefixes.

Each turn resends the whole history plus ~``--turn_tokens`` new tokens (as agent harnesses do)
and samples ``--new_tokens``. With reuse the engine prefills only what its cache does not
hold: the new tokens and the previous turn's sampled ones (their decode-step K/V are not
reused, so results stay bit-identical to the engine without reuse; ``--reuse_sampled_kv``
reuses them too). Without reuse, the whole history every turn. Both engines share the compiled shapes and hold one cache row
(one session); an untimed session runs first to compile every shape the timed one uses (the
JSON line reports compilations during timing, which must be 0), and the two sessions alternate
turn by turn. Wall time and the process's CPU time are both reported (on a shared machine the
CPU time is the steadier of the two). Prints one JSON line.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.prefix_reuse
"""

from __future__ import annotations

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models import create_model  # noqa: E402
from legorl_jax.sampling import Engine, SamplingParams, steps  # noqa: E402

flags.DEFINE_string("preset", "small", "Model preset (random weights).")
flags.DEFINE_integer("turns", 10, "Turns of the session.")
flags.DEFINE_integer("turn_tokens", 200, "New prompt tokens per turn.")
flags.DEFINE_integer("new_tokens", 32, "Greedy tokens sampled per turn.")
flags.DEFINE_integer("prefill_chunk", 64, "Engine prefill chunk.")
flags.DEFINE_bool("reuse_sampled_kv", False,
                  "The reuse side also reuses the sampled tokens' K/V (not bit-exact).")
FLAGS = flags.FLAGS


def sessions(engines, rng, turns: int, turn_tokens: int, new_tokens: int, vocab: int):
  """One session per engine, run in lockstep (turn by turn, alternating engines, so that load
  from other processes hits both alike). Returns per engine (wall seconds, CPU seconds of this
  process, prefilled tokens), and the final history length."""
  params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
  histories = [[] for _ in engines]
  secs = [0.0 for _ in engines]
  cpu = [0.0 for _ in engines]
  before = [e.stats()["prefill_tokens"] for e in engines]
  sid = f"s{rng.integers(1 << 30)}"
  for _ in range(turns):
    new = rng.integers(0, vocab, turn_tokens).tolist()
    for i, engine in enumerate(engines):
      histories[i] = histories[i] + new
      with common.Timer() as t:
        done = engine.generate(histories[i], params, session_id=sid)
      secs[i] += t.wall
      cpu[i] += t.cpu
      histories[i] = histories[i] + done.token_ids
  out = [(secs[i], cpu[i], e.stats()["prefill_tokens"] - before[i])
         for i, e in enumerate(engines)]
  return out, len(histories[0])


def main(argv):
  del argv
  args = FLAGS
  model = create_model(args.preset, seed=0)
  vocab = model.config.vocab_size
  need = args.turns * (args.turn_tokens + args.new_tokens)
  max_len = min(1 << need.bit_length(), model.config.max_position_embeddings)
  kw = dict(max_batch=1, max_len=max_len, prefill_chunk=args.prefill_chunk, prefill_rows=(1,),
            decode_chunk=16)
  result = dict(benchmark="prefix_reuse", preset=args.preset, turns=args.turns,
                turn_tokens=args.turn_tokens, new_tokens=args.new_tokens,
                prefill_chunk=args.prefill_chunk, reuse_sampled_kv=args.reuse_sampled_kv,
                backend=jax.default_backend())
  with Engine(model, prefix_reuse=True, reuse_sampled_kv=args.reuse_sampled_kv, **kw) as reuse, \
      Engine(model, prefix_reuse=False, **kw) as plain:
    rng = np.random.default_rng(0)
    sessions([reuse, plain], rng, args.turns, args.turn_tokens, args.new_tokens, vocab)  # compile
    compiled = sum(steps.COMPILATIONS.values())
    timed, total = sessions([reuse, plain], rng, args.turns, args.turn_tokens, args.new_tokens,
                            vocab)
  result["compilations_during_timing"] = sum(steps.COMPILATIONS.values()) - compiled
  for tag, (secs, cpu, prefilled) in zip(("reuse", "no_reuse"), timed):
    result[f"{tag}_s"] = round(secs, 3)
    result[f"{tag}_cpu_s"] = round(cpu, 3)
    result[f"{tag}_prefill_tokens"] = prefilled
  result["final_context"] = total
  result["speedup"] = round(result["no_reuse_s"] / result["reuse_s"], 2)
  # CPU seconds of the process (both engines' threads): less sensitive to other load than wall.
  result["speedup_cpu"] = round(result["no_reuse_cpu_s"] / result["reuse_cpu_s"], 2)
  result["load_avg_1m"] = common.load_avg_1m()
  common.emit(result)


if __name__ == "__main__":
  app.run(main)
