"""How to install a project and run its tests, discovered from its own configuration.

The install runs once, when the repository's image is built (it may use the package
registries); trials then run with no network. The test command is pytest (which also runs
unittest-style suites): its test paths come from the project's pytest configuration
(``testpaths`` in pyproject.toml, pytest.ini, tox.ini or setup.cfg), else from the usual
places (``tests/``, ``test/``, ``test_*.py`` files). Test dependencies come from an extra
named like ``test``/``tests``/``testing`` and from requirement files such as
``requirements-test.txt``.
"""

from __future__ import annotations

import configparser
import dataclasses
import fnmatch
import os
import re
import shlex
import tomllib

from legorl_jax.errors import TaskError

TEST_EXTRAS = ("test", "tests", "testing")
_REQ_FILES = ("requirements-test.txt", "requirements_test.txt", "test-requirements.txt",
              "test_requirements.txt", "requirements-tests.txt", "requirements/test.txt",
              "requirements/tests.txt", "tests/requirements.txt")
TEST_GLOBS = ("test_*.py", "*_test.py")
_SKIP_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "benchmark", ".git", "build",
              "dist", "site-packages"}


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """The environment of one project.

  requirements: pip requirement strings installed into the image besides the project itself
    (test dependencies and pytest). extras: extras of the project installed with it.
  test_paths: what pytest is given (files or directories, repo-relative).
  pytest_args: extra pytest arguments (``--rootdir=.`` always, so test ids do not depend on
    which paths are passed; ``-o pythonpath=src`` for src layouts).
  """
  requirements: tuple[str, ...]
  extras: tuple[str, ...]
  test_paths: tuple[str, ...]
  pytest_args: tuple[str, ...]
  build_requires: tuple[str, ...]
  has_build_config: bool

  @property
  def install_command(self) -> str:
    """The install as a developer would type it in the repository (run at image build)."""
    target = "." + (f"[{','.join(self.extras)}]" if self.extras else "")
    reqs = " ".join(shlex.quote(r) for r in self.requirements)
    if not self.has_build_config:
      return f"python3 -m pip install {reqs}".strip()
    return f"python3 -m pip install -e {shlex.quote(target)} {reqs}".strip()

  @property
  def test_command(self) -> str:
    return " ".join(["python3 -m pytest -p no:cacheprovider", *self.pytest_args,
                     *map(shlex.quote, self.test_paths)])

  def to_dict(self) -> dict:
    return {"install_command": self.install_command, "test_command": self.test_command,
            "requirements": list(self.requirements), "extras": list(self.extras),
            "test_paths": list(self.test_paths), "pytest_args": list(self.pytest_args),
            "build_requires": list(self.build_requires)}


def read_pyproject(root: str) -> dict:
  path = os.path.join(root, "pyproject.toml")
  if not os.path.isfile(path):
    return {}
  try:
    with open(path, "rb") as f:
      return tomllib.load(f)
  except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
    raise TaskError(f"{path} is not valid TOML ({e}); fix it or remove it") from None


def read_setup_cfg(root: str, name: str = "setup.cfg") -> configparser.ConfigParser:
  cfg = configparser.ConfigParser(interpolation=None)
  path = os.path.join(root, name)
  if os.path.isfile(path):
    try:
      cfg.read(path, encoding="utf-8")
    except configparser.Error as e:
      raise TaskError(f"{path} cannot be parsed ({e})") from None
  return cfg


def pytest_config(root: str) -> dict[str, str]:
  """The project's pytest ini options as strings, from the file pytest itself would pick."""
  for name, section in (("pytest.ini", "pytest"), ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
    cfg = read_setup_cfg(root, name)
    if cfg.has_section(section):
      return dict(cfg.items(section))
  opts = read_pyproject(root).get("tool", {}).get("pytest", {}).get("ini_options")
  if isinstance(opts, dict):
    return {k: " ".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in opts.items()}
  return {}


def is_test_file(rel: str) -> bool:
  parts = rel.split("/")
  return (any(fnmatch.fnmatch(parts[-1], g) for g in TEST_GLOBS) or parts[-1] == "conftest.py"
          or any(p in ("tests", "test", "testing") for p in parts[:-1]))


def find_test_files(root: str, paths: tuple[str, ...] = (".",)) -> list[str]:
  """Repo-relative ``test_*.py`` / ``*_test.py`` files under ``paths``."""
  out = []
  for p in paths:
    full = os.path.normpath(os.path.join(root, p))
    if os.path.isfile(full):
      out.append(os.path.relpath(full, root))
      continue
    for dirpath, dirnames, filenames in os.walk(full):
      dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
      for f in sorted(filenames):
        if any(fnmatch.fnmatch(f, g) for g in TEST_GLOBS):
          out.append(os.path.relpath(os.path.join(dirpath, f), root))
  return sorted(set(out))


def discover(root: str, *, extras: tuple[str, ...] | None = None, requirements: tuple[str, ...] = (),
             pytest_args: tuple[str, ...] = (), pytest_requirement: str = "pytest") -> EnvSpec:
  """The EnvSpec of the project at ``root``; TaskError when it has no tests."""
  pyproject = read_pyproject(root)
  cfg = read_setup_cfg(root)
  ini = pytest_config(root)
  testpaths = tuple(p for p in shlex.split(ini.get("testpaths", "")) if os.path.exists(os.path.join(root, p)))
  if testpaths:
    test_paths = testpaths
  else:
    dirs = tuple(d for d in ("tests", "test") if os.path.isdir(os.path.join(root, d)))
    test_paths = dirs or tuple(find_test_files(root))
  files = find_test_files(root, test_paths) if test_paths else []
  if not files:
    raise TaskError(f"no tests found in {root}: no test_*.py or *_test.py files (pytest testpaths: "
                    f"{ini.get('testpaths', 'unset')}); the builder needs a project whose "
                    "sources ship its test suite (many sdists leave the tests out: use a git "
                    "checkout then)")
  # Extras and test requirements.
  declared = set(pyproject.get("project", {}).get("optional-dependencies", {}) or {})
  if cfg.has_section("options.extras_require"):
    declared |= set(cfg.options("options.extras_require"))
  if extras is None:
    extras = tuple(e for e in TEST_EXTRAS if e in declared)
  reqs = list(requirements)
  for rf in _REQ_FILES:
    path = os.path.join(root, rf)
    if os.path.isfile(path):
      reqs += _read_requirements(path)
  if not any(re.match(r"pytest\b(?![-_])", r) for r in reqs):
    reqs.append(pytest_requirement)
  # src layout: the package lives under src/, which is not on sys.path by itself.
  args = ["--rootdir=."]
  if os.path.isdir(os.path.join(root, "src")) and "pythonpath" not in ini:
    args += ["-o", "pythonpath=src"]
  args += list(pytest_args)
  build = pyproject.get("build-system", {}).get("requires") or ["setuptools>=61", "wheel"]
  has_build = any(os.path.isfile(os.path.join(root, f)) for f in ("pyproject.toml", "setup.py", "setup.cfg"))
  return EnvSpec(requirements=tuple(dict.fromkeys(reqs)), extras=tuple(extras),
                 test_paths=tuple(test_paths), pytest_args=tuple(args),
                 build_requires=tuple(str(b) for b in build), has_build_config=has_build)


def _read_requirements(path: str) -> list[str]:
  out = []
  for line in open(path, encoding="utf-8", errors="replace"):
    line = line.split("#", 1)[0].strip()
    if line and not line.startswith(("-", "git+", "http:", "https:", ".")):
      out.append(line)
  return out
