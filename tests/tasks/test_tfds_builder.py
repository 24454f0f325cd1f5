"""The TFDS array_record task dataset and the resumable loader over it."""

import json

import pytest

from legorl_jax.errors import TaskError
from legorl_jax.tasks import jsonl, tfds_builder
from legorl_jax.tasks.loader import TaskLoader
from legorl_jax.taskgen.synthetic import generate_tasks


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  tasks = generate_tasks(12, seed=0)
  path = root / "train.jsonl"
  jsonl.write_tasks_jsonl(str(path), tasks)
  (root / "repo").mkdir()
  (root / "repo" / "a.py").write_text("A = 1\n")
  dir_task = {"id": "dir-task", "repo": {"type": "dir", "path": "repo"}, "instruction": "x",
              "hidden_tests": {"tests/test_a.py": "def test_a():\n  pass\n"}}
  missing = {**dir_task, "id": "missing-repo", "repo": {"type": "dir", "path": "nope"}}
  with open(path, "a") as f:
    f.write("{broken json\n" + json.dumps(dir_task) + "\n" + json.dumps(missing) + "\n")
  val = root / "val.jsonl"
  jsonl.write_tasks_jsonl(str(val), generate_tasks(3, seed=0, split="validation"))
  data_dir = tfds_builder.build_task_dataset({"train": str(path), "validation": str(val)}, str(root / "data"))
  return data_dir, {t.id: t for t in tasks}


def test_records_decode_to_the_original_tasks(dataset):
  data_dir, by_id = dataset
  src = tfds_builder.open_task_source(data_dir, "train")
  assert len(src) == 13  # 12 synthetic + the dir task; broken JSON and missing repo skipped
  decoded = [tfds_builder.record_to_task(src[i]) for i in range(len(src))]
  for t in decoded:
    if t.id == "dir-task":
      assert t.repo.kind == "archive" and t.repo.data
    else:
      assert t == by_id[t.id]
  assert len(tfds_builder.open_task_source(data_dir, "validation")) == 3
  with pytest.raises(TaskError, match="split"):
    tfds_builder.open_task_source(data_dir, "test")


def test_loader_epochs_are_deterministic_permutations(dataset):
  data_dir, _ = dataset
  a = TaskLoader.from_tfds(data_dir, seed=1)
  b = TaskLoader.from_tfds(data_dir, seed=1)
  ids_a = [t.id for t in a.next_batch(26)]
  assert ids_a == [t.id for t in b.next_batch(26)]
  assert sorted(ids_a[:13]) == sorted(ids_a[13:]) and len(set(ids_a[:13])) == 13
  assert ids_a[:13] != ids_a[13:]  # reshuffled per epoch
  assert (a.state_dict()["epoch"], a.state_dict()["index"]) == (1, 13)
  c = TaskLoader.from_tfds(data_dir, seed=2)
  assert [t.id for t in c.next_batch(13)] != ids_a[:13]


def test_resume_continues_with_the_next_task(dataset):
  data_dir, _ = dataset
  ref = TaskLoader.from_tfds(data_dir, seed=5)
  ref.next_batch(4)
  ref.next_batch(7)
  state = ref.state_dict()
  expected = [t.id for t in ref.next_batch(6)]  # crosses the epoch boundary
  resumed = TaskLoader.from_tfds(data_dir, seed=5)
  resumed.load_state_dict(json.loads(json.dumps(state)))
  assert [t.id for t in resumed.next_batch(6)] == expected
  with pytest.raises(TaskError, match="does not match"):
    TaskLoader.from_tfds(data_dir, seed=6).load_state_dict(state)


def test_loader_skips_undecodable_records():
  good = generate_tasks(2, seed=0)
  source = [good[0], "not a task", good[1]]

  def decode(x):
    if isinstance(x, str):
      raise TaskError("bad record")
    return x
  loader = TaskLoader(source, shuffle=False, decode=decode)
  assert [t.id for t in loader.next_batch(3)] == [good[0].id, good[1].id, good[0].id]
  assert loader.errors == ["record 1: bad record"]
