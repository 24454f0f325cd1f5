r"""Installs harness CLIs outside the project's environment, one isolated place each.

Python CLIs go into their own virtualenv, npm CLIs under their own ``--prefix``, all in a cache
directory (``$LEGORL_HARNESS_HOME`` or ``~/.cache/legorl_jax/harnesses``). Installing again is a
no-op when the pinned version is already there.

  python -m legorl_jax.harnesses.install all
  python -m legorl_jax.harnesses.install mini-swe-agent opencode

The pins below are the one place harness versions are set; tests run against them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

from legorl_jax import errors


@dataclasses.dataclass(frozen=True)
class CliPin:
  """One harness CLI: how it installs and which executable it provides."""

  name: str
  kind: str          # "pip" | "npm"
  package: str       # pip requirement / npm spec, pinned
  executable: str    # bin name inside the venv / npm prefix
  python: str | None = None  # interpreter for the venv (pip kinds)
  extra: tuple[str, ...] = ()  # further packages for the same venv


PY312 = "/root/.pyenv/versions/3.12.1/bin/python3"

PINS: dict[str, CliPin] = {
    "mini-swe-agent": CliPin("mini-swe-agent", "pip", "mini-swe-agent==2.4.6", "mini"),
    "aider": CliPin("aider", "pip", "aider-chat==0.86.2", "aider"),
    # The SDK's default agent and its tools (terminal, file editor, task tracker) live in
    # openhands-tools; the terminal tool needs tmux on the host (apt-get install tmux).
    "openhands": CliPin("openhands", "pip", "openhands-sdk==1.58.2", "python",
                        python=os.environ.get("LEGORL_PY312", PY312),
                        extra=("openhands-tools==1.58.2",)),
    "opencode": CliPin("opencode", "npm", "opencode-ai@1.18.33", "opencode"),
    "codex": CliPin("codex", "npm", "@openai/codex@0.171.0", "codex"),
    "claude-code": CliPin("claude-code", "npm", "@anthropic-ai/claude-code@2.1.332", "claude"),
}


def harness_home() -> pathlib.Path:
  return pathlib.Path(os.environ.get("LEGORL_HARNESS_HOME",
                                     pathlib.Path.home() / ".cache" / "legorl_jax" / "harnesses"))


def install_dir(name: str) -> pathlib.Path:
  return harness_home() / name


def executable_path(name: str) -> pathlib.Path:
  pin = PINS[name]
  sub = "bin" if pin.kind == "pip" else "node_modules/.bin"
  return install_dir(name) / sub / pin.executable


# Where a sandbox sees the Python CLIs: host installs usually live under /root, which a
# container's unprivileged user cannot traverse, so they are mounted at neutral paths.
SANDBOX_ROOT = "/opt/legorl-harnesses"


def _venv_base(name: str) -> tuple[pathlib.Path, str]:
  """(base interpreter prefix, "X.Y") of a pip CLI's virtualenv, from its ``pyvenv.cfg``."""
  cfg_path = install_dir(name) / "pyvenv.cfg"
  try:
    cfg = {k.strip(): v.strip() for k, v in (
        line.split("=", 1) for line in cfg_path.read_text().splitlines() if "=" in line)}
    home = pathlib.Path(cfg["home"]).resolve()
    version = ".".join(cfg.get("version", cfg.get("version_info", "")).split(".")[:2])
  except (OSError, KeyError) as e:
    raise errors.HarnessError(f"{cfg_path} is unreadable ({e}); reinstall with "
                              f"`python -m legorl_jax.harnesses.install --force {name}`.") from e
  return home.parent, version


def sandbox_python_cli(name: str, script: str | None = None
                       ) -> tuple[list[tuple[str, str]], list[str], dict[str, str]]:
  """How to run pip CLI ``name`` inside a sandbox: (read-only mounts, argv prefix, env).

  The virtualenv is mounted at ``SANDBOX_ROOT/<name>`` and its base interpreter at
  ``SANDBOX_ROOT/<name>-python``; the interpreter runs without its own site-packages (``-S``)
  the CLI's console script (or ``script``, an in-sandbox path) with the virtualenv's
  site-packages added (``.pth`` files included); ``PYTHONPATH`` lets child interpreters
  (``sys.executable -m ...``) see them too.
  """
  pin = PINS[name]
  prefix, version = _venv_base(name)
  venv_in, py_in = f"{SANDBOX_ROOT}/{name}", f"{SANDBOX_ROOT}/{name}-python"
  site_in = f"{venv_in}/lib/python{version}/site-packages"
  mounts = [(str(install_dir(name)), venv_in), (str(prefix), py_in)]
  boot = ("import runpy, site, sys; site.addsitedir(%r); sys.argv = sys.argv[1:]; "
          "sys.path[0] = __import__('os').path.dirname(sys.argv[0]); "
          "runpy.run_path(sys.argv[0], run_name='__main__')" % site_in)
  argv = [f"{py_in}/bin/python{version}", "-S", "-c", boot,
          script or f"{venv_in}/bin/{pin.executable}"]
  env = {"PYTHONPATH": site_in, "LD_LIBRARY_PATH": f"{py_in}/lib", "PYTHONNOUSERSITE": "1"}
  return mounts, argv, env


def runtime_mounts(name: str) -> list[str]:
  """Host paths the CLI needs, visible at the same paths (what npm CLIs use)."""
  return [str(install_dir(name))]


def _stamp(name: str) -> pathlib.Path:
  return install_dir(name) / ".legorl_installed.json"


def is_installed(name: str) -> bool:
  pin = PINS[name]
  try:
    stamp = json.loads(_stamp(name).read_text())
  except (OSError, ValueError):
    return False
  return (stamp.get("package") == pin.package and stamp.get("extra", []) == list(pin.extra)
          and executable_path(name).exists())


def _run(cmd: list[str], **kw):
  print("+", " ".join(cmd), flush=True)
  r = subprocess.run(cmd, text=True, capture_output=True, **kw)
  if r.returncode:
    raise errors.HarnessError(
        f"`{' '.join(cmd)}` failed with exit code {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
  return r


def install(name: str, force: bool = False) -> pathlib.Path:
  """Installs one CLI (idempotent); returns its executable path."""
  if name not in PINS:
    raise errors.HarnessError(f"Unknown harness {name!r}; installable: {sorted(PINS)} or 'all'.")
  pin = PINS[name]
  if is_installed(name) and not force:
    return executable_path(name)
  d = install_dir(name)
  d.mkdir(parents=True, exist_ok=True)
  if pin.kind == "pip":
    python = pin.python or sys.executable
    if not os.path.exists(python):
      raise errors.HarnessError(
          f"{name} needs the interpreter {python}, which is missing; install that Python "
          "(e.g. with pyenv) or set LEGORL_PY312 to its path.")
    if not (d / "bin" / "python").exists():
      _run([python, "-m", "venv", str(d)])
    _run([str(d / "bin" / "python"), "-m", "pip", "install", "-q", pin.package, *pin.extra])
  else:
    if not (d / "package.json").exists():
      (d / "package.json").write_text('{"private": true}\n')
    _run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(d), pin.package, *pin.extra])
  if not executable_path(name).exists():
    raise errors.HarnessError(f"{name} installed but {executable_path(name)} is missing.")
  _stamp(name).write_text(json.dumps({"package": pin.package, "extra": list(pin.extra)}))
  return executable_path(name)


def main(argv: list[str]) -> int:
  names = argv[1:] or ["--help"]
  if names[0] in ("-h", "--help"):
    print(__doc__)
    print("harnesses:", ", ".join(sorted(PINS)))
    return 0
  force = "--force" in names
  names = [n for n in names if n != "--force"]
  if names == ["all"]:
    names = sorted(PINS)
  failed = []
  for n in names:
    try:
      print(f"{n}: {install(n, force=force)}")
    except errors.HarnessError as e:
      print(f"{n}: FAILED: {e}", file=sys.stderr)
      failed.append(n)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
