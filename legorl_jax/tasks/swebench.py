"""Import of SWE-bench-family JSONL (SWE-bench / Verified, SWE-Gym, SWE-smith) into Tasks.

A record has ``instance_id, repo, base_commit, patch, test_patch, FAIL_TO_PASS,
PASS_TO_PASS`` (the two lists may be JSON strings) and a ``problem_statement``; image names
come from ``image_name`` / ``docker_image`` when present (SWE-smith, SWE-Gym), else from
SWE-bench's naming scheme. The repository is fetched by git (``git_mirror_dir`` of the
sandbox can point at local clones) and placed where the image expects it (``/testbed``).
These tasks keep pytest as the verifier.
"""

from __future__ import annotations

import logging
import os

from legorl_jax.errors import InvalidJSONError, TaskError, TaskValidationError
from legorl_jax.tasks.schema import Task
from legorl_jax.utils import safe_json

log = logging.getLogger(__name__)

SWEBENCH_IMAGE = "swebench/sweb.eval.x86_64.{key}:latest"
GITHUB_URL = "https://github.com/{repo}.git"


def default_image(instance_id: str) -> str:
  """SWE-bench's published image name for an instance."""
  return SWEBENCH_IMAGE.format(key=instance_id.replace("__", "_1776_").lower())


def record_to_task(rec: dict, *, source: str = "swe-bench", workdir: str = "/testbed",
                   verifier_timeout_s: float = 900.0, path: str | None = None,
                   line: int | None = None) -> Task:
  """One SWE-bench-style record as a Task (validated)."""
  if not isinstance(rec, dict):
    raise TaskValidationError("record is not a JSON object", path=path, line=line)
  for key in ("instance_id", "repo"):
    if not rec.get(key):
      raise TaskValidationError("is required", path=path, line=line, field=key)
  iid, repo = rec["instance_id"], rec["repo"]
  commit = rec.get("base_commit") or (iid if source == "swe-smith" else None)
  if not commit:
    raise TaskValidationError("is required", path=path, line=line, field="base_commit")
  image = rec.get("image_name") or rec.get("docker_image") or default_image(iid)
  url = rec.get("repo_url") or GITHUB_URL.format(repo=repo)
  d = {
      "id": iid.replace(" ", "_"),
      "repo": {"type": "git", "url": url, "base_commit": commit},
      "instruction": rec.get("problem_statement") or f"Resolve the issue of {iid}.",
      "verifier": {"type": "pytest", "timeout_s": verifier_timeout_s},
      "test_patch": rec.get("test_patch") or "",
      "gold_patch": rec.get("patch") or "",
      "FAIL_TO_PASS": rec.get("FAIL_TO_PASS") or [],
      "PASS_TO_PASS": rec.get("PASS_TO_PASS") or [],
      "image": image,
      "workdir": workdir,
      "metadata": {"language": "python", "source": source,
                   **{k: rec[k] for k in ("version", "environment_setup_commit", "created_at") if k in rec}},
  }
  return Task.from_dict(d, path=path, line=line)


def import_swebench_jsonl(path: str, *, source: str = "swe-bench", **kwargs
                          ) -> tuple[list[Task], list[TaskValidationError]]:
  """All valid records of a SWE-bench-style JSONL file, and one error per bad line."""
  if not os.path.isfile(path):
    raise TaskError(f"SWE-bench file {path!r} does not exist")
  tasks, errors = [], []
  with open(path, encoding="utf-8") as f:
    for lineno, raw in enumerate(f, start=1):
      if not raw.strip():
        continue
      try:
        try:
          rec = safe_json.loads(raw, what="the record")
        except InvalidJSONError as e:
          raise TaskValidationError(f"broken JSON ({e})", path=path, line=lineno) from None
        tasks.append(record_to_task(rec, source=source, path=path, line=lineno, **kwargs))
      except TaskValidationError as e:
        log.warning("skipping SWE-bench record: %s", e)
        errors.append(e)
  return tasks, errors
