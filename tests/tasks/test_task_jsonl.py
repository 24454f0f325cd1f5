"""JSONL loading collects per-line errors without stopping."""

import json

import pytest

from legorl_jax.errors import TaskError, TaskValidationError
from legorl_jax.tasks.jsonl import load_tasks_jsonl, write_tasks_jsonl

GOOD = {"id": "a", "repo": {"type": "dir", "path": "r"}, "instruction": "x",
        "hidden_tests": {"tests/test_x.py": "def test_x():\n  pass\n"}}


def test_bad_lines_are_reported_and_skipped(tmp_path):
  p = tmp_path / "tasks.jsonl"
  lines = [json.dumps(GOOD), "{not json", json.dumps({**GOOD, "id": "b", "repo": {"type": "nope"}}), "",
           json.dumps({**GOOD, "id": "c"}), json.dumps(GOOD)]
  p.write_text("\n".join(lines) + "\n")
  tasks, errors = load_tasks_jsonl(str(p))
  assert [t.id for t in tasks] == ["a", "c"]
  assert [(e.line, e.field) for e in errors] == [(2, None), (3, "repo.type"), (6, "id")]
  assert "broken JSON" in str(errors[0]) and "duplicate" in str(errors[2])
  assert tasks[0].repo.base_dir == str(tmp_path)
  with pytest.raises(TaskValidationError):
    load_tasks_jsonl(str(p), strict=True)


def test_write_then_load_is_identity(tmp_path):
  tasks, _ = load_tasks_jsonl(_write(tmp_path, [GOOD, {**GOOD, "id": "z"}]))
  out = tmp_path / "out.jsonl"
  assert write_tasks_jsonl(str(out), tasks) == 2
  again, errors = load_tasks_jsonl(str(out))
  assert again == tasks and not errors


def test_missing_file_is_a_clear_error(tmp_path):
  with pytest.raises(TaskError, match="does not exist"):
    load_tasks_jsonl(str(tmp_path / "nope.jsonl"))


def _write(tmp_path, objs):
  p = tmp_path / "in.jsonl"
  p.write_text("".join(json.dumps(o) + "\n" for o in objs))
  return str(p)
