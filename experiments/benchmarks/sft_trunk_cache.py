r"""SFT wall time with the frozen-trunk cache against without, in the demo's layout.

The demo (``experiments/configs/demo.py``: SmolLM2-135M-Instruct, ``trainer.trainable =
"top:4"``, rows of the system prompt once and eight demonstrations) trains only the top 4 of
30 blocks. Without the cache every step still runs the 26 frozen blocks forward; with it
(``sft.trunk_cache_mb``, ``trainer/trunk_cache.py``) they run once per distinct
demonstration before the first step, and the steps run the top blocks and the head only.
Both sides run ``--steps`` steps of the same seeded draws from fresh learners, one after the
other in this process; each side's wall includes its compiles (and, with the cache, filling
it). The losses of the two sides are compared step by step (``max_abs_dnll``).

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sft_trunk_cache --steps=40
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sft_trunk_cache \
      --demos=RUN/sft_demos/demos.jsonl --model=/path/to/hf_dir --steps=160 --cache_first

Prints one JSON line: each side's SFT wall, median seconds per step (after the first two,
which compile), the cache's size and fill time, and the ratios.
"""

import statistics
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_string("demos", None, "A demos.jsonl (default: collect --num_demos).")
flags.DEFINE_integer("num_demos", 320, "Demonstrations to collect (the demo's sft.num_demos).")
flags.DEFINE_string("model", None,
                    "model.pretrained: a name, .gguf or HF directory (default: the demo's).")
flags.DEFINE_integer("steps", 160, "SFT steps per side (the demo's 160).")
flags.DEFINE_float("cache_mb", 2048.0, "sft.trunk_cache_mb of the cached side.")
flags.DEFINE_bool("cache_first", False,
                  "Run the cached side first (on a busy host, run both orders).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  args = FLAGS
  from experiments.configs import demo
  from legorl_jax.trainer import batching
  from legorl_jax.trainer import pipeline, sft
  from legorl_jax.trainer.learner import Learner

  cfg = demo.get_config()
  if args.model:
    cfg.model.pretrained = args.model
  model, tokenizer = pipeline.build_policy(cfg)
  t0 = time.perf_counter()
  if args.demos:
    demos = sft.load_demonstrations(args.demos)
  else:
    demos = common.collect_demos(args.num_demos, tempfile.mkdtemp(prefix="sft_trunk_"), cfg,
                                 tokenizer=tokenizer)
  collect_s = time.perf_counter() - t0
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, 1.0)]
  results, losses = {}, {}
  sides = [("no_cache", 0.0), ("cache", args.cache_mb)]
  for mode, mb in sides[::-1] if args.cache_first else sides:
    c = pipeline.sft_config(cfg)
    learner = Learner(model, c, seed=int(cfg.seed))
    walls, nll, last = [], [], {}
    tick = common.step_timer(walls)

    def on_step(step, m, tick=tick, nll=nll, last=last):
      tick()
      nll.append(float(m["nll"]))
      last.update(m)

    with common.Timer() as side:
      sft.run_sft(learner, demos, c, steps=args.steps, seed=int(cfg.seed), on_step=on_step,
                  trunk_cache_mb=mb)
    wall = side.wall
    losses[mode] = nll
    steady = walls[2:] or walls
    results[mode] = {"sft_wall_s": round(wall, 1), "cpu_s": round(side.cpu, 1),
                     "s_per_step_median": round(statistics.median(steady), 3),
                     "first_steps_s": [round(w, 1) for w in walls[:2]],
                     "last_nll": round(nll[-1], 4)}
    if mb:
      results[mode].update({k.split("/")[1]: (round(v, 1) if isinstance(v, float) else v)
                            for k, v in last.items() if k.startswith("trunk_cache/")})
  dnll = max(abs(a - b) for a, b in zip(losses["no_cache"], losses["cache"]))
  common.emit({
      "benchmark": "sft_trunk_cache", "model": cfg.model.pretrained, "trainable": cfg.trainer.trainable,
      "layout": list(cfg.sft.share_prompt), "steps": args.steps, "demos": len(demos),
      "order": [m for m, _ in (sides[::-1] if args.cache_first else sides)],
      "sequences": len(seqs), "collect_s": round(collect_s, 1),
      "tokens_mean": round(sum(len(s.token_ids) for s in seqs) / len(seqs), 1),
      "no_cache": results["no_cache"], "cache": results["cache"],
      "ratio_sft_wall": round(results["no_cache"]["sft_wall_s"] / results["cache"]["sft_wall_s"], 3),
      "ratio_s_per_step": round(results["no_cache"]["s_per_step_median"]
                                / results["cache"]["s_per_step_median"], 3),
      "max_abs_dnll": dnll, "load_avg_1m": common.load_avg_1m()})


if __name__ == "__main__":
  app.run(main)
