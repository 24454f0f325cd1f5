"""legorl_jax.taskgen: builders that write tasks (``legorl_jax.tasks.Task``).

Kept apart from ``legorl_jax.tasks`` (the data model) because building a task runs it: the
builders need sandboxes, verifiers and the scripted harness, while everything that only reads
tasks (sandboxes, rewards, rollout) must not depend on them.

  synthetic/  small real Python repositories with one injected bug, from templates
  repo/       tasks from a real project's own test suite, mutated the SWE-smith way
"""
