"""The plain-Python runner agrees with pytest on outcomes and ids, and is fast."""

import json
import os
import subprocess
import sys
import time

from legorl_jax.rewards import pyrunner

TESTS = '''
import os
import time

from lib import double


def test_ok():
    assert double(2) == 4


def test_wrong():
    assert double(3) == 7


def test_crash():
    raise KeyError("boom")


def test_exit():
    raise SystemExit(0)


def test_hangs():
    time.sleep(30)


def helper():
    raise AssertionError("not a test")


class TestGroup:
    def test_inside(self):
        assert double(0) == 0

    def test_inside_bad(self):
        assert double(1) == 3
'''


def _repo(tmp_path):
  (tmp_path / "lib.py").write_text("def double(x):\n    return 2 * x\n")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_lib.py").write_text(TESTS)
  (tmp_path / "tests" / "test_broken.py").write_text("import does_not_exist\n")
  return tmp_path


def test_outcomes_match_pytest(tmp_path):
  repo = _repo(tmp_path)
  out = tmp_path / "r.json"
  t0 = time.perf_counter()
  p = subprocess.run([sys.executable, pyrunner.__file__, "--root", str(repo), "--out", str(out),
                      "--per-test-timeout", "0.5", "tests/test_lib.py", "tests/test_broken.py"],
                     capture_output=True, text=True)
  elapsed = time.perf_counter() - t0
  assert p.returncode == 1, p.stderr
  ours = {k: v["outcome"] for k, v in json.loads(out.read_text())["tests"].items()}
  assert ours["tests/test_broken.py::<module>"] == "error"
  del ours["tests/test_broken.py::<module>"]
  assert ours["tests/test_lib.py::test_hangs"] == "failed"  # per-test timeout
  assert elapsed < 5.0
  env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
  p = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", "--timeout=1",
                      "-p", "pytest_timeout", "tests/test_lib.py"], cwd=repo, capture_output=True, text=True, env=env)
  ref = {}
  for line in p.stdout.splitlines():
    for word, outcome in (("PASSED ", "passed"), ("FAILED ", "failed"), ("ERROR ", "error")):
      if line.startswith(word):
        ref[line[len(word):].split(" - ")[0].strip()] = outcome
  assert set(ref) == set(ours)
  # pytest counts a raised non-assertion exception as a failure, the pyrunner as an error;
  # both are "not passed", which is all the reward uses.
  assert {k for k, v in ref.items() if v == "passed"} == {k for k, v in ours.items() if v == "passed"}


def test_all_passing_exits_zero(tmp_path, monkeypatch):
  # In-process run: the runner changes directory and sys.path as it would in its own process;
  # monkeypatch puts both back for the rest of the session.
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))
  (tmp_path / "test_a.py").write_text("def test_a():\n    assert 1 + 1 == 2\n")
  assert pyrunner.main(["--root", str(tmp_path), "--out", str(tmp_path / "o.json"), "test_a.py"]) == 0
