"""Test-wide setup: 8 host CPU devices for mesh tests, CPU platform, slow marker."""

import os

# Must happen before jax initialises its backends anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slower test (CI runs it; skip locally with -m 'not slow')")
  config.addinivalue_line("markers", "docker: needs a running Docker engine")
