r"""Evaluation seconds per trial: one trial pool for the whole evaluation against one per
held-out set and mode (sampled, greedy), as the evaluation ran before.

The demo's evaluation has two held-out sets, each run sampled (``eval.samples`` per task) and
greedy. Four pools in sequence each end with a tail in which the engine's batch is partly
empty; one pool (``pipeline.evaluate_held_out``) keeps it full until the last trials. Both
sides evaluate the same policy with the same trial seeds on one engine (``PolicyService``),
after a warm-up pool that compiles the engine's shapes; the one-pool side runs first, so the
prefix cache it leaves favours the four-pool side. The figures are compared for equality.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.eval_pool --num_val=8
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.eval_pool --model=RUN/sft_policy --num_val=32

Prints one JSON line: each side's wall, trials and seconds per trial, their ratio, and
whether the figures are identical.
"""

import os
import tempfile
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_string("model", None,
                    "model.pretrained: a name, .gguf or HF directory (default: the demo's).")
flags.DEFINE_integer("num_val", 8, "Tasks per held-out set (demo: 32).")
flags.DEFINE_integer("samples", 2, "eval.samples (demo: 2).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  args = FLAGS

  from experiments.configs import demo
  from legorl_jax.harnesses import registry
  from legorl_jax.proxy.service import derive_seed
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import eval_stats, multihost, pipeline
  from legorl_jax.trainer.policy_service import PolicyService

  cfg = demo.get_config()
  if args.model:
    cfg.model.pretrained = args.model
  cfg.tasks.num_val, cfg.eval.samples = args.num_val, args.samples
  model, tokenizer = pipeline.build_policy(cfg)
  tasks, extra = pipeline.held_out_tasks(cfg), pipeline.extra_held_out_sets(cfg)
  adapter = registry.get_adapter(cfg.harness.name)
  trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s),
                          max_turns=int(cfg.harness.max_turns),
                          sandbox=SandboxConfig(backend=cfg.sandbox.backend))
  work = tempfile.mkdtemp(prefix="eval_pool_")
  service = PolicyService(model, tokenizer, cfg, os.path.join(work, "sockets"))
  n, temp = int(cfg.eval.samples), float(cfg.sampling.temperature)
  try:
    t0 = time.perf_counter()
    warm = pipeline.held_out_tasks(cfg)[:2]
    multihost.run_shared_trials(warm, [adapter] * len(warm), 1, service.proxy("sample", temp),
                                trial_cfg, os.path.join(work, "warm"),
                                concurrency=int(cfg.rollout.concurrency), max_retries=1)
    warm_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    one = pipeline.evaluate_held_out(service, tasks, extra, adapter, trial_cfg, cfg,
                                     os.path.join(work, "one"))
    one_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    four = {}
    for mode, ts in [("", tasks)] + list(extra.items()):
      for name, t, k in (("sample", temp, n), ("greedy", 0.0, 1)):
        res = multihost.run_shared_trials(
            ts, [adapter] * len(ts), k, service.proxy(name, t), trial_cfg,
            os.path.join(work, "four", f"{mode}_{name}"), concurrency=int(cfg.rollout.concurrency),
            max_retries=int(cfg.rollout.max_retries),
            seed_of=lambda g, s, ts=ts: derive_seed("eval", int(cfg.seed), ts[g].id, s))
        four.update(eval_stats.set_figures(res, greedy=name == "greedy", samples=k,
                                           prefix=f"{mode}/" if mode else ""))
    four_s = time.perf_counter() - t0
  finally:
    service.close()
  trials = sum(len(s) for s in [tasks, *extra.values()]) * (n + 1)
  common.emit({
      "benchmark": "eval_pool", "model": cfg.model.pretrained, "sets": 1 + len(extra),
      "tasks_per_set": args.num_val, "samples": n, "trials": trials,
      "engine_rows": int(cfg.engine.max_batch), "concurrency": int(cfg.rollout.concurrency),
      "warmup_s": round(warm_s, 1),
      "one_pool": {"wall_s": round(one_s, 1), "s_per_trial": round(one_s / trials, 2)},
      "four_pools": {"wall_s": round(four_s, 1), "s_per_trial": round(four_s / trials, 2)},
      "ratio_s_per_trial": round(four_s / one_s, 3), "figures_identical": pipeline.scalars(one) == four,
      "figures": pipeline.scalars(one), "load_avg_1m": common.load_avg_1m()})


if __name__ == "__main__":
  app.run(main)
