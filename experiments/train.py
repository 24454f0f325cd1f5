r"""Harness-native RL training.

  python -m experiments.train --config=experiments/configs/demo.py --workdir=/tmp/legorl_demo
  python -m experiments.train --config=experiments/configs/demo.py --workdir=DIR \
      --config.trainer.mode=async --config.trainer.steps=20

Running again with the same ``--workdir`` resumes from its latest checkpoint.
``--from_screen=SFT_WORKDIR/screen/screen.json`` starts RL from the screen's top-ranked SFT
checkpoint at its temperature (``experiments.screen``; no SFT phase).
"""

import json
import logging

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", "experiments/configs/demo.py", "Training config file.")
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, trials, summary).")
flags.DEFINE_string("from_screen", None, "A screen's JSON: start from its best checkpoint and "
                    "temperature (experiments.screen).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save at INFO
  logging.getLogger("jax").setLevel(logging.WARNING)
  from legorl_jax.sharding import distributed
  distributed.initialize_from_config(FLAGS.config)  # before anything touches a device
  from legorl_jax.trainer import pipeline
  from legorl_jax.metrics import plot

  cfg = FLAGS.config
  if FLAGS.from_screen:
    from legorl_jax.trainer import screen
    cfg = screen.apply_best(cfg, FLAGS.from_screen)
    print(f"from the screen: {cfg.model.checkpoint} at T={cfg.sampling.temperature:g}", flush=True)
  summary = pipeline.run(cfg, FLAGS.workdir)
  if not distributed.is_coordinator():
    return  # process 0 reports for the whole run
  print(json.dumps(summary, indent=2, sort_keys=True))
  path = plot.write_curves(FLAGS.workdir)
  print(f"curves: {path}")
  before, after = summary.get("val_solve_rate_before_rl"), summary.get("val_solve_rate_after_rl")
  if before is not None and after is not None:
    print(f"held-out solve rate at T={cfg.sampling.temperature}: "
          f"{before:.3f} before RL -> {after:.3f} after RL ({100 * (after - before):+.1f} points)")
  from legorl_jax.trainer import eval_stats
  for mode in ("", *(m for m in ("names_demo", "names_rl", "templates", "names")
                     if f"val_{m}_solve_rate_delta_rl" in summary)):
    line = eval_stats.gain_sentence(summary, mode)
    if line:
      print(line)
  guard = eval_stats.guard_sentence(summary)
  if guard:
    print(guard)


if __name__ == "__main__":
  app.run(main)
