"""Synthetic tasks: real repositories whose hidden tests fail before and pass after the gold patch.

Checked independently of the project's own runner: the repository is unpacked with tarfile,
the gold patch applied with `git apply`, and the hidden tests run with pytest.
"""

import collections
import io
import os
import subprocess
import sys
import tarfile

import pytest

from legorl_jax.taskgen.synthetic import generate_task_pool, generate_tasks, split_of
from legorl_jax.taskgen.synthetic.generator import TEMPLATES


@pytest.fixture(scope="module")
def easy_train():
  return generate_task_pool("easy", "train")


def _unpack(task, dest):
  with tarfile.open(fileobj=io.BytesIO(task.repo.data)) as tf:
    tf.extractall(dest, filter="data")


def _pytest(dest, task):
  for path, text in task.hidden_tests.items():
    os.makedirs(os.path.dirname(os.path.join(dest, path)), exist_ok=True)
    open(os.path.join(dest, path), "w").write(text)
  env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
  p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                      *task.verifier.test_files], cwd=dest, capture_output=True, text=True, env=env)
  passed = {l.split(" ", 1)[1].strip() for l in p.stdout.splitlines() if l.startswith("PASSED ")}
  return passed


def _sample(pool, per_family=1):
  by = collections.defaultdict(list)
  for t in pool:
    by[t.metadata.extra["family"]].append(t)
  return [t for fam in sorted(by) for t in by[fam][:per_family]]


def test_gold_patch_flips_exactly_the_fail_to_pass_tests(tmp_path, easy_train):
  tasks = _sample(easy_train) + [t for t in generate_task_pool("hard", "validation")
                                 if t.metadata.extra["family"] == "missing_edge_case"][:1]
  assert {t.metadata.extra["family"] for t in tasks} >= {"wrong_operator", "wrong_constant", "wrong_return",
                                                         "off_by_one", "missing_edge_case"}
  for i, task in enumerate(tasks):
    before, after = tmp_path / f"b{i}", tmp_path / f"a{i}"
    _unpack(task, before)
    _unpack(task, after)
    for path in task.hidden_tests:
      assert not (before / path).exists(), "hidden tests must not ship with the repository"
    subprocess.run(["git", "init", "-q"], cwd=after, check=True)
    p = subprocess.run(["git", "apply", "-"], cwd=after, input=task.gold_patch, text=True, capture_output=True)
    assert p.returncode == 0, p.stderr
    passed_before, passed_after = _pytest(before, task), _pytest(after, task)
    assert set(task.test_ids) == passed_after, task.id
    assert set(task.pass_to_pass) == passed_before, task.id
    assert task.fail_to_pass and not set(task.fail_to_pass) & passed_before


def test_easy_tasks_are_single_exact_string_edits(easy_train):
  for task in easy_train:
    extra = task.metadata.extra
    files = {}
    with tarfile.open(fileobj=io.BytesIO(task.repo.data)) as tf:
      for m in tf.getmembers():
        files[m.name] = tf.extractfile(m).read().decode()
    rel = f"{[t for t in TEMPLATES if t.name == extra['template']][0].package}/{extra['module']}.py"
    src = files[rel]
    assert src.count(extra["bug_new"]) == 1, task.id   # edit(path, old=bug_new, new=bug_old) works
    assert "\n" not in extra["bug_old"]
    assert rel in task.instruction and f"`{extra['function']}`" in task.instruction
    assert "should return" in task.instruction
    assert len(src.splitlines()) < 60
    assert [p for p in files if p.endswith(".py") and not p.startswith("tests/")] == [
        p for p in files if p.endswith(".py") and not p.startswith("tests/")]
    assert extra["family"] != "missing_edge_case"


def test_deterministic_balanced_and_distinct():
  a = generate_tasks(30, seed=7)
  b = generate_tasks(30, seed=7)
  c = generate_tasks(30, seed=8)
  assert a == b and [t.id for t in a] != [t.id for t in c]
  assert len({t.id for t in a}) == 30
  fams = collections.Counter(t.metadata.extra["family"] for t in a)
  assert len(fams) == 5 and max(fams.values()) - min(fams.values()) <= 6


def test_splits_share_no_template_instance(easy_train):
  val = generate_task_pool("easy", "validation")
  key = lambda t: (t.metadata.extra["template"], t.metadata.extra["function"])  # noqa: E731
  assert val and easy_train
  assert not {key(t) for t in easy_train} & {key(t) for t in val}
  assert all(split_of(*key(t)) == "validation" for t in val)
  assert len({t.metadata.extra["template"] for t in easy_train}) == len(TEMPLATES)


def test_difficulty_changes_repository_and_instruction():
  easy = generate_task_pool("easy", "train")[0]
  hard = [t for t in generate_task_pool("hard", "train") if t.metadata.extra["function"] ==
          easy.metadata.extra["function"]][0]
  count = lambda t: len([m for m in tarfile.open(fileobj=io.BytesIO(t.repo.data)).getnames()  # noqa: E731
                         if m.endswith(".py") and not m.startswith("tests/")])
  assert count(hard) > count(easy)
  assert ".py`" in easy.instruction and ".py`" not in hard.instruction
  assert {t.metadata.extra["family"] for t in generate_task_pool("hard", "train")} >= {"missing_edge_case"}
