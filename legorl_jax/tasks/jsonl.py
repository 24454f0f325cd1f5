"""Reading and writing task JSONL files; one bad line never stops the others."""

from __future__ import annotations

import json
import logging
import os
from typing import Iterable

from legorl_jax.errors import TaskError, TaskValidationError
from legorl_jax.tasks.schema import Task

log = logging.getLogger(__name__)


def load_tasks_jsonl(path: str, *, strict: bool = False) -> tuple[list[Task], list[TaskValidationError]]:
  """Parses every line of ``path``; returns (valid tasks, one error per bad line).

  Relative repository paths are resolved against the file's directory. Duplicate ids are
  errors (the second occurrence). With ``strict=True`` the first error is raised instead.
  """
  if not os.path.isfile(path):
    raise TaskError(f"task file {path!r} does not exist; pass the path of a .jsonl task file")
  base_dir = os.path.dirname(os.path.abspath(path))
  tasks, errors, seen = [], [], set()
  with open(path, encoding="utf-8") as f:
    for lineno, raw in enumerate(f, start=1):
      if not raw.strip():
        continue
      try:
        try:
          obj = json.loads(raw)
        except json.JSONDecodeError as e:
          raise TaskValidationError(f"broken JSON: {e.msg} at column {e.colno}", path=path, line=lineno) from None
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


def write_tasks_jsonl(path: str, tasks: Iterable[Task]) -> int:
  """Writes tasks one JSON object per line; returns how many were written."""
  n = 0
  with open(path, "w", encoding="utf-8") as f:
    for t in tasks:
      f.write(json.dumps(t.to_dict(), sort_keys=True) + "\n")
      n += 1
  return n
