"""The README's two commands stay true: CI runs exactly the README's test command, and the
main job's entry point exists."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
  text = (ROOT / "README.md").read_text()
  section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```bash\n(.+?)\n```", section, re.S)


def test_readme_shows_exactly_two_commands():
  cmds = _readme_commands()
  assert len(cmds) == 2, cmds
  assert all("\n" not in c for c in cmds)


def test_ci_runs_the_readme_test_command():
  test_cmd = _readme_commands()[1]
  ci = (ROOT / ".ci" / "run").read_text().splitlines()
  assert test_cmd in ci, f"{test_cmd!r} not a line of .ci/run"


def test_main_job_module_exists():
  main_cmd = _readme_commands()[0]
  module = re.search(r"python -m ([\w.]+)", main_cmd).group(1)
  assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module


def test_setup_declares_accelerator_and_test_extras():
  setup = (ROOT / "setup.py").read_text()
  for extra in ('"tpu"', '"gpu"', '"test"'):
    assert extra in setup
  assert '"jax[cpu]' in setup
