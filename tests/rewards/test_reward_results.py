"""JUnit XML from a real pytest run, id matching and scoring."""

import os
import subprocess
import sys

import pytest

from legorl_jax.errors import VerifierError
from legorl_jax.rewards import results


def test_junit_from_real_pytest(tmp_path):
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "test_m.py").write_text(
      "import pytest\n\ndef test_a():\n  assert True\n\ndef test_b():\n  assert False\n\n"
      "@pytest.mark.skip\ndef test_c():\n  pass\n\nclass TestK:\n  def test_d(self):\n    assert True\n\n"
      "@pytest.fixture\ndef broken():\n  raise RuntimeError()\n\ndef test_e(broken):\n  pass\n")
  xml = tmp_path / "j.xml"
  env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
  for family in ("xunit1", "xunit2"):
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", f"junit_family={family}",
                    f"--junitxml={xml}", "pkg/test_m.py"], cwd=tmp_path, capture_output=True, env=env)
    got = results.parse_junit_xml(xml.read_text())
    assert got == {"pkg/test_m.py::test_a": "passed", "pkg/test_m.py::test_b": "failed",
                   "pkg/test_m.py::test_c": "skipped", "pkg/test_m.py::TestK::test_d": "passed",
                   "pkg/test_m.py::test_e": "error"}, family


def test_matching_and_scoring():
  observed = {"tests/a.py::test_x": "passed", "tests/a.py::K::test_y": "failed"}
  m = results.match_results(observed, ["tests/a.py::test_x", "K::test_y", "tests/a.py::test_gone"])
  assert m == {"tests/a.py::test_x": "passed", "K::test_y": "failed", "tests/a.py::test_gone": "missing"}
  per = {"f1": "passed", "f2": "failed", "p1": "passed"}
  assert results.score(per, ["f1"], ["p1"]) == 1.0
  assert results.score(per, ["f1", "f2"], ["p1"]) == 0.0
  assert results.score(per, ["f1", "f2"], ["p1"], partial_credit=True) == pytest.approx(2 / 3)
  assert results.score({"f1": "failed", "p1": "passed"}, ["f1"], ["p1"], partial_credit=True) == 0.0
  with pytest.raises(VerifierError):
    results.score({}, [], [])
  with pytest.raises(VerifierError):
    results.parse_junit_xml("<testsuite><testcase")
  with pytest.raises(VerifierError):
    results.parse_pyrunner_json("{}")
