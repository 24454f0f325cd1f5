"""Runs many trials concurrently and accounts for every one of them.

``run_trials(jobs, proxy, config, out_dir)`` runs each ``TrialJob`` (task + adapter) on a
thread pool. A trial that ends with an *infrastructure* status (``harness_error``,
``sandbox_error``, ``verifier_error``) says nothing about the policy, so it is retried up to
``max_retries`` times; a *policy* outcome (solved, failed, timeout, overlong, reward_hack) is
final. Only the last attempt of each job is counted. Every attempt is appended to
``out_dir/trials.jsonl`` as it finishes (one ``TrialResult.record()`` per line, ``final``
marking the counted one) and ``out_dir/summary.json`` holds the totals.

Where attempts run: here, on the pool's threads (the default), or, with ``backend=`` a
``rollout.ray_backend.RayTrialBackend``, as Ray tasks on a cluster, each pool thread waiting
for one; the retry rules, records and callbacks are the same either way, and a retry is sent
to a node other than the ones its earlier attempts failed on (``TrialResult.node``).

The training loop reuses this with its own callback (``on_result``) to collect trajectories.
A job with a ``seed`` gets a seeded proxy session (``ProxyService.set_session_seed``, attempt
``a`` seeded with ``derive_seed(seed, a)``), so its sampled tokens are reproducible.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Sequence

from legorl_jax import errors
from legorl_jax.harnesses.base import HarnessAdapter
from legorl_jax.proxy.service import derive_seed
from legorl_jax.rewards import status as st
from legorl_jax.rollout.trial import TrialConfig, TrialResult, run_trial
from legorl_jax.sandbox import SandboxConfig, runtime_check
from legorl_jax.tasks.schema import Task

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrialJob:
  """One trial to run: ``group`` ties repeated samples of a task together (GRPO groups);
  ``seed`` (optional) seeds its proxy session's sampling. ``proxy`` and ``out_dir`` (optional)
  replace ``run_trials``'s for this job: one pool can run trials of several proxies (sampled
  and greedy evaluation) into several directories."""

  task: Task
  adapter: HarnessAdapter
  group: int = -1
  seed: int | None = None
  proxy: Any = None
  out_dir: str | None = None


def summarize(results: Sequence[TrialResult]) -> dict[str, Any]:
  """``solve_rate`` over all counted trials (infrastructure failures count as unsolved here;
  ``solve_rate_valid`` excludes them), ``n_trials``, counts by status and by harness."""
  n = len(results)
  by_status = collections.Counter(r.status for r in results)
  by_harness: dict[str, dict[str, int]] = {}
  for r in results:
    h = by_harness.setdefault(r.harness, {"n_trials": 0, "solved": 0})
    h["n_trials"] += 1
    h["solved"] += int(r.status == st.SOLVED)
  solved = by_status.get(st.SOLVED, 0)
  valid = sum(c for s, c in by_status.items() if not st.is_infrastructure(s))
  return {
      "solve_rate": solved / n if n else 0.0,
      "solve_rate_valid": solved / valid if valid else 0.0,
      "n_trials": n,
      "n_solved": solved,
      "mean_reward": sum(r.reward for r in results) / n if n else 0.0,
      "status_counts": dict(sorted(by_status.items())),
      "by_harness": by_harness,
      "retries": sum(r.attempt for r in results),
      "mean_turns": sum(r.turns for r in results) / n if n else 0.0,
      "sampled_tokens": sum(r.sampled_tokens for r in results),
  }


def check_local_verifiers(tasks: Sequence[Task], sandbox: SandboxConfig) -> None:
  """Refuses pytest-graded tasks on the local backend when its ``python3`` has no pytest,
  before the first trial (each would otherwise end ``verifier_error`` after a full harness run).
  """
  if sandbox.backend != "local":
    return
  needing = [t.id for t in tasks if t.verifier.kind == "pytest"]
  if not needing:
    return
  exe, missing = runtime_check.missing_python_modules(["pytest"], sandbox.env)
  if missing:
    raise errors.ConfigError(
        f"{len(needing)} task(s) (e.g. {needing[0]!r}) are graded with pytest, but the local "
        f"sandbox's python3 ({exe or 'not found on the sandbox PATH'}) cannot import pytest. "
        "Install it for that interpreter (`apt-get install python3-pytest`, as "
        ".ci/setup_system.sh does), or run these tasks on Docker "
        "(--config.sandbox.backend=docker), whose task image installs the project's test "
        "dependencies.")


def run_trials(jobs: Sequence[TrialJob], proxy, config: TrialConfig, out_dir: str, *,
               concurrency: int = 2, max_retries: int = 1,
               on_result: Callable[[TrialResult], None] | None = None,
               extra_summary: dict[str, Any] | None = None,
               backend=None) -> list[TrialResult]:
  """Runs ``jobs`` (``concurrency`` at a time); returns the final result of each, in order.

  Writes ``out_dir/trials.jsonl`` (every attempt, as it finishes) and ``out_dir/summary.json``
  (``summarize`` of the final results plus ``extra_summary``). ``on_result`` sees each final
  result (with its in-memory trajectory) on the worker thread that produced it. ``backend``
  (default: ``config.backend``): None runs attempts on this machine; a ``RayTrialBackend`` on its cluster (``prepare``d here,
  so an unreachable proxy fails before the first trial).
  """
  backend = backend if backend is not None else config.backend
  if backend is None:
    check_local_verifiers([j.task for j in jobs], config.sandbox)
  else:  # the workers' interpreters matter there, and the proxy must be reachable from them
    backend.prepare([proxy if j.proxy is None else j.proxy for j in jobs], config,
                    [j.task for j in jobs])
  os.makedirs(out_dir, exist_ok=True)
  trials_path = os.path.join(out_dir, "trials.jsonl")
  lock = threading.Lock()
  t0 = time.perf_counter()

  def write(res: TrialResult, final: bool):
    line = res.record()
    line["final"] = final
    try:
      with lock:
        with open(trials_path, "a") as f:
          f.write(json.dumps(line) + "\n")
    except OSError as e:  # e.g. disk full: the run goes on, the result is still returned
      log.error("could not append trial %s to %s: %s", res.trial_id, trials_path, e)

  def attempt_once(job: TrialJob, attempt: int, failed_nodes: list[str]) -> TrialResult:
    seed = None if job.seed is None else derive_seed(job.seed, attempt)
    job_proxy = proxy if job.proxy is None else job.proxy
    try:
      if backend is not None:
        return backend.run_attempt(job, job_proxy, config, job.out_dir or out_dir,
                                   attempt=attempt, seed=seed, avoid_nodes=failed_nodes)
      return run_trial(job.task, job.adapter, job_proxy, config, job.out_dir or out_dir,
                       group=job.group, attempt=attempt, seed=seed)
    except Exception as e:  # noqa: BLE001 -- run_trial should not raise; if it does, count it
      log.exception("trial of %s (%s) raised", job.task.id, job.adapter.name)
      return TrialResult(trial_id=f"{job.task.id.replace('/', '_')}.{uuid.uuid4().hex[:8]}",
                         task_id=job.task.id, harness=job.adapter.name, status=st.HARNESS_ERROR,
                         reward=0.0, group=job.group, attempt=attempt,
                         error=f"trial raised {type(e).__name__}: {e}")

  def one(job: TrialJob) -> TrialResult:
    attempt, failed_nodes = 0, []
    while True:
      res = attempt_once(job, attempt, failed_nodes)
      retry = res.infrastructure_failure and attempt < max_retries
      if res.infrastructure_failure and res.node:
        failed_nodes.append(res.node)
      if retry:
        log.warning("trial %s (%s, attempt %d) ended with %s, retrying: %s", res.trial_id,
                    res.harness, attempt, res.status, res.error[:300])
      write(res, final=not retry)
      if not retry:
        break
      attempt += 1
    if on_result is not None:
      on_result(res)
    return res

  try:
    with concurrent.futures.ThreadPoolExecutor(max(1, concurrency),
                                               thread_name_prefix="legorl-trial") as pool:
      results = list(pool.map(one, jobs))
  finally:
    if backend is not None:  # the tasks' copies on the cluster are not needed any more
      backend.release([j.task for j in jobs])
  summary = summarize(results)
  summary["wall_s"] = time.perf_counter() - t0
  summary.update(extra_summary or {})
  with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  return results
