r"""Supervised warm start from recorded trajectories.

Collects scripted demonstrations through the configured harness (or reads ``--demos``), trains
with token NLL on the sampled tokens, and saves the policy as a Hugging Face checkpoint; with
``sft.save_at`` also after those steps, in ``WORKDIR/sft_checkpoints/step_N`` (the candidates
of ``experiments.screen``).

  python -m experiments.sft --config=experiments/configs/demo.py --workdir=/tmp/sft --out=/tmp/sft/hf
  python -m experiments.sft --config=experiments/configs/demo.py --workdir=/tmp/sft \
      --config.sft.demos=/tmp/sft/sft_demos/demos.jsonl --config.sft.steps=500
"""

import os

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", "experiments/configs/demo.py", "Config file.")
flags.DEFINE_string("workdir", None, "Run directory.")
flags.DEFINE_string("out", None, "Where to save the HF checkpoint (default WORKDIR/hf).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  import numpy as np
  from legorl_jax.harnesses import registry
  from legorl_jax.metrics.writer import MetricsWriter
  from legorl_jax.models import save_pretrained
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import config_check, pipeline, screen, sft
  from legorl_jax.trainer.learner import Learner

  cfg = FLAGS.config
  config_check.validate(cfg)
  screen.save_at_steps(cfg)  # a malformed sft.save_at fails before any work
  os.makedirs(FLAGS.workdir, exist_ok=True)
  model, tokenizer = pipeline.build_policy(cfg)
  if cfg.sft.demos:
    demos = sft.load_demonstrations(cfg.sft.demos)
  else:
    _, _, train_tasks = pipeline.load_tasks(cfg)
    adapter = registry.get_adapter(cfg.harness.eval_name or cfg.harness.name.split(":")[0])
    trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s),
                            max_turns=int(cfg.harness.max_turns),
                            sandbox=SandboxConfig(backend=cfg.sandbox.backend))
    demos = sft.collect_demonstrations(train_tasks[:int(cfg.sft.num_demos)], lambda t: adapter,
                                       tokenizer, trial_cfg, os.path.join(FLAGS.workdir, "sft_demos"),
                                       os.path.join(FLAGS.workdir, "sockets"),
                                       concurrency=int(cfg.rollout.concurrency),
                                       minimal_edits=bool(cfg.sft.get("minimal_edits", False)))
  sft_cfg = pipeline.sft_config(cfg)
  learner = Learner(model, sft_cfg, seed=int(cfg.seed))
  writer = MetricsWriter(FLAGS.workdir)

  def on_step(step, m):
    writer.write(step, m, phase="sft")
    saved = screen.save_if_due(learner, step + 1, cfg, FLAGS.workdir, tokenizer)
    if saved:
      print(f"[sft {step + 1:4d}] saved {saved}", flush=True)
    if step % 10 == 0:
      print(f"[sft {step:4d}] nll {m['nll']:.4f}", flush=True)

  sft.run_sft(learner, demos, sft_cfg, steps=int(cfg.sft.steps), seed=int(cfg.seed), on_step=on_step)
  writer.close()
  out = FLAGS.out or os.path.join(FLAGS.workdir, "hf")
  save_pretrained(learner.model(), out, tokenizer=tokenizer)
  print(f"saved {out}")


if __name__ == "__main__":
  app.run(main)
