"""``XLA_FLAGS`` for the processes a test starts (training runs, workers, notebook kernels).

A subprocess that must not inherit the session's 8 host devices sets its own ``XLA_FLAGS``;
it takes the session's compile flags (``LEGORL_TEST_XLA_FLAGS``, set in ``tests/conftest.py``)
from here, so it compiles as fast as the tests in the workers do.
"""

import os


def subprocess_xla_flags(devices: int | None = None) -> str:
  """The session's compile flags, plus ``devices`` host CPU devices when given."""
  flags = os.environ.get("LEGORL_TEST_XLA_FLAGS", "")
  if devices is not None:
    flags = f"--xla_force_host_platform_device_count={devices} {flags}"
  return flags.strip()
