"""Harness installs: isolated, idempotent, pinned, and clear about what is wrong."""

import json
import os
import subprocess
import sys

import pytest

from legorl_jax import errors
from legorl_jax.harnesses import install


def test_unknown_name_is_a_clear_error():
  with pytest.raises(errors.HarnessError, match="Unknown harness 'nope'.*installable"):
    install.install("nope")
  assert install.main(["install", "nope"]) == 1


def test_main_help_lists_every_harness(capsys):
  assert install.main(["install", "--help"]) == 0
  out = capsys.readouterr().out
  for name in install.PINS:
    assert name in out


def test_every_pin_is_exact():
  for pin in install.PINS.values():
    assert pin.kind in ("pip", "npm")
    sep = "==" if pin.kind == "pip" else "@"
    assert sep in pin.package.lstrip("@"), pin  # one version, no ranges
    assert not any(c in pin.package for c in "<>~^*"), pin


@pytest.fixture()
def small_pin(tmp_path, monkeypatch):
  """A real, small pip CLI (pyflakes) under a throwaway harness home."""
  monkeypatch.setenv("LEGORL_HARNESS_HOME", str(tmp_path / "h"))
  monkeypatch.setitem(install.PINS, "pyflakes-cli",
                      install.CliPin("pyflakes-cli", "pip", "pyflakes==3.2.0", "pyflakes"))
  return "pyflakes-cli"


@pytest.mark.slow
def test_install_is_isolated_and_idempotent(small_pin, tmp_path, monkeypatch):
  exe = install.install(small_pin)
  assert exe == install.executable_path(small_pin)
  assert str(exe).startswith(str(tmp_path / "h" / small_pin))
  assert install.is_installed(small_pin)
  # the CLI runs from its own virtualenv, not the project's interpreter
  r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
  assert r.stdout.startswith("3.2.0")
  venv_python = install.install_dir(small_pin) / "bin" / "python"
  code = "import sys; print(sys.prefix)"
  prefix = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True).stdout
  assert prefix.strip() == str(install.install_dir(small_pin)) != sys.prefix
  mounts, argv, env = install.sandbox_python_cli(small_pin)
  assert mounts[0] == (str(install.install_dir(small_pin)), f"{install.SANDBOX_ROOT}/{small_pin}")
  assert argv[-1] == f"{install.SANDBOX_ROOT}/{small_pin}/bin/pyflakes"

  # second install: nothing runs, nothing changes
  ran = []
  real_run = install._run
  monkeypatch.setattr(install, "_run", lambda cmd, **kw: (ran.append(cmd), real_run(cmd, **kw)))
  stamp = install.install_dir(small_pin) / ".legorl_installed.json"
  before = stamp.stat().st_mtime_ns
  assert install.install(small_pin) == exe
  assert ran == [] and stamp.stat().st_mtime_ns == before

  # a changed pin is not "installed": the next install upgrades in place
  monkeypatch.setitem(install.PINS, small_pin,
                      install.CliPin(small_pin, "pip", "pyflakes==3.1.0", "pyflakes"))
  assert not install.is_installed(small_pin)
  install.install(small_pin)
  assert json.loads(stamp.read_text()) == {"package": "pyflakes==3.1.0", "extra": []}
  r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
  assert r.stdout.startswith("3.1.0")


def test_missing_interpreter_is_explained(tmp_path, monkeypatch):
  monkeypatch.setenv("LEGORL_HARNESS_HOME", str(tmp_path))
  monkeypatch.setitem(install.PINS, "py-missing", install.CliPin(
      "py-missing", "pip", "pyflakes==3.2.0", "pyflakes", python="/nonexistent/python3.12"))
  with pytest.raises(errors.HarnessError, match="needs the interpreter /nonexistent"):
    install.install("py-missing")


@pytest.mark.parametrize("name", sorted(install.PINS))
def test_pinned_cli_is_installed(name):
  """What CI installed (`python -m legorl_jax.harnesses.install all`) matches the pins."""
  if not install.is_installed(name):
    pytest.skip(f"{name} is not installed: run `python -m legorl_jax.harnesses.install {name}`")
  pin = install.PINS[name]
  exe = install.executable_path(name)
  assert os.access(exe, os.X_OK)
  if pin.kind == "pip":
    dist, _, version = pin.package.partition("==")
    py = install.install_dir(name) / "bin" / "python"
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == version, out.stderr
  else:
    spec = pin.package.rsplit("@", 1)
    pkg_json = install.install_dir(name) / "node_modules" / spec[0] / "package.json"
    assert json.loads(pkg_json.read_text())["version"] == spec[1]
