r"""Writes a run's dashboard: one self-contained HTML page.

  python -m experiments.dashboard --workdir=/tmp/legorl_demo   # -> /tmp/legorl_demo/dashboard.html
"""

import json
import os

from absl import app, flags

flags.DEFINE_string("workdir", None, "Run directory written by experiments.train.")
flags.DEFINE_string("out", None, "Output path (default: WORKDIR/dashboard.html).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from legorl_jax.metrics import dashboard
  from legorl_jax.models import tokenizer as tok_lib

  tokenizer = None
  cfg_path = os.path.join(FLAGS.workdir, "config.json")
  try:
    source = None
    if os.path.exists(cfg_path):
      with open(cfg_path) as f:
        model = json.load(f).get("model", {})
      source = model.get("tokenizer") or model.get("checkpoint") or None
    tokenizer = tok_lib.load_tokenizer(source, require_chat_template=False)
  except Exception as e:  # noqa: BLE001 -- the page still renders with token ids
    print(f"note: no tokenizer ({e}); showing token ids")
  print(dashboard.write(FLAGS.workdir, tokenizer, FLAGS.out))


if __name__ == "__main__":
  app.run(main)
