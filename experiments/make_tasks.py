"""Writes synthetic bug-fix tasks (JSONL) and, optionally, the TFDS array_record dataset.

  python -m experiments.make_tasks --out_dir=/tmp/tasks --num_train=150 --num_validation=40 \
      --difficulty=easy --seed=0 --build_tfds
  python -m experiments.make_tasks --swebench=swe.jsonl --out_dir=/tmp/swe   # import SWE-bench style
"""

import json
import os

from absl import app, flags, logging

from legorl_jax.tasks import jsonl
from legorl_jax.tasks.synthetic import generate_tasks

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", None, "Directory for train.jsonl / validation.jsonl (and tfds/).", required=True)
flags.DEFINE_integer("num_train", 100, "Synthetic training tasks.")
flags.DEFINE_integer("num_validation", 30, "Synthetic validation tasks.")
flags.DEFINE_enum("difficulty", "easy", ["hinted", "easy", "medium", "hard"], "Synthetic task difficulty.")
flags.DEFINE_integer("seed", 0, "Generation seed.")
flags.DEFINE_bool("build_tfds", False, "Also build the array_record TFDS dataset under out_dir/tfds.")
flags.DEFINE_string("swebench", None, "Import this SWE-bench-style JSONL instead of generating tasks.")


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  files = {}
  if FLAGS.swebench:
    from legorl_jax.tasks.swebench import import_swebench_jsonl
    tasks, errors = import_swebench_jsonl(FLAGS.swebench)
    for e in errors:
      logging.warning("skipped: %s", e)
    files["train"] = os.path.join(FLAGS.out_dir, "train.jsonl")
    jsonl.write_tasks_jsonl(files["train"], tasks)
  else:
    for split, n in (("train", FLAGS.num_train), ("validation", FLAGS.num_validation)):
      if n > 0:
        tasks = generate_tasks(n, seed=FLAGS.seed, difficulty=FLAGS.difficulty, split=split)
        files[split] = os.path.join(FLAGS.out_dir, f"{split}.jsonl")
        jsonl.write_tasks_jsonl(files[split], tasks)
  summary = {split: sum(1 for _ in open(path)) for split, path in files.items()}
  if FLAGS.build_tfds:
    from legorl_jax.tasks.tfds_builder import build_task_dataset
    summary["tfds_dir"] = build_task_dataset(files, os.path.join(FLAGS.out_dir, "tfds"))
  print(json.dumps(summary))


if __name__ == "__main__":
  app.run(main)
