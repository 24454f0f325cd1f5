"""Task schema validation: good tasks round-trip, bad ones name file, line and field."""

import pytest

from legorl_jax.errors import TaskValidationError
from legorl_jax.tasks.schema import Task


def _good(**over):
  d = {"id": "demo-1", "repo": {"type": "dir", "path": "repos/demo"}, "instruction": "Fix it.",
       "hidden_tests": {"tests/test_a.py": "def test_a():\n  assert True\n"},
       "FAIL_TO_PASS": ["tests/test_a.py::test_a"], "PASS_TO_PASS": [],
       "limits": {"timeout_s": 60, "memory_mb": 512}, "metadata": {"difficulty": "easy", "team": "x"}}
  d.update(over)
  return d


def test_round_trip_keeps_every_field():
  t = Task.from_dict(_good(), base_dir="/data")
  again = Task.from_dict(t.to_dict(), base_dir="/data")
  assert again == t
  assert t.limits.memory_mb == 512 and isinstance(t.limits.memory_mb, int)
  assert t.metadata.extra == {"team": "x"} and t.metadata.difficulty == "easy"
  assert t.repo.base_dir == "/data" and t.workdir == "/workspace"


def test_swebench_style_string_lists_are_parsed():
  t = Task.from_dict(_good(FAIL_TO_PASS='["a.py::t1", "a.py::t2"]', PASS_TO_PASS="[]"))
  assert t.fail_to_pass == ("a.py::t1", "a.py::t2") and t.pass_to_pass == ()


@pytest.mark.parametrize("override,field", [
    ({"id": None}, "id"),
    ({"id": "has space"}, "id"),
    ({"instruction": 3}, "instruction"),
    ({"instruction": "  "}, "instruction"),
    ({"repo": {"type": "svn"}}, "repo.type"),
    ({"repo": {"type": "git", "url": "https://x/y.git"}}, "repo.base_commit"),
    ({"repo": {"type": "archive"}}, "repo.path"),
    ({"repo": {"type": "dir", "path": "x", "branch": "main"}}, "repo.branch"),
    ({"hidden_tests": {"../evil.py": ""}}, "hidden_tests['../evil.py']"),
    ({"hidden_tests": {"tests/t.py": 5}}, "hidden_tests['tests/t.py']"),
    ({"verifier": {"type": "magic"}}, "verifier.type"),
    ({"verifier": {"type": "command"}}, "verifier.command"),
    ({"verifier": {"timeout_s": -1}}, "verifier.timeout_s"),
    ({"limits": {"memory_mb": 0}}, "limits.memory_mb"),
    ({"limits": {"gpus": 1}}, "limits.gpus"),
    ({"FAIL_TO_PASS": [1]}, "FAIL_TO_PASS[0]"),
    ({"workdir": "relative"}, "workdir"),
    ({"image": "bad image"}, "image"),
    ({"colour": "red"}, "colour"),
])
def test_invalid_fields_are_named(override, field):
  with pytest.raises(TaskValidationError) as e:
    Task.from_dict(_good(**override), path="tasks.jsonl", line=7)
  assert e.value.field == field and e.value.line == 7 and e.value.path == "tasks.jsonl"
  assert str(e.value).startswith("tasks.jsonl:7: field")


def test_task_without_any_tests_is_rejected():
  d = _good()
  del d["hidden_tests"]
  with pytest.raises(TaskValidationError, match="no tests"):
    Task.from_dict(d)
