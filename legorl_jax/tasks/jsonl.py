"""Reading and writing task JSONL files; one bad line never stops the others."""

from __future__ import annotations

import json
import logging
import os
from typing import Iterable, Iterator

from legorl_jax.errors import InvalidJSONError, TaskError, TaskValidationError
from legorl_jax.tasks.schema import Task
from legorl_jax.utils import safe_json

log = logging.getLogger(__name__)
MAX_LINE_BYTES = 1 << 30  # inline archives make long lines; a runaway line must not eat the host


def load_tasks_jsonl(path: str, *, strict: bool = False, max_line_bytes: int = MAX_LINE_BYTES
                     ) -> tuple[list[Task], list[TaskValidationError]]:
  """Parses every line of ``path``; returns (valid tasks, one error per bad line).

  A bad line (broken JSON, not UTF-8, longer than ``max_line_bytes``, an invalid task, a
  duplicate id) becomes a TaskValidationError with its line number and the other lines still
  load. Relative repository paths are resolved against the file's directory. With
  ``strict=True`` the first error is raised instead.
  """
  if not os.path.isfile(path):
    raise TaskError(f"task file {path!r} does not exist; pass the path of a .jsonl task file")
  base_dir = os.path.dirname(os.path.abspath(path))
  tasks, errors, seen = [], [], set()
  with open(path, "rb") as f:
    for lineno, raw in enumerate(_lines(f, max_line_bytes), start=1):
      try:
        if raw is None:
          raise TaskValidationError(f"line is longer than {max_line_bytes} bytes; split the task or "
                                    "keep its repository in a separate archive file", path=path, line=lineno)
        try:
          text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise TaskValidationError(f"not valid UTF-8 (byte {e.start}); re-encode the file as UTF-8",
                                    path=path, line=lineno) from None
        if not text.strip():
          continue
        try:
          obj = safe_json.loads(text, what="the line")
        except InvalidJSONError as e:
          raise TaskValidationError(f"broken JSON ({e})", path=path, line=lineno) from None
        task = Task.from_dict(obj, path=path, line=lineno, base_dir=base_dir)
        if task.id in seen:
          raise TaskValidationError(f"duplicate task id {task.id!r}", path=path, line=lineno, field="id")
        seen.add(task.id)
        tasks.append(task)
      except TaskValidationError as e:
        if strict:
          raise
        log.warning("skipping task: %s", e)
        errors.append(e)
  return tasks, errors


def _lines(f, limit: int) -> Iterator[bytes | None]:
  """The file's lines as bytes; None (after skipping it) for a line over ``limit`` bytes."""
  while True:
    line = f.readline(limit + 1)
    if not line:
      return
    if len(line) > limit and not line.endswith(b"\n"):
      while line and not line.endswith(b"\n"):  # drop the rest of the overlong line
        line = f.readline(1 << 20)
      yield None
    else:
      yield line


def write_tasks_jsonl(path: str, tasks: Iterable[Task]) -> int:
  """Writes tasks one JSON object per line; returns how many were written."""
  n = 0
  with open(path, "w", encoding="utf-8") as f:
    for t in tasks:
      f.write(json.dumps(t.to_dict(), sort_keys=True) + "\n")
      n += 1
  return n
