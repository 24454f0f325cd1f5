"""``XLA_FLAGS`` for the processes a test starts (training runs, workers, notebook kernels).

A subprocess that must not inherit the session's 8 host devices sets its own ``XLA_FLAGS``;
it takes the session's compile flags (``LEGORL_TEST_XLA_FLAGS``, set in ``tests/conftest.py``)
from here, so it compiles as fast as the tests in the workers do.
"""

import os


def subprocess_xla_flags(devices: int | None = None, *, xla_default: bool = False) -> str:
  """The session's compile flags, plus ``devices`` host CPU devices when given.

  ``xla_default``: XLA's default compile level instead, for a process that runs many steps of
  the same few programs: it spends more CPU running them than compiling them, and XLA's default
  level wins. Measured on one
  ``experiments.train`` process of the dense pipeline kill test (two RL steps, warm cache):
  33 -> 21 user CPU-s; the dense kill test (three such processes): 104 -> 78 CPU-s. The other
  subprocess tests (SFT, evaluation, the multi-host and notebook runs) gained nothing, and the
  trainer kill test (many short restarts) lost 25 CPU-s, so they keep the session's flags.
  """
  flags = "" if xla_default else os.environ.get("LEGORL_TEST_XLA_FLAGS", "")
  if devices is not None:
    flags = f"--xla_force_host_platform_device_count={devices} {flags}"
  return flags.strip()
