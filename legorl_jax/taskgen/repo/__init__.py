"""Tasks from real repositories, the SWE-smith way.

Point the builder at any Python project with a test suite (a directory, a git checkout, an
sdist, or a PyPI release): it builds the project's environment once, runs the suite, mutates
the project's functions one at a time, keeps the mutations that break some passing tests and
no others, and writes each as a task whose hidden tests are the project's own. Modules:

  source.py       the project's files, from whatever the user points at
  env_spec.py     how to install it and run its tests (discovered from its config)
  repo_image.py   the per-repository Docker image (built once, cached by content hash)
  suite.py        running the suite in a sandbox and reading per-test results
  mutate.py       the functions of the project and the mutations of each
  instruction.py  issue-style text that names the symptom, never the fix
  builder.py      baseline -> mutations -> tasks -> validation -> JSONL
"""

from legorl_jax.taskgen.repo.builder import BuildConfig, BuildReport, build_tasks

__all__ = ["BuildConfig", "BuildReport", "build_tasks"]
