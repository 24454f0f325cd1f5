"""A TFDS builder that turns task JSONL files (plus their repositories) into array_record.

Each record holds the task's JSON and, for directory or archive repositories, the
repository itself as a .tar.gz (synthetic repositories are a few KB), so a built dataset is
self-contained: it can be copied to another host and read with random access, without
TensorFlow, through ``tfds.data_source``.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
import tempfile

import numpy as np
import tensorflow_datasets as tfds

from legorl_jax.errors import InvalidJSONError, TaskError
from legorl_jax.tasks import jsonl, repo as repo_lib
from legorl_jax.tasks.schema import RepoSource, Task
from legorl_jax.utils import safe_json

log = logging.getLogger(__name__)

RECORD_ARCHIVE = "@record"  # repo.path placeholder: the archive is the record's repo_archive


def _repo_archive(task: Task) -> bytes:
  r = task.repo
  if r.kind == "archive" and r.data is not None:
    return r.data
  if r.kind in ("dir", "archive"):
    with tempfile.TemporaryDirectory() as tmp:
      dest = os.path.join(tmp, "repo")
      repo_lib.materialize_repo(r, dest)
      return repo_lib.archive_dir(dest)
  return b""


class TaskDataset(tfds.core.GeneratorBasedBuilder):
  """Tasks from JSONL files: ``TaskDataset(jsonl_files={"train": path, ...}, data_dir=...)``."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Task JSON + repository archive per record."}

  # No downloads, so no checksum file; this also keeps TFDS from resolving the code path
  # through `importlib_resources`, which is not installed here.
  @tfds.core.utils.classproperty
  @classmethod
  def url_infos(cls):
    return None

  def __init__(self, *, jsonl_files: dict[str, str] | None = None, **kwargs):
    self._jsonl_files = dict(jsonl_files or {})
    self.skipped: dict[str, list[str]] = {}
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="Coding tasks for legorl_jax: instruction, repository, hidden tests.",
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "task_json": tfds.features.Text(),
            "repo_archive": tfds.features.Tensor(shape=(), dtype=np.object_),
        }))

  def _split_generators(self, dl_manager):
    if not self._jsonl_files:
      raise TaskError("TaskDataset needs jsonl_files={split: path} to build")
    return {split: self._generate_examples(path, split) for split, path in self._jsonl_files.items()}

  def _generate_examples(self, path, split):
    tasks, errors = jsonl.load_tasks_jsonl(path)
    self.skipped[split] = [str(e) for e in errors]
    for task in tasks:
      try:
        archive = _repo_archive(task)
      except (TaskError, OSError, tarfile.TarError) as e:
        log.warning("skipping task %s: %s", task.id, e)
        self.skipped[split].append(f"{task.id}: {e}")
        continue
      d = task.to_dict()
      if archive:
        d["repo"] = {"type": "archive", "path": RECORD_ARCHIVE}
      yield task.id, {"id": task.id, "task_json": json.dumps(d, sort_keys=True), "repo_archive": archive}


def build_task_dataset(jsonl_files: dict[str, str], data_dir: str) -> str:
  """Builds the array_record dataset; returns the directory to read it from."""
  builder = TaskDataset(jsonl_files=jsonl_files, data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(verify_ssl=False))
  for split, errs in builder.skipped.items():
    for e in errs:
      log.warning("split %s: skipped %s", split, e)
  return builder.data_dir


def record_to_task(record: dict) -> Task:
  """Task from one data-source record (bytes fields as the array_record source returns)."""
  def text(x):
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)
  try:
    d = safe_json.loads(text(record["task_json"]), what=f"task_json of record {text(record['id'])}")
  except InvalidJSONError as e:
    raise TaskError(f"{e}; rebuild the TFDS dataset (experiments.make_tasks --build_tfds)") from None
  task = Task.from_dict(d, path=f"<record {text(record['id'])}>")
  archive = record.get("repo_archive")
  if isinstance(archive, np.ndarray):
    archive = archive.item()
  if archive:
    task = _with_repo(task, RepoSource(kind="archive", data=bytes(archive)))
  return task


def _with_repo(task: Task, repo: RepoSource) -> Task:
  import dataclasses
  return dataclasses.replace(task, repo=repo)


def open_task_source(dataset_dir: str, split: str = "train"):
  """The random-access array_record data source of one split (records, not Tasks)."""
  if not os.path.isdir(dataset_dir):
    raise TaskError(f"task dataset {dataset_dir!r} does not exist; build it with build_task_dataset")
  builder = tfds.builder_from_directory(dataset_dir)
  if split not in builder.info.splits:
    raise TaskError(f"split {split!r} not in {dataset_dir}; available: {list(builder.info.splits)}")
  return builder.as_data_source(split=split)
