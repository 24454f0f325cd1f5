r"""Prints a training run's RL steps and held-out evaluations as Markdown tables.

  python -m experiments.report --workdir=/tmp/legorl_long

Read from the run's ``metrics.jsonl`` and ``trials.jsonl`` (works on a run still in progress):
one line per RL step (training solve rate, draws, mixed groups, KL to the start, entropy, clip
fractions, seconds), and one line per held-out set and evaluation (before RL, every
``eval.every`` steps, after RL) with the paired gain over the before-RL evaluation; each set's
bugs by family at its first and last evaluation (how many any sample solved: RL's reach); with
pass-rate sampling, the RL pool's bugs with their visits and solve-rate estimates.
"""

import os

from absl import app, flags

flags.DEFINE_string("workdir", None, "Run directory written by experiments.train.")
flags.DEFINE_string("out", None, "Also write the tables to this file.")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from legorl_jax import errors
  from legorl_jax.trainer import run_report

  if not os.path.exists(os.path.join(FLAGS.workdir, "metrics.jsonl")):
    raise errors.ConfigError(f"{FLAGS.workdir}/metrics.jsonl is missing: pass --workdir=DIR of a "
                             "run that experiments.train wrote.")
  text = run_report.report(FLAGS.workdir)
  print(text, end="")
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(text)


if __name__ == "__main__":
  app.run(main)
