r"""The screen: score SFT checkpoints at a few temperatures and pick the RL start (issue 44).

  python -m experiments.sft --config=experiments/configs/rl_long.py --workdir=/tmp/sft \
      --config.sft.save_at='(20, 40, 80, 160)'
  python -m experiments.screen --config=experiments/configs/rl_long.py --workdir=/tmp/sft

Scores every ``WORKDIR/sft_checkpoints/step_N`` (or ``--config.screen.checkpoints``) at each
``screen.temperatures`` on ``screen.bugs`` RL-pool bugs under their training names,
``screen.samples`` samples each (``trainer.screen``: pass@1, pass@k, share of bugs mixed, token
entropy). Prints one table, best row first, writes ``WORKDIR/screen/screen.json`` and
``screen.txt``, and prints the flags that start RL from the top row; ``experiments.train
--from_screen=WORKDIR/screen/screen.json`` applies them.
"""

import json

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", "experiments/configs/rl_long.py", "Training config file.")
flags.DEFINE_string("workdir", None, "The SFT run's directory (its sft_checkpoints/).")
flags.DEFINE_string("out", None, "Where the screen writes (default WORKDIR/screen).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  from legorl_jax.trainer import config_check, screen, screen_run

  cfg = FLAGS.config
  config_check.validate(cfg)
  checkpoints = list(cfg.screen.get("checkpoints", ()) or ()) or screen.saved_checkpoints(FLAGS.workdir)
  out = screen_run.run_screen(cfg, FLAGS.workdir, checkpoints, out_dir=FLAGS.out)
  print(out["table"])
  best = out["best"]
  print(f"\nbest: {best['checkpoint']} at T={best['temperature']:g}; start RL from it with\n  "
        + " \\\n  ".join(out["overrides"]))
  print(json.dumps({"screen": [{k: r[k] for k in ("rank", "checkpoint", "temperature", "pass1",
                                                  "pass_k", "mixed_share", "token_entropy")}
                               for r in out["rows"]]}))


if __name__ == "__main__":
  app.run(main)
