"""Test-wide setup: 8 host CPU devices for mesh tests, CPU platform, slow marker, and one XLA
compilation cache for the whole session.

The cache: many tests compile the same programs (the tiny policy's train step, the engine's
prefill and decode), in this process, in the xdist workers and in the training processes the
pipeline tests start (a kill-and-resume test runs one config three times). JAX's persistent
cache lets each program compile once per session. The directory is new for every session (the
controller makes it, workers and subprocesses inherit it through the environment) and is
removed at the end, so no test ever reads an executable an earlier session compiled. Set
``JAX_COMPILATION_CACHE_DIR`` yourself to choose another (it is then kept).
"""

import os
import shutil
import tempfile

# Must happen before jax initialises its backends anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="legorl_jax_xla_cache_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slower test (CI runs it; skip locally with -m 'not slow')")
  config.addinivalue_line("markers", "docker: needs a running Docker engine")


def pytest_unconfigure(config):
  if _OWN_CACHE and not hasattr(config, "workerinput"):  # the controller, once workers are done
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
