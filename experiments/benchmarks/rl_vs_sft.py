r"""Does RL beat more SFT? The demo's RL phase against an equal-time SFT continuation.

Takes a finished demo run: its warm-started policy (``WORKDIR/sft_policy``), its demonstrations
(``WORKDIR/sft_demos/demos.jsonl``) and its RL wall time (``summary.json``'s ``rl_s``). Continues
SFT from that same policy on the same demonstrations for the same wall time, then evaluates on
the same held-out tasks with the same harness, temperature and samples per task, and prints the
two phases side by side.

  python -m experiments.train --config=experiments/configs/demo.py --workdir=/tmp/legorl_demo
  python -m experiments.benchmarks.rl_vs_sft --workdir=/tmp/legorl_demo
"""

import json
import os
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_string("workdir", None, "A finished demo run's directory.")
flags.DEFINE_float("seconds", None, "SFT time budget (default: the run's RL wall time).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  import ml_collections
  from legorl_jax.harnesses import registry
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import pipeline, sft
  from legorl_jax.trainer.learner import Learner
  from legorl_jax.trainer.policy_service import PolicyService

  wd = FLAGS.workdir
  with open(os.path.join(wd, "config.json")) as f:
    cfg = ml_collections.ConfigDict(json.load(f))
  with open(os.path.join(wd, "summary.json")) as f:
    summary = json.load(f)
  budget = FLAGS.seconds if FLAGS.seconds is not None else float(summary["rl_s"])
  out_dir = os.path.join(wd, "sft_continuation")
  os.makedirs(out_dir, exist_ok=True)

  cfg = pipeline.from_sft_policy(cfg, wd)
  model, tokenizer = pipeline.build_policy(cfg)
  demos = sft.load_demonstrations(os.path.join(wd, "sft_demos", "demos.jsonl"))
  sft_cfg = pipeline.sft_config(cfg)
  learner = Learner(model, sft_cfg, seed=int(cfg.seed) + 1)
  t0 = time.perf_counter()
  last = sft.run_sft(learner, demos, sft_cfg, steps=10**9, seed=int(cfg.seed) + 1, max_seconds=budget)
  sft_s = time.perf_counter() - t0

  _, val_tasks, _ = pipeline.load_tasks(cfg)
  extra_sets = pipeline.extra_held_out_sets(cfg)
  adapter = registry.get_adapter(cfg.harness.eval_name or cfg.harness.name.split(":")[0])
  trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s), max_turns=int(cfg.harness.max_turns),
                          sandbox=SandboxConfig(backend=cfg.sandbox.backend))
  service = PolicyService(learner.model(), tokenizer, cfg, os.path.join(out_dir, "sockets"))
  try:
    ev = pipeline.evaluate_held_out(service, val_tasks, extra_sets, adapter, trial_cfg, cfg,
                                    os.path.join(out_dir, "eval"))
  finally:
    service.close()
  n = int(cfg.eval.samples)
  line = {"benchmark": "rl_vs_sft", "workdir": wd, "policy": summary.get("policy"),
          "trainable": summary.get("trainable"), "seconds": budget, "sft_continuation_s": sft_s,
          "sft_continuation_steps": last.get("sft_step", 0), "load_avg_1m": common.load_avg_1m()}
  # One table per held-out set: the main one ("val_..." in summary.json), then the extras
  # ("val_MODE_...").
  for mode in ("", *extra_sets):
    pre, evk = (f"val_{mode}_", f"{mode}/") if mode else ("val_", "")
    title = f"held-out ({mode or cfg.tasks.get('held_out', 'templates')})"
    rows = {
        "after SFT (start of RL)": [summary.get(f"{pre}{k}_before_rl")
                                    for k in ("solve_rate", "greedy_solve_rate", f"pass@{n}")],
        f"+ RL ({summary['rl_s']:.0f} s)": [summary.get(f"{pre}{k}_after_rl")
                                             for k in ("solve_rate", "greedy_solve_rate", f"pass@{n}")],
        f"+ SFT ({sft_s:.0f} s, {last.get('sft_step', 0)} steps)": [
            ev.get(f"{evk}{k}") for k in ("solve_rate", "greedy_solve_rate", f"pass@{n}")],
    }
    print(f"{title:38} {'sampled':>8} {'greedy':>8} {'pass@' + str(n):>8}")
    for name, vals in rows.items():
      print(f"{name:38} " + " ".join(f"{v if v is not None else float('nan'):8.3f}" for v in vals))
    for label, (s_, g, p) in zip(("before", "after_rl", "after_sft_continuation"), rows.values()):
      line.update({f"{pre}solve_rate_{label}": s_, f"{pre}greedy_{label}": g,
                   f"{pre}pass@{n}_{label}": p})
  common.emit(line)


if __name__ == "__main__":
  app.run(main)
