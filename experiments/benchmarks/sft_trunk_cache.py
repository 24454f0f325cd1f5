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

import argparse
import json
import os
import statistics
import tempfile
import time


def collect(num_demos: int, workdir: str, cfg, tokenizer):
  from legorl_jax.harnesses import registry
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import pipeline, sft
  _, _, train_tasks = pipeline.load_tasks(cfg)
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
  p.add_argument("--num_demos", type=int, default=320, help="the demo's sft.num_demos")
  p.add_argument("--model", default=None,
                 help="model.pretrained: a name, .gguf or HF directory (default: the demo's)")
  p.add_argument("--steps", type=int, default=160, help="SFT steps per side (the demo's 160)")
  p.add_argument("--cache_mb", type=float, default=2048.0, help="sft.trunk_cache_mb of the cached side")
  p.add_argument("--cache_first", action="store_true",
                 help="run the cached side first (on a busy host, run both orders)")
  args = p.parse_args()

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
    demos = collect(args.num_demos, tempfile.mkdtemp(prefix="sft_trunk_"), cfg, tokenizer)
  collect_s = time.perf_counter() - t0
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, 1.0)]
  results, losses = {}, {}
  sides = [("no_cache", 0.0), ("cache", args.cache_mb)]
  for mode, mb in sides[::-1] if args.cache_first else sides:
    c = pipeline.sft_config(cfg)
    learner = Learner(model, c, seed=int(cfg.seed))
    walls, nll, last = [], [], {}
    marks = [time.perf_counter()]

    def on_step(step, m, walls=walls, nll=nll, marks=marks, last=last):
      now = time.perf_counter()
      walls.append(now - marks[0])
      marks[0] = now
      nll.append(float(m["nll"]))
      last.update(m)

    cpu0, t1 = time.process_time(), time.perf_counter()
    sft.run_sft(learner, demos, c, steps=args.steps, seed=int(cfg.seed), on_step=on_step,
                trunk_cache_mb=mb)
    wall = time.perf_counter() - t1
    losses[mode] = nll
    steady = walls[2:] or walls
    results[mode] = {"sft_wall_s": round(wall, 1), "cpu_s": round(time.process_time() - cpu0, 1),
                     "s_per_step_median": round(statistics.median(steady), 3),
                     "first_steps_s": [round(w, 1) for w in walls[:2]],
                     "last_nll": round(nll[-1], 4)}
    if mb:
      results[mode].update({k.split("/")[1]: (round(v, 1) if isinstance(v, float) else v)
                            for k, v in last.items() if k.startswith("trunk_cache/")})
  dnll = max(abs(a - b) for a, b in zip(losses["no_cache"], losses["cache"]))
  print(json.dumps({
      "benchmark": "sft_trunk_cache", "model": cfg.model.pretrained, "trainable": cfg.trainer.trainable,
      "layout": list(cfg.sft.share_prompt), "steps": args.steps, "demos": len(demos),
      "order": [m for m, _ in (sides[::-1] if args.cache_first else sides)],
      "sequences": len(seqs), "collect_s": round(collect_s, 1),
      "tokens_mean": round(sum(len(s.token_ids) for s in seqs) / len(seqs), 1),
      "no_cache": results["no_cache"], "cache": results["cache"],
      "ratio_sft_wall": round(results["no_cache"]["sft_wall_s"] / results["cache"]["sft_wall_s"], 3),
      "ratio_s_per_step": round(results["no_cache"]["s_per_step_median"]
                                / results["cache"]["s_per_step_median"], 3),
      "max_abs_dnll": dnll, "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
  main()
