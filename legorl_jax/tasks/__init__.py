"""legorl_jax.tasks: task schema, JSONL and TFDS datasets, SWE-bench import, synthetic tasks."""

from legorl_jax.tasks.jsonl import load_tasks_jsonl, write_tasks_jsonl
from legorl_jax.tasks.schema import Limits, RepoSource, Task, TaskMetadata, VerifierSpec

__all__ = ["Limits", "RepoSource", "Task", "TaskMetadata", "VerifierSpec", "load_tasks_jsonl", "write_tasks_jsonl"]
