"""legorl_jax.tasks: the task data model (schema, repository archive, JSONL, TFDS, SWE-bench import).

It imports nothing above `errors` and `utils`, so sandboxes, rewards and rollout can all read
tasks; the builders that write them live in `legorl_jax.taskgen`.
"""

from legorl_jax.tasks.jsonl import load_tasks_jsonl, write_tasks_jsonl
from legorl_jax.tasks.schema import Limits, RepoSource, Task, TaskMetadata, VerifierSpec

__all__ = ["Limits", "RepoSource", "Task", "TaskMetadata", "VerifierSpec", "load_tasks_jsonl", "write_tasks_jsonl"]
