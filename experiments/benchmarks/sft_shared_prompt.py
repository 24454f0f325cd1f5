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

import argparse
import json
import os
import statistics
import tempfile
import time


def collect(num_demos: int, workdir: str, cfg):
  from legorl_jax.harnesses import registry
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import pipeline, sft
  _, _, train_tasks = pipeline.load_tasks(cfg)
  _, tokenizer = pipeline.build_policy(cfg)
  adapter = registry.get_adapter(cfg.harness.name.split(":")[0])
  trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s),
                          max_turns=int(cfg.harness.max_turns),
                          sandbox=SandboxConfig(backend=cfg.sandbox.backend))
  return sft.collect_demonstrations(train_tasks[:num_demos], lambda t: adapter, tokenizer, trial_cfg,
                                    os.path.join(workdir, "demos"), os.path.join(workdir, "sockets"),
                                    concurrency=int(cfg.rollout.concurrency))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--demos", default=None, help="a demos.jsonl (default: collect --num_demos)")
  p.add_argument("--num_demos", type=int, default=128)
  p.add_argument("--steps", type=int, default=20, help="timed steps per layout (after 3 warm-up)")
  p.add_argument("--branches", type=int, default=8)
  p.add_argument("--rows", type=int, default=2, help="shared rows per step")
  p.add_argument("--plain_micro", type=int, default=1, help="micro-batches of a plain step")
  p.add_argument("--shared_micro", type=int, default=1, help="micro-batches of a shared step")
  args = p.parse_args()

  from experiments.configs import demo_tiny as demo
  from legorl_jax.trainer import batching
  from legorl_jax.trainer import pipeline, sft
  from legorl_jax.trainer.learner import Learner

  cfg = demo.get_config()
  t0 = time.perf_counter()
  if args.demos:
    demos = sft.load_demonstrations(args.demos)
  else:
    demos = collect(args.num_demos, tempfile.mkdtemp(prefix="sft_shared_"), cfg)
  collect_s = time.perf_counter() - t0
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, 1.0)]
  if len(seqs) < 2:
    raise SystemExit("need at least two demonstrations")
  common = batching.shared_prompt_length(seqs)
  branch = -(-(max(len(s.token_ids) for s in seqs) - common + 1) // 8) * 8
  per_step = args.branches * args.rows
  model, _ = pipeline.build_policy(cfg)
  results = {}
  for mode in ("plain", "shared"):
    c = pipeline.sft_config(cfg)
    c.trainer.rows_per_batch = per_step
    c.trainer.micro_batches = args.plain_micro if mode == "plain" else args.shared_micro
    c.trainer.share_prompt = ((common - 1, branch, args.branches, args.rows) if mode == "shared"
                              else ())
    learner = Learner(model, c, seed=0)
    sft.run_sft(learner, demos, c, steps=3, seed=0)  # compiles the common shapes
    walls, cpus = [], []
    marks = [time.perf_counter(), time.process_time()]

    def on_step(step, m, walls=walls, cpus=cpus, marks=marks):
      now = [time.perf_counter(), time.process_time()]
      walls.append(now[0] - marks[0])
      cpus.append(now[1] - marks[1])
      marks[:] = now

    last = sft.run_sft(learner, demos, c, steps=args.steps, seed=1, on_step=on_step)
    # medians: a step that meets a new scored-token cap compiles once, which is not step time
    results[mode] = {"s_per_step_median": round(statistics.median(walls), 4),
                     "cpu_s_per_step_median": round(statistics.median(cpus), 4),
                     "s_per_step_mean": round(sum(walls) / len(walls), 4),
                     "last_nll": round(float(last["nll"]), 4),
                     "layout": list(c.trainer.share_prompt) or None}
  print(json.dumps({
      "benchmark": "sft_shared_prompt", "demos": len(seqs), "collect_s": round(collect_s, 1),
      "demo_tokens_mean": round(sum(len(s.token_ids) for s in seqs) / len(seqs), 1),
      "common_prefix_tokens": common, "demos_per_step": per_step, "buckets": list(cfg.sft.buckets),
      "micro_batches": {"plain": args.plain_micro, "shared": args.shared_micro},
      "plain": results["plain"], "shared": results["shared"],
      "ratio_wall": round(results["plain"]["s_per_step_median"] / results["shared"]["s_per_step_median"], 3),
      "ratio_cpu": round(results["plain"]["cpu_s_per_step_median"]
                         / results["shared"]["cpu_s_per_step_median"], 3),
      "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
  main()
