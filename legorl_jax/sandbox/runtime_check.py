"""Whether the local backend can run a verifier before any trial tries to.

The local sandbox runs commands with the host's own ``/usr`` (read-only) and the sandbox's
PATH, so ``python3 -m pytest`` inside it works only if the interpreter that PATH finds has
pytest. On a fresh Debian machine it does not, and every trial of a pytest-graded task would
end ``verifier_error`` after a full harness run. ``missing_python_modules`` asks that same
interpreter once per process (cached) so the trainer can refuse such tasks up front, naming
the fix.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Mapping, Sequence

# The PATH a sandbox starts with (``Sandbox.base_env``), unless its config overrides it.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@functools.lru_cache(maxsize=None)
def _probe(path: str, modules: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
  # A venv's python3 can be a symlink into a prefix the sandbox does not mount; only plain
  # system locations are probed the way the sandbox sees them (first existing python3).
  exe = shutil.which("python3", path=path)
  if exe is None:
    return None, modules
  code = ("import importlib.util, sys\n"
          "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
  try:
    out = subprocess.run([exe, "-c", code, *modules], capture_output=True, text=True,
                         timeout=60, env={"PATH": path, "LANG": "C.UTF-8"})
  except (OSError, subprocess.TimeoutExpired):
    return exe, modules
  if out.returncode != 0:
    return exe, modules
  return exe, tuple(out.stdout.split())


def missing_python_modules(modules: Sequence[str], env: Mapping[str, str] | None = None
                           ) -> tuple[str | None, list[str]]:
  """(the ``python3`` a local sandbox would run, the ``modules`` it cannot import).

  ``env`` is the sandbox config's extra env (its PATH, if any, replaces the default).
  """
  path = (env or {}).get("PATH", SANDBOX_PATH)
  exe, missing = _probe(path, tuple(sorted(set(modules))))
  return (os.path.realpath(exe) if exe else None), list(missing)
