"""Working-tree snapshots and diffs: the patch reproduces the change under `git apply`."""

import os
import subprocess

from legorl_jax.sandbox.diff import compute_diff, snapshot_dir


def test_patch_applies_with_git_and_reproduces_the_tree(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  for d in (a, b):
    (d / "pkg").mkdir(parents=True)
  (a / "pkg" / "m.py").write_text("x = 1\ny = 2\n")
  (a / "gone.txt").write_text("bye\n")
  (a / "noeol.txt").write_text("no newline")
  (b / "pkg" / "m.py").write_text("x = 1\ny = 3\n")
  (b / "pkg" / "new.py").write_text("z = 0\n")
  (b / "noeol.txt").write_text("still no newline")
  (b / "data.bin").write_bytes(b"\x00\x01")
  os.symlink("/etc/passwd", b / "link")
  (b / "__pycache__").mkdir()
  (b / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"junk")
  before, after = snapshot_dir(str(a)), snapshot_dir(str(b))
  assert after["link"].endswith(b"/etc/passwd") and b"root:" not in after["link"]  # not followed
  d = compute_diff(before, after)
  assert [(c.path, c.kind, c.binary) for c in d.changes] == [
      ("data.bin", "added", True), ("gone.txt", "deleted", False), ("link", "added", True),
      ("noeol.txt", "modified", False), ("pkg/m.py", "modified", False), ("pkg/new.py", "added", False)]
  text_only = compute_diff({k: v for k, v in before.items()},
                           {k: v for k, v in after.items() if k not in ("data.bin", "link")})
  subprocess.run(["git", "init", "-q"], cwd=a, check=True)
  p = subprocess.run(["git", "apply", "-"], cwd=a, input=text_only.patch, text=True, capture_output=True)
  assert p.returncode == 0, p.stderr
  got = {k: v for k, v in snapshot_dir(str(a)).items()}
  want = {k: v for k, v in after.items() if k not in ("data.bin", "link")}
  assert got == want
  assert compute_diff(before, before).empty
