"""Writes synthetic bug-fix tasks (JSONL) and, optionally, the TFDS array_record dataset.

  python -m experiments.make_tasks --out_dir=/tmp/tasks --num_train=150 --num_validation=40 \
      --difficulty=easy --seed=0 --build_tfds
  python -m experiments.make_tasks --swebench=swe.jsonl --out_dir=/tmp/swe   # import SWE-bench style
  python -m experiments.make_tasks --from_repo=PATH --out=tasks.jsonl         # mutate a real project
  python -m experiments.make_tasks --pypi=inflection==0.5.1 --out=tasks.jsonl  # ... from its sdist

--from_repo / --pypi build SWE-smith-style tasks from a Python project's own test suite
(``legorl_jax.taskgen.repo``): PATH is a directory, a git checkout or an sdist archive.
"""

import json
import os

from absl import app, flags, logging

from legorl_jax.tasks import jsonl
from legorl_jax.taskgen.synthetic import generate_tasks

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", None, "Directory for train.jsonl / validation.jsonl (and tfds/).")
flags.DEFINE_integer("num_train", 100, "Synthetic training tasks.")
flags.DEFINE_integer("num_validation", 30, "Synthetic validation tasks.")
flags.DEFINE_enum("difficulty", "easy", ["hinted", "easy", "medium", "hard"], "Synthetic task difficulty.")
flags.DEFINE_integer("seed", 0, "Generation seed.")
flags.DEFINE_bool("build_tfds", False, "Also build the array_record TFDS dataset under out_dir/tfds.")
flags.DEFINE_string("swebench", None, "Import this SWE-bench-style JSONL instead of generating tasks.")
# Tasks from a real repository (SWE-smith style).
flags.DEFINE_string("from_repo", None, "Project directory, git checkout or sdist archive to mutate.")
flags.DEFINE_string("pypi", None, "NAME==VERSION: fetch this release's sdist and mutate it.")
flags.DEFINE_string("out", None, "Task JSONL to write (with --from_repo / --pypi).")
flags.DEFINE_string("tfds_dir", None, "With --from_repo / --pypi and --build_tfds: the dataset dir "
                    "(default: OUT without .jsonl, plus .tfds).")
flags.DEFINE_enum("sandbox", "docker", ["docker", "local"], "Where the suite runs: docker (an image "
                  "per repository) or local (bubblewrap; dependencies installed on the host).")
flags.DEFINE_integer("max_mutations", 150, "Most mutations to try (each is one run of the suite).")
flags.DEFINE_integer("max_tasks", 40, "Stop once this many mutations were kept.")
flags.DEFINE_integer("max_per_function", 2, "Most tasks per function.")
flags.DEFINE_float("run_timeout_s", None, "Timeout of one suite run (default 3x the baseline + 30s).")
flags.DEFINE_float("time_budget_s", 1200.0, "Wall-clock budget of the mutation phase.")
flags.DEFINE_bool("allow_failing_tests", False, "Leave out tests that fail before any mutation "
                  "(default: such a suite is an error).")
flags.DEFINE_list("extras", None, "Extras of the project to install (default: test/tests/testing if declared).")
flags.DEFINE_list("requirements", [], "More pip requirements for the image (test dependencies).")
flags.DEFINE_list("pytest_args", [], "More pytest arguments, comma-separated.")
flags.DEFINE_bool("validate", True, "Check each task with the verifier (fails as shipped, gold patch solves).")


def _repo_main():
  from legorl_jax.errors import SandboxError, TaskError
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.taskgen.repo import BuildConfig, build_tasks
  from legorl_jax.taskgen.repo.source import fetch_pypi_sdist
  if bool(FLAGS.from_repo) == bool(FLAGS.pypi) or not FLAGS.out:
    raise app.UsageError("give --out=FILE.jsonl and exactly one of --from_repo=PATH or --pypi=NAME==VERSION")
  tfds_dir = None
  if FLAGS.build_tfds:
    tfds_dir = FLAGS.tfds_dir or FLAGS.out.removesuffix(".jsonl") + ".tfds"
  config = BuildConfig(
      sandbox=SandboxConfig(backend=FLAGS.sandbox), max_mutations=FLAGS.max_mutations,
      max_tasks=FLAGS.max_tasks, max_per_function=FLAGS.max_per_function, seed=FLAGS.seed,
      run_timeout_s=FLAGS.run_timeout_s, time_budget_s=FLAGS.time_budget_s,
      allow_failing_tests=FLAGS.allow_failing_tests, validate=FLAGS.validate,
      extras=tuple(FLAGS.extras) if FLAGS.extras is not None else None,
      requirements=tuple(FLAGS.requirements), pytest_args=tuple(FLAGS.pytest_args))
  try:
    path, origin = FLAGS.from_repo, FLAGS.from_repo
    if FLAGS.pypi:
      path, origin = fetch_pypi_sdist(FLAGS.pypi), FLAGS.pypi
    report = build_tasks(path, FLAGS.out, config, origin=origin, tfds_dir=tfds_dir)
  except (TaskError, SandboxError) as e:  # bad input or build error: nothing was written
    raise SystemExit(f"make_tasks: {e}") from None
  print(json.dumps(report.to_dict(), sort_keys=True))


def main(argv):
  del argv
  if FLAGS.from_repo or FLAGS.pypi:
    return _repo_main()
  if not FLAGS.out_dir:
    raise app.UsageError("give --out_dir (synthetic / --swebench tasks) or --from_repo / --pypi with --out")
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
