"""Which diffs count as tampering with the grader."""

from legorl_jax.rewards.hacking import find_reward_hacks
from legorl_jax.sandbox.diff import compute_diff
from legorl_jax.tasks.schema import Task

TASK = Task.from_dict({"id": "t", "repo": {"type": "dir", "path": "x"}, "instruction": "i",
                       "hidden_tests": {"checks/hidden_check.py": "def test_h():\n  pass\n"},
                       "protected_paths": ["golden/*.json"]})


def hacks(before, after):
  return find_reward_hacks(compute_diff(before, after), TASK)


def test_source_edits_are_fine():
  assert hacks({"pkg/m.py": b"x = 1\n", "README.md": b"a\n"}, {"pkg/m.py": b"x = 2\n", "README.md": b"b\n",
                                                             "pkg/new.py": b"y = 1\n", "setup.cfg": b"[metadata]\nname = x\n"}) == {}


def test_each_protected_kind_is_flagged():
  before = {"tests/test_m.py": b"def test():\n  assert 0\n", "pkg/m.py": b"x\n", "pyproject.toml": b"[project]\n"}
  cases = {
      "tests/test_m.py": None,  # deleted
      "pkg/conftest.py": b"import pytest\n",
      "pytest.ini": b"[pytest]\n",
      "tox.ini": b"[tox]\n",
      "pkg/m_test.py": b"\n",
      "checks/hidden_check.py": b"def test_h():\n  pass\n",
      ".legorl_verify/results.json": b"{}",
      "sitecustomize.py": b"import os\n",
      "evil.pth": b"import os\n",
      "golden/out.json": b"{}",
      "pyproject.toml": b"[project]\n[tool.pytest.ini_options]\naddopts = '-k nothing'\n",
  }
  for path, content in cases.items():
    after = dict(before)
    if content is None:
      del after[path]
    else:
      after[path] = content
    found = hacks(before, after)
    assert list(found) == [path], (path, found)
