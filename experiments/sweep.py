r"""The sweep: short RL arms from one saved SFT start, ranked (issue 44, item 5).

  python -m experiments.sweep --config=experiments/configs/rl_long.py --workdir=/tmp/sweep \
      --from_screen=/tmp/sft/screen/screen.json \
      --config.sweep.arms="('base', 'lr3e-5 optim.learning_rate=3e-5', 'top8 trainer.trainable=top:8', 't08 temperature=0.8')"

Every arm (``"NAME key=value ..."``, ``trainer.sweep``) runs ``sweep.steps`` RL steps from the
same SFT checkpoint (``--start``, or the screen's top row with its temperature), with the
config's evaluations before and after, into ``WORKDIR/NAME``; then one table ranks them by the
share of mixed RL groups, training solve rate and held-out gain with its SE, written to
``WORKDIR/sweep.json`` and ``sweep.txt``. Running it again skips arms that finished.
"""

import json

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", "experiments/configs/rl_long.py", "Training config file.")
flags.DEFINE_string("workdir", None, "The sweep's directory (one run directory per arm).")
flags.DEFINE_string("start", None, "The SFT checkpoint every arm starts from.")
flags.DEFINE_string("from_screen", None, "A screen's JSON: start from its top row's checkpoint "
                    "at its temperature (experiments.screen).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  from legorl_jax import errors
  from legorl_jax.trainer import screen, sweep

  cfg = FLAGS.config
  if FLAGS.from_screen:
    cfg = screen.apply_best(cfg, FLAGS.from_screen)
  start = FLAGS.start or (cfg.model.checkpoint if FLAGS.from_screen else "")
  if not start:
    raise errors.ConfigError("give --start=SFT_CHECKPOINT or --from_screen=SCREEN_JSON.")
  out = sweep.run_sweep(cfg, FLAGS.workdir, start, list(cfg.sweep.arms), int(cfg.sweep.steps))
  print(out["table"])
  print(json.dumps({"sweep": [{k: r[k] for k in ("rank", "name", "mixed_share", "train_solve_rate",
                                                 "gain", "gain_se", "gain_z")} for r in out["rows"]]}))


if __name__ == "__main__":
  app.run(main)
