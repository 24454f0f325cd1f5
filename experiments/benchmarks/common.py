"""What the benchmark scripts share: platform set-up, timing, child processes and the JSON line.

Every script in this directory is an absl program (``app.run(main)``, flags at module level)
that prints one JSON line at the end (``emit``). Scripts that import JAX at module level call
``setup_platform()`` first:

  from experiments.benchmarks import common
  common.setup_platform()  # before jax is imported

  import jax  # noqa: E402

This module imports nothing heavy itself (no JAX), so importing it never fixes the platform.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- platform ---------------------------------------------------------------------------------
def setup_platform(platform: str = "cpu", host_devices: int | None = None) -> None:
  """Defaults JAX to ``platform`` (``JAX_PLATFORMS``, unless the caller's environment sets it)
  and, with ``host_devices``, asks XLA for that many host CPU devices (unless ``XLA_FLAGS``
  already says). Must run before JAX is imported; a no-op for what is already set."""
  os.environ.setdefault("JAX_PLATFORMS", platform)
  if host_devices:
    xla = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in xla:
      os.environ["XLA_FLAGS"] = (
          xla + f" --xla_force_host_platform_device_count={host_devices}").strip()


def child_env(platform: str | None = "cpu", pythonpath: bool = True) -> dict[str, str]:
  """This process's environment for a benchmark child process: ``JAX_PLATFORMS=platform``
  (None: as inherited) and, with ``pythonpath``, the repository root first on ``PYTHONPATH``
  (for a child run as a file)."""
  env = dict(os.environ)
  if platform is not None:
    env["JAX_PLATFORMS"] = platform
  if pythonpath:
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def load_avg_1m() -> float:
  """The host's 1-minute load average (every figure here is read with it)."""
  return round(os.getloadavg()[0], 2)


# -- timing -----------------------------------------------------------------------------------
class Timer:
  """Wall (``perf_counter``) and CPU (``process_time``, all threads of this process) seconds of
  a ``with`` block: ``with Timer() as t: ...`` then ``t.wall``, ``t.cpu``."""

  def __init__(self):
    self.wall = self.cpu = 0.0
    self._t0 = self._c0 = 0.0

  def __enter__(self) -> "Timer":
    self._c0, self._t0 = time.process_time(), time.perf_counter()
    return self

  def __exit__(self, *exc) -> None:
    self.wall = time.perf_counter() - self._t0
    self.cpu = time.process_time() - self._c0


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 1,
               sync: Callable[[Any], Any] | None = None) -> tuple[list[float], list[float]]:
  """Calls ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed; ``sync`` (e.g.
  ``jax.block_until_ready``) is applied to each result inside the timing. Returns (wall
  seconds, CPU seconds) per timed call."""
  sync = sync or (lambda x: x)
  for _ in range(warmup):
    sync(fn())
  walls, cpus = [], []
  for _ in range(repeats):
    with Timer() as t:
      sync(fn())
    walls.append(t.wall)
    cpus.append(t.cpu)
  return walls, cpus


def median(xs) -> float:
  return float(statistics.median(xs))


def step_timer(walls: list[float], cpus: list[float] | None = None) -> Callable[..., None]:
  """A callback that appends the wall (and CPU) seconds since its previous call (the first
  call: since ``step_timer`` was called) to ``walls`` (and ``cpus``): per-step times of a loop
  that reports each step through a callback (``sft.run_sft(on_step=...)``)."""
  marks = [time.perf_counter(), time.process_time()]

  def tick(*_):
    now = [time.perf_counter(), time.process_time()]
    walls.append(now[0] - marks[0])
    if cpus is not None:
      cpus.append(now[1] - marks[1])
    marks[:] = now

  return tick


# -- output -----------------------------------------------------------------------------------
def emit(result: dict, **dumps_kwargs) -> None:
  """Prints the benchmark's one JSON line (keys as given: BENCHMARKS.md quotes them)."""
  print(json.dumps(result, **dumps_kwargs), flush=True)


def note(obj) -> None:
  """A JSON progress line on stderr (what a child returned, one side done): stdout keeps only
  the result line."""
  print(json.dumps(obj), file=sys.stderr, flush=True)


def last_json_line(text: str) -> dict:
  """The JSON object on the last line of a child's stdout."""
  return json.loads(text.strip().splitlines()[-1])


def run_child(cmd: list[str], env: dict | None = None, cwd: str | None = None,
              tail: int = 3000) -> tuple[dict | None, str | None]:
  """Runs a benchmark child process; returns (its last JSON line, None) or (None, the exit
  status and the tail of its stderr)."""
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
  if proc.returncode:
    return None, f"exit {proc.returncode}: {proc.stderr[-tail:]}"
  return last_json_line(proc.stdout), None


# -- shared fixtures --------------------------------------------------------------------------
def collect_demos(num_demos: int, workdir: str, cfg, tokenizer=None):
  """Scripted demonstrations of the first ``num_demos`` training tasks of ``cfg`` through its
  harness (``sft.collect_demonstrations``), as the demo pipeline collects them; ``tokenizer``
  defaults to the one of ``cfg``'s policy (``pipeline.build_policy``)."""
  from legorl_jax.harnesses import registry
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import pipeline, sft
  _, _, train_tasks = pipeline.load_tasks(cfg)
  if tokenizer is None:
    _, tokenizer = pipeline.build_policy(cfg)
  adapter = registry.get_adapter(cfg.harness.name.split(":")[0])
  trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s),
                          max_turns=int(cfg.harness.max_turns),
                          sandbox=SandboxConfig(backend=cfg.sandbox.backend))
  return sft.collect_demonstrations(
      train_tasks[:num_demos], lambda t: adapter, tokenizer, trial_cfg,
      os.path.join(workdir, "demos"), os.path.join(workdir, "sockets"),
      concurrency=int(cfg.rollout.concurrency))
