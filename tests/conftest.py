"""Test-wide setup: 8 host CPU devices for mesh tests, CPU platform, fast (LLVM -O0) XLA
compiles, slow marker, and one XLA compilation cache for the whole session.

The cache: many tests compile the same programs (the tiny policy's train step, the engine's
prefill and decode), in this process, in the xdist workers and in the training processes the
pipeline tests start (a kill-and-resume test runs one config three times). JAX's persistent
cache lets each program compile once per session. The directory is new for every session (the
controller makes it, workers and subprocesses inherit it through the environment) and is
removed at the end, so no test ever reads an executable an earlier session compiled. Set
``JAX_COMPILATION_CACHE_DIR`` yourself to choose another (it is then kept).

Where the suite's time goes: with ``LEGORL_TEST_RUSAGE=FILE`` set, every test appends one JSON
line to FILE: its node id, outcome, worker, wall seconds (setup + call + teardown), and CPU
seconds of the worker process and of the child processes it reaped meanwhile (a pipeline
subprocess's line includes its own trial processes). CPU seconds stretch much less than wall
seconds when the host is loaded, so they say roughly what a test costs even on a busy machine,
but not exactly: spinning thread pools and shared caches add some (the dense pipeline kill test
took 104 CPU-s in one suite run and 114 in another, 2026-12-04), and the same tests' CPU moved
14% between hours on this host. CPU well below wall means the test waits, and more workers
would overlap it. ``compile_s`` is the wall time JAX spent
tracing, lowering and compiling in the worker itself (subprocesses not included).
"""

import json
import os
import resource
import shutil
import tempfile
import time

import pytest

# Must happen before jax initialises its backends anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most of the suite's CPU time is XLA compiling small programs, and most of a CPU compile is
# LLVM optimising the generated loops. At LLVM -O0 the same tests take ~20-30% fewer CPU
# seconds (test_train_step 87 -> 60, test_trunk_cache 71 -> 51). No fast-math is on at either
# level; the generated code differs, so the last bits of a float result can (one logit of
# 7,680 in test_expert_mesh moved by 1e-5, 4e-6 relative), within what float32 comparisons
# allow. The heavy lifting (matmuls) runs in precompiled libraries, so the compiled code runs
# about as fast (test_gguf's real-model forwards: 48 -> 46). Runs, demos and benchmarks keep
# XLA's default. Set LEGORL_TEST_XLA_FLAGS="" to test at the default level; subprocesses take
# the same flags (tests/xla_flags.py).
# XLA's CPU fusion emitters (MLIR, on by default) cost about twice the compile CPU of the
# elemental LLVM emitters on these small programs (the tiny policy's gradient: 1.06 -> 0.48
# CPU-s; test_train_step + test_steps: 93 -> 55 CPU-s, 2026-12-04); the compiled loops run
# about as fast. Tests compile with the elemental emitters; runs keep XLA's default.
os.environ.setdefault("LEGORL_TEST_XLA_FLAGS",
                      "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
  _flags += " " + os.environ["LEGORL_TEST_XLA_FLAGS"]
os.environ["XLA_FLAGS"] = _flags.strip()
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="legorl_jax_xla_cache_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_configure(config):
  if os.environ.get("LEGORL_TEST_RUSAGE"):  # jax.monitoring starts no backend
    import jax.monitoring
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
  config.addinivalue_line("markers", "slow: slower test (CI runs it; skip locally with -m 'not slow')")
  config.addinivalue_line("markers", "docker: needs a running Docker engine")


def pytest_unconfigure(config):
  if _OWN_CACHE and not hasattr(config, "workerinput"):  # the controller, once workers are done
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


_COMPILE_S = {"total": 0.0}
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


def _on_duration(event, duration_secs, **kwargs):
  del kwargs
  if event in _COMPILE_EVENTS:
    _COMPILE_S["total"] += duration_secs


# The longest test files, longest first (wall seconds in a three-worker run, 2026-12-04: the MoE
# and dense pipeline kill tests 157 and 121, one file then; then 164, 105, 105, 102, 102, 98,
# 96, 87, 84, 81). xdist hands whole files to the workers in collection order, so a long file
# collected late (``reliability/`` sorts after most) starts when the other workers are nearly
# done and the suite waits on it alone; started first, the short files fill in around it.
# Order only: every test still runs, in its file's own order.
_LONGEST_FIRST = (
    "tests/reliability/test_pipeline_kill_moe.py", "tests/reliability/test_pipeline_kill.py",
    "tests/trainer/test_pipeline.py", "tests/harnesses/test_claude_code.py",
    "tests/colab/test_notebooks.py", "tests/sharding/test_multihost_rl.py",
    "tests/trainer/test_multihost.py", "tests/trainer/test_trunk_cache.py",
    "tests/sampling/test_engine_routes.py", "tests/models/test_gguf.py",
    "tests/reliability/test_trainer_kill.py", "tests/trainer/test_train_step.py")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {f: i for i, f in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable


def _cpu_s() -> tuple[float, float]:
  own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


_OUTCOME: dict[str, str] = {}


def pytest_runtest_logreport(report):
  if report.failed:
    _OUTCOME[report.nodeid] = "failed"
  elif report.skipped:
    _OUTCOME.setdefault(report.nodeid, "skipped")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  path = os.environ.get("LEGORL_TEST_RUSAGE")
  if not path:
    yield
    return
  t0, (own0, kids0), c0 = time.perf_counter(), _cpu_s(), _COMPILE_S["total"]
  yield
  own1, kids1 = _cpu_s()
  line = {"test": item.nodeid, "outcome": _OUTCOME.pop(item.nodeid, "passed"),
          "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
          "wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(own1 - own0, 3),
          "children_cpu_s": round(kids1 - kids0, 3),
          "compile_s": round(_COMPILE_S["total"] - c0, 3)}
  with open(path, "a") as f:  # one short write per line: workers' lines do not interleave
    f.write(json.dumps(line) + "\n")
