r"""SFT step time on harness demonstrations: plain rows vs shared-prompt rows.

Every demonstration collected through a harness starts with the same system prompt and tool
list (~280 of ~440 tokens for the built-in harness and the bundled tokenizer). Plain rows
compute that prompt once per demonstration; ``sft.share_prompt`` rows hold the prompt once
and ``--branches`` demonstrations behind it (``batching.make_grouped_batches``). Both sides
train the demo configuration's policy with the same number of demonstrations per step, one
after the other in this process; the shared layout is sized from the demonstrations (prefix =
their common prefix, branch = the longest rest, rounded up to 8).

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sft_shared_prompt --num_demos=128
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sft_shared_prompt --demos=RUN/sft_demos/demos.jsonl

Prints one JSON line: median seconds and CPU-seconds per step for each layout and their ratios.
"""

import statistics
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_string("demos", None, "A demos.jsonl (default: collect --num_demos).")
flags.DEFINE_integer("num_demos", 128, "Demonstrations to collect.")
flags.DEFINE_integer("steps", 20, "Timed steps per layout (after 3 warm-up).")
flags.DEFINE_integer("branches", 8, "Demonstrations behind each shared prompt.")
flags.DEFINE_integer("rows", 2, "Shared rows per step.")
flags.DEFINE_integer("plain_micro", 1, "Micro-batches of a plain step.")
flags.DEFINE_integer("shared_micro", 1, "Micro-batches of a shared step.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  args = FLAGS
  from experiments.configs import demo_tiny as demo
  from legorl_jax.trainer import batching
  from legorl_jax.trainer import pipeline, sft
  from legorl_jax.trainer.learner import Learner

  cfg = demo.get_config()
  t0 = time.perf_counter()
  if args.demos:
    demos = sft.load_demonstrations(args.demos)
  else:
    demos = common.collect_demos(args.num_demos, tempfile.mkdtemp(prefix="sft_shared_"), cfg)
  collect_s = time.perf_counter() - t0
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, 1.0)]
  if len(seqs) < 2:
    raise SystemExit("need at least two demonstrations")
  shared_len = batching.shared_prompt_length(seqs)
  branch = -(-(max(len(s.token_ids) for s in seqs) - shared_len + 1) // 8) * 8
  per_step = args.branches * args.rows
  model, _ = pipeline.build_policy(cfg)
  results = {}
  for mode in ("plain", "shared"):
    c = pipeline.sft_config(cfg)
    c.trainer.rows_per_batch = per_step
    c.trainer.micro_batches = args.plain_micro if mode == "plain" else args.shared_micro
    c.trainer.share_prompt = ((shared_len - 1, branch, args.branches, args.rows) if mode == "shared"
                              else ())
    learner = Learner(model, c, seed=0)
    sft.run_sft(learner, demos, c, steps=3, seed=0)  # compiles the common shapes
    walls, cpus = [], []
    last = sft.run_sft(learner, demos, c, steps=args.steps, seed=1,
                       on_step=common.step_timer(walls, cpus))
    # medians: a step that meets a new scored-token cap compiles once, which is not step time
    results[mode] = {"s_per_step_median": round(statistics.median(walls), 4),
                     "cpu_s_per_step_median": round(statistics.median(cpus), 4),
                     "s_per_step_mean": round(sum(walls) / len(walls), 4),
                     "last_nll": round(float(last["nll"]), 4),
                     "layout": list(c.trainer.share_prompt) or None}
  common.emit({
      "benchmark": "sft_shared_prompt", "demos": len(seqs), "collect_s": round(collect_s, 1),
      "demo_tokens_mean": round(sum(len(s.token_ids) for s in seqs) / len(seqs), 1),
      "common_prefix_tokens": shared_len, "demos_per_step": per_step, "buckets": list(cfg.sft.buckets),
      "micro_batches": {"plain": args.plain_micro, "shared": args.shared_micro},
      "plain": results["plain"], "shared": results["shared"],
      "ratio_wall": round(results["plain"]["s_per_step_median"] / results["shared"]["s_per_step_median"], 3),
      "ratio_cpu": round(results["plain"]["cpu_s_per_step_median"]
                         / results["shared"]["cpu_s_per_step_median"], 3),
      "load_avg_1m": common.load_avg_1m()})


if __name__ == "__main__":
  app.run(main)
