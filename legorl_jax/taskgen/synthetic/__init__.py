"""Synthetic bug-fix tasks: small real Python repositories with one injected bug."""

from legorl_jax.taskgen.synthetic.generator import (DIFFICULTIES, FAMILIES, generate_task_pool, generate_tasks,
                                                    split_of)

__all__ = ["DIFFICULTIES", "FAMILIES", "generate_task_pool", "generate_tasks", "split_of"]
