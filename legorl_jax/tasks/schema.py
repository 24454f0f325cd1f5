"""Task schema: one coding task = a repository, an instruction and a hidden grader.

Tasks travel as JSON objects (one per JSONL line, or one TFDS record). ``Task.from_dict``
validates everything up front so a malformed task fails at load time with the file, line
and field named, never halfway through a trial.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import posixpath
import re
from typing import Any

from legorl_jax.errors import InvalidJSONError, TaskValidationError
from legorl_jax.utils import safe_json

REPO_KINDS = ("dir", "archive", "git")
VERIFIER_KINDS = ("pyrunner", "pytest", "command")
DEFAULT_WORKDIR = "/workspace"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}$")
# The sandbox owns these paths (system dirs, its HOME, support files, proxy socket): a task's
# work dir may neither be one of them, nor sit inside or above one.
_RESERVED_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                  "/dev", "/sys", "/tmp", "/run/legorl", "/opt/legorl", "/home/agent", "/var/run")


@dataclasses.dataclass(frozen=True)
class RepoSource:
  """Where the repository comes from.

  kind="dir": ``path`` is a directory; kind="archive": ``path`` is a .tar/.tar.gz file or
  ``data`` holds the archive bytes; kind="git": ``url`` (a URL or local path) at ``commit``.
  Relative paths are resolved against ``base_dir`` (the directory of the task file).
  """
  kind: str
  path: str | None = None
  url: str | None = None
  commit: str | None = None
  data: bytes | None = dataclasses.field(default=None, repr=False)
  base_dir: str | None = dataclasses.field(default=None, compare=False)

  def to_dict(self) -> dict[str, Any]:
    d: dict[str, Any] = {"type": self.kind}
    if self.path is not None:
      d["path"] = self.path
    if self.url is not None:
      d["url"] = self.url
    if self.commit is not None:
      d["base_commit"] = self.commit
    if self.data is not None:
      d["archive_b64"] = base64.b64encode(self.data).decode("ascii")
    return d


@dataclasses.dataclass(frozen=True)
class VerifierSpec:
  """How the hidden tests are run.

  pyrunner: the stdlib runner (``legorl_jax/rewards/pyrunner.py``) over ``test_files`` —
  one short process, tens of milliseconds. pytest: ``python3 -m pytest`` over ``test_files``
  with JUnit XML. command: ``command`` (a shell string); reward from its exit code, or from
  a JUnit file it writes to ``$LEGORL_JUNIT`` if one appears.
  """
  kind: str = "pyrunner"
  test_files: tuple[str, ...] = ()
  command: str | None = None
  timeout_s: float = 60.0

  def to_dict(self) -> dict[str, Any]:
    d: dict[str, Any] = {"type": self.kind, "test_files": list(self.test_files), "timeout_s": self.timeout_s}
    if self.command is not None:
      d["command"] = self.command
    return d


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-trial resource limits (agent phase; the verifier has its own timeout)."""
  timeout_s: float = 1800.0
  memory_mb: int = 4096
  pids: int = 512
  cpus: float = 1.0

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TaskMetadata:
  language: str = "python"
  difficulty: str = ""
  source: str = ""
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict[str, Any]:
    return {"language": self.language, "difficulty": self.difficulty, "source": self.source, **self.extra}


@dataclasses.dataclass(frozen=True)
class Task:
  """A coding task. Paths in ``hidden_tests`` and ``protected_paths`` are repo-relative."""
  id: str
  repo: RepoSource
  instruction: str
  verifier: VerifierSpec = VerifierSpec()
  setup_commands: tuple[str, ...] = ()
  hidden_tests: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
  test_patch: str = dataclasses.field(default="", repr=False)
  gold_patch: str = dataclasses.field(default="", repr=False)
  fail_to_pass: tuple[str, ...] = ()
  pass_to_pass: tuple[str, ...] = ()
  image: str | None = None
  workdir: str = DEFAULT_WORKDIR
  protected_paths: tuple[str, ...] = ()
  limits: Limits = Limits()
  metadata: TaskMetadata = TaskMetadata()

  @property
  def test_ids(self) -> tuple[str, ...]:
    return self.fail_to_pass + self.pass_to_pass

  def to_dict(self) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": self.id, "repo": self.repo.to_dict(), "instruction": self.instruction,
        "verifier": self.verifier.to_dict(), "setup_commands": list(self.setup_commands),
        "hidden_tests": dict(self.hidden_tests), "test_patch": self.test_patch,
        "gold_patch": self.gold_patch, "FAIL_TO_PASS": list(self.fail_to_pass),
        "PASS_TO_PASS": list(self.pass_to_pass), "workdir": self.workdir,
        "protected_paths": list(self.protected_paths), "limits": self.limits.to_dict(),
        "metadata": self.metadata.to_dict(),
    }
    if self.image:
      d["image"] = self.image
    return d

  @classmethod
  def from_dict(cls, d: Any, *, path: str | None = None, line: int | None = None,
                base_dir: str | None = None) -> "Task":
    """Validates a JSON object and builds a Task; raises TaskValidationError naming the field."""
    return _Parser(path, line).task(d, base_dir)


_TOP_KEYS = {"id", "repo", "instruction", "verifier", "setup_commands", "hidden_tests", "test_patch",
             "gold_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image", "workdir", "protected_paths",
             "limits", "metadata"}


class _Parser:
  """Field-by-field validation that reports the first problem with its location."""

  def __init__(self, path, line):
    self.path, self.line = path, line

  def err(self, field, msg):
    return TaskValidationError(msg, path=self.path, line=self.line, field=field)

  def typed(self, d, key, types, field, default=None, required=False):
    if key not in d or d[key] is None:
      if required:
        raise self.err(field, "is required")
      return default
    v = d[key]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
      raise self.err(field, f"expected {_tname(types)}, got bool")
    if not isinstance(v, types):
      raise self.err(field, f"expected {_tname(types)}, got {type(v).__name__}")
    return v

  def str_list(self, d, key, field):
    v = self.typed(d, key, list, field, default=[])
    for i, x in enumerate(v):
      if not isinstance(x, str) or not x:
        raise self.err(f"{field}[{i}]", "expected a non-empty string")
    return tuple(v)

  def rel_path(self, p, field):
    if (not isinstance(p, str) or not p or p.startswith("/") or ".." in p.split("/") or "\x00" in p
        or posixpath.normpath(p) == "."):
      raise self.err(field, f"{p!r} must be a relative path inside the repository (no '..', no leading '/')")
    return posixpath.normpath(p)

  def task(self, d, base_dir):
    if not isinstance(d, dict):
      raise self.err(None, f"a task must be a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - _TOP_KEYS)
    if unknown:
      raise self.err(unknown[0], f"unknown field; known fields are {sorted(_TOP_KEYS)}")
    tid = self.typed(d, "id", str, "id", required=True)
    if not _ID_RE.match(tid):
      raise self.err("id", f"{tid!r} is not a valid id (letters, digits, '_', '-', '.', '/'; at most 200)")
    instruction = self.typed(d, "instruction", str, "instruction", required=True)
    if not instruction.strip():
      raise self.err("instruction", "must not be empty")
    repo = self.repo(self.typed(d, "repo", dict, "repo", required=True), base_dir)
    verifier = self.verifier(self.typed(d, "verifier", dict, "verifier", default={}))
    hidden = self.typed(d, "hidden_tests", dict, "hidden_tests", default={})
    hidden_tests = {}
    for k, v in hidden.items():
      if not isinstance(v, str):
        raise self.err(f"hidden_tests[{k!r}]", f"file content must be a string, got {type(v).__name__}")
      hidden_tests[self.rel_path(k, f"hidden_tests[{k!r}]")] = v
    test_patch = self.typed(d, "test_patch", str, "test_patch", default="")
    if verifier.kind != "command" and not verifier.test_files and not hidden_tests and not test_patch:
      raise self.err("verifier", "no tests: give hidden_tests, test_patch or verifier.test_files")
    workdir = self.typed(d, "workdir", str, "workdir", default=DEFAULT_WORKDIR)
    if not workdir.startswith("/") or workdir == "/" or ".." in workdir.split("/") or "\x00" in workdir:
      raise self.err("workdir", f"{workdir!r} must be an absolute path other than '/'")
    norm = posixpath.normpath(workdir)
    for r in _RESERVED_DIRS:
      if norm == r or norm.startswith(r + "/") or r.startswith(norm + "/"):
        raise self.err("workdir", f"{workdir!r} overlaps {r}, which the sandbox owns; use a "
                       f"directory of its own such as {DEFAULT_WORKDIR} or /testbed")
    image = self.typed(d, "image", str, "image", default=None)
    if image is not None and (not image.strip() or any(c.isspace() for c in image)):
      raise self.err("image", f"{image!r} is not a valid image name")
    return Task(
        id=tid, repo=repo, instruction=instruction, verifier=verifier,
        setup_commands=self.str_list(d, "setup_commands", "setup_commands"),
        hidden_tests=hidden_tests, test_patch=test_patch,
        gold_patch=self.typed(d, "gold_patch", str, "gold_patch", default=""),
        fail_to_pass=self.test_list(d, "FAIL_TO_PASS"), pass_to_pass=self.test_list(d, "PASS_TO_PASS"),
        image=image, workdir=posixpath.normpath(workdir),
        protected_paths=self.str_list(d, "protected_paths", "protected_paths"),
        limits=self.limits(self.typed(d, "limits", dict, "limits", default={})),
        metadata=self.metadata(self.typed(d, "metadata", dict, "metadata", default={})))

  def test_list(self, d, key):
    v = d.get(key)
    if isinstance(v, str):  # SWE-bench stores these lists as JSON strings.
      try:
        v = safe_json.loads(v, what="the value")
      except InvalidJSONError as e:
        raise self.err(key, f"not a JSON list: {e}") from None
      d = {key: v}
    return self.str_list(d, key, key)

  def repo(self, r, base_dir):
    kind = self.typed(r, "type", str, "repo.type", required=True)
    if kind not in REPO_KINDS:
      raise self.err("repo.type", f"{kind!r} is not one of {REPO_KINDS}")
    unknown = sorted(set(r) - {"type", "path", "url", "base_commit", "archive_b64"})
    if unknown:
      raise self.err(f"repo.{unknown[0]}", "unknown field")
    path = self.typed(r, "path", str, "repo.path")
    url = self.typed(r, "url", str, "repo.url")
    commit = self.typed(r, "base_commit", str, "repo.base_commit")
    data = None
    if "archive_b64" in r and r["archive_b64"] is not None:
      try:
        data = base64.b64decode(self.typed(r, "archive_b64", str, "repo.archive_b64"), validate=True)
      except ValueError as e:
        raise self.err("repo.archive_b64", f"invalid base64: {e}") from None
    if kind == "dir" and not path:
      raise self.err("repo.path", "is required for a 'dir' repository")
    if kind == "archive" and not path and data is None:
      raise self.err("repo.path", "an 'archive' repository needs 'path' or 'archive_b64'")
    if kind == "git":
      if not url:
        raise self.err("repo.url", "is required for a 'git' repository")
      if url.startswith("-") or "::" in url.split("/")[0] or any(c.isspace() or c == "\x00" for c in url):
        raise self.err("repo.url", f"{url!r} is not a repository URL or path (no leading '-', no "
                       "'transport::' prefix, no whitespace)")
      if (not commit or commit.startswith("-") or ".." in commit
          or not re.fullmatch(r"[0-9a-fA-F]{7,40}|[A-Za-z0-9_./\-]+", commit)):
        raise self.err("repo.base_commit", "is required for a 'git' repository (a commit hash or ref)")
    return RepoSource(kind=kind, path=path, url=url, commit=commit, data=data, base_dir=base_dir)

  def verifier(self, v):
    unknown = sorted(set(v) - {"type", "test_files", "command", "timeout_s"})
    if unknown:
      raise self.err(f"verifier.{unknown[0]}", "unknown field")
    kind = self.typed(v, "type", str, "verifier.type", default="pyrunner")
    if kind not in VERIFIER_KINDS:
      raise self.err("verifier.type", f"{kind!r} is not one of {VERIFIER_KINDS}")
    files = tuple(self.rel_path(f, f"verifier.test_files[{i}]")
                  for i, f in enumerate(self.str_list(v, "test_files", "verifier.test_files")))
    command = self.typed(v, "command", str, "verifier.command")
    if kind == "command" and not command:
      raise self.err("verifier.command", "is required when verifier.type is 'command'")
    timeout = self.typed(v, "timeout_s", (int, float), "verifier.timeout_s", default=60.0)
    if not math.isfinite(timeout) or timeout <= 0:
      raise self.err("verifier.timeout_s", f"must be a positive finite number, got {timeout!r}")
    return VerifierSpec(kind=kind, test_files=files, command=command, timeout_s=float(timeout))

  def limits(self, v):
    out = {}
    for f in dataclasses.fields(Limits):
      if f.name in v:
        x = v[f.name]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
          raise self.err(f"limits.{f.name}", f"must be a positive finite number, got {x!r}")
        out[f.name] = int(x) if f.type in ("int", int) else float(x)
    unknown = sorted(set(v) - set(out))
    if unknown:
      raise self.err(f"limits.{unknown[0]}", f"unknown field; known: {[f.name for f in dataclasses.fields(Limits)]}")
    return Limits(**out)

  def metadata(self, m):
    known = {}
    for k in ("language", "difficulty", "source"):
      if k in m:
        known[k] = str(self.typed(m, k, (str,), f"metadata.{k}"))
    extra = {k: v for k, v in m.items() if k not in known}
    return TaskMetadata(**known, extra=extra)


def _tname(types):
  if isinstance(types, tuple):
    return " or ".join(t.__name__ for t in types)
  return types.__name__
