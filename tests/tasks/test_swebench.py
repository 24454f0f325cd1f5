"""SWE-bench-style import, and one such task run end to end with pytest in a local sandbox."""

import json
import os
import subprocess
import sys

import pytest

from legorl_jax.rewards import status as st
from legorl_jax.rewards.verifier import verify
from legorl_jax.sandbox import SandboxConfig, create_sandbox
from legorl_jax.sandbox.local import bwrap_path
from legorl_jax.tasks.swebench import default_image, import_swebench_jsonl

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}
PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
TEST_PATCH = """diff --git a/test_calc.py b/test_calc.py
--- a/test_calc.py
+++ b/test_calc.py
@@ -3,3 +3,7 @@ from calc import add
 
 def test_zero():
     assert add(0, 0) == 0
+
+
+def test_add():
+    assert add(2, 3) == 5
"""


def _mirror(tmp_path):
  repo = tmp_path / "mirror" / "acme__calc"
  repo.mkdir(parents=True)
  (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
  (repo / "test_calc.py").write_text("from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n")
  for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
    subprocess.run(["git", *args], cwd=repo, env=ENV, check=True)
  return str(tmp_path / "mirror"), subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                                                  text=True).stdout.strip()


def test_import_records_and_errors(tmp_path):
  rec = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": "abc1234", "patch": PATCH,
         "test_patch": TEST_PATCH, "FAIL_TO_PASS": '["test_calc.py::test_add"]',
         "PASS_TO_PASS": '["test_calc.py::test_zero"]', "problem_statement": "add() subtracts", "version": "1.0"}
  p = tmp_path / "swe.jsonl"
  p.write_text(json.dumps(rec) + "\n" + json.dumps({"repo": "x/y"}) + "\n" + "[1,\n"
               + json.dumps({**rec, "instance_id": "s1", "image_name": "swesmith/x:1"}) + "\n")
  tasks, errors = import_swebench_jsonl(str(p))
  assert [t.id for t in tasks] == ["acme__calc-1", "s1"]
  t = tasks[0]
  assert t.repo.url == "https://github.com/acme/calc.git" and t.workdir == "/testbed"
  assert t.image == default_image("acme__calc-1") == "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest"
  assert tasks[1].image == "swesmith/x:1"
  assert t.fail_to_pass == ("test_calc.py::test_add",) and t.verifier.kind == "pytest"
  assert [(e.line, e.field) for e in errors] == [(2, "instance_id"), (3, None)]


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap not installed (.ci/setup_system.sh installs it)")
@pytest.mark.parametrize("mode,expected", [("gold", st.SOLVED), ("none", st.FAILED)])
def test_swe_task_with_pytest_in_local_sandbox(tmp_path, mode, expected):
  mirror, commit = _mirror(tmp_path)
  rec = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": commit, "patch": PATCH,
         "test_patch": TEST_PATCH, "FAIL_TO_PASS": ["test_calc.py::test_add"],
         "PASS_TO_PASS": ["test_calc.py::test_zero"], "problem_statement": "add() subtracts"}
  p = tmp_path / "swe.jsonl"
  p.write_text(json.dumps(rec) + "\n")
  (task,), _ = import_swebench_jsonl(str(p))
  # pytest comes from this interpreter's installation, mounted read-only.
  # In a virtualenv, python3 links into the base installation: mount both.
  cfg = SandboxConfig(git_mirror_dir=mirror, ro_mounts=tuple(sorted({sys.prefix, sys.base_prefix})),
                      env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin",
                           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
  with create_sandbox(task, cfg) as sb:
    if mode == "gold":
      assert sb.apply_patch(task.gold_patch).ok
    res = verify(sb)
  assert res.status == expected, res
  assert res.pass_to_pass == {"test_calc.py::test_zero": "passed"}
  assert res.fail_to_pass == {"test_calc.py::test_add": "passed" if mode == "gold" else "failed"}
