"""One trial: a harness works on a task in a sandbox against a proxy session; hidden tests
grade it. Every trial ends with a status and a record, whatever fails along the way.

Status resolution (first match wins):
  sandbox could not be created / used          -> sandbox_error  (infrastructure)
  harness crashed or could not reach the proxy -> harness_error  (infrastructure)
  harness ran past its wall-clock limit        -> timeout        (policy)
  the conversation outgrew the context         -> overlong       (policy)
  otherwise the verifier's status              -> solved | failed | reward_hack | verifier_error
except that tampering the verifier detects (``reward_hack``) replaces every status but
sandbox_error: editing the tests is the policy's act, whatever the harness did afterwards, so
such a trial is scored 0 rather than set aside.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import traceback
import uuid
from typing import Any

from legorl_jax import errors
from legorl_jax.harnesses import base as hbase
from legorl_jax.rewards import status as st
from legorl_jax.rewards.verifier import verify
from legorl_jax.sandbox import SandboxConfig, create_sandbox
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.tasks.schema import Task

log = logging.getLogger(__name__)
_TAIL = 4000


@dataclasses.dataclass
class TrialResult:
  """What one trial produced. ``trajectory`` is the proxy session's recording, typed (not
  written to ``trials.jsonl``; its JSON goes to ``trajectory_path``); None when the harness
  never reached the proxy."""

  trial_id: str
  task_id: str
  harness: str
  status: str
  reward: float
  group: int = -1
  attempt: int = 0
  harness_status: str = ""
  exit_code: int | None = None
  turns: int = 0
  prompt_tokens: int = 0
  sampled_tokens: int = 0
  params_versions: list[int] = dataclasses.field(default_factory=list)
  durations: dict[str, float] = dataclasses.field(default_factory=dict)
  verifier: dict[str, Any] = dataclasses.field(default_factory=dict)
  error: str = ""
  # The Ray node id the trial ran on (``rollout.backend="ray"``); "" on the local thread pool.
  node: str = ""
  log_paths: dict[str, str] = dataclasses.field(default_factory=dict)
  trajectory_path: str = ""
  trajectory: Trajectory | None = dataclasses.field(default=None, repr=False)

  @property
  def infrastructure_failure(self) -> bool:
    return st.is_infrastructure(self.status)

  def record(self) -> dict[str, Any]:
    """The ``trials.jsonl`` line (everything but the in-memory trajectory)."""
    d = dataclasses.asdict(dataclasses.replace(self, trajectory=None))
    d.pop("trajectory")
    return d


@dataclasses.dataclass(frozen=True)
class TrialConfig:
  harness_timeout_s: float = 300.0
  max_turns: int = 8
  temperature: float | None = None
  sandbox: SandboxConfig = SandboxConfig()
  keep_trajectory_files: bool = True
  # Where ``run_trials`` runs the attempts: None, this process's thread pool; a
  # ``rollout.ray_backend.RayTrialBackend``, its Ray cluster. Carried here so every caller of
  # ``run_trials`` (the RL loop, evaluation, SFT collection) follows one config choice.
  backend: Any = dataclasses.field(default=None, compare=False, repr=False)


def _tail(path: str) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - _TAIL))
      return f.read().decode(errors="replace")
  except OSError:
    return ""


def new_trial_id(task: Task) -> str:
  return f"{task.id.replace('/', '_')}.{uuid.uuid4().hex[:8]}"


def run_trial(task: Task, adapter: hbase.HarnessAdapter, proxy, config: TrialConfig,
              out_dir: str, *, group: int = -1, attempt: int = 0,
              seed: int | None = None) -> TrialResult:
  """Runs one trial end to end and always returns a ``TrialResult`` (never raises for a bad
  task, harness or sandbox). ``proxy`` is a started ``ProxyServer`` with a Unix socket."""
  trial_id = new_trial_id(task)
  tdir = os.path.join(out_dir, trial_id)
  os.makedirs(tdir, exist_ok=True)
  res = TrialResult(trial_id=trial_id, task_id=task.id, harness=adapter.name,
                    status=st.SANDBOX_ERROR, reward=0.0, group=group, attempt=attempt)
  res.log_paths = {"stdout": os.path.join(tdir, "harness.stdout"),
                   "stderr": os.path.join(tdir, "harness.stderr")}
  t0 = time.perf_counter()
  handle = None
  try:
    handle = open_session(proxy, seed)
    execute_trial(res, task, adapter, config, tdir, proxy_socket=proxy.uds,
                  session_id=handle.session_id, token=handle.token)
  except Exception as e:  # noqa: BLE001 -- a trial never takes the run down
    res.status = st.SANDBOX_ERROR
    res.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
  finally:
    if handle is not None:
      close_session(res, proxy, handle.session_id, tdir, config.keep_trajectory_files)
    res.durations["total_s"] = time.perf_counter() - t0
  return res


def open_session(proxy, seed: int | None):
  """A new proxy session for one trial (where the proxy runs: token ids stay there)."""
  handle = proxy.create_session()
  if seed is not None:  # reproducible sampling (ProxyService.set_session_seed)
    proxy.service.set_session_seed(handle.session_id, seed)
  return handle


def close_session(res: TrialResult, proxy, session_id: str, tdir: str, keep_file: bool) -> None:
  """Pops the session and attaches its recording to ``res`` (never raises)."""
  try:
    _collect_trajectory(res, proxy, session_id, tdir, keep_file)
  except Exception as e:  # noqa: BLE001 -- e.g. disk full: the record still gets out
    log.warning("trial %s: keeping its trajectory failed: %s", res.trial_id, e)
    res.error += f"; trajectory not kept: {type(e).__name__}: {e}"


def execute_trial(res: TrialResult, task: Task, adapter: hbase.HarnessAdapter,
                  config: TrialConfig, tdir: str, *, proxy_socket: str | None, session_id: str,
                  token: str) -> None:
  """The part of a trial that runs where the sandbox is: create it, run the harness against
  the session at ``proxy_socket`` (a Unix socket that reaches the proxy), verify, destroy.
  Fills ``res`` (status, reward, exit code, durations, log paths under ``tdir``); never
  raises. Split from ``run_trial`` so a remote worker (``rollout.ray_worker``) runs exactly
  this while the session and its recording stay with the proxy."""
  res.log_paths = {"stdout": os.path.join(tdir, "harness.stdout"),
                   "stderr": os.path.join(tdir, "harness.stderr")}
  t0 = time.perf_counter()
  sandbox = None
  try:
    sb_cfg = dataclasses.replace(
        config.sandbox, proxy_socket=proxy_socket,
        ro_mounts=tuple(config.sandbox.ro_mounts) + tuple(adapter.ro_mounts()))
    # Some runtimes (Bun-compiled CLIs) commit more address space than a task's default
    # memory limit allows; the adapter names its floor.
    need_mb = int(getattr(adapter, "min_memory_mb", 0) or 0)
    if need_mb and (sb_cfg.memory_mb or task.limits.memory_mb) < need_mb:
      sb_cfg = dataclasses.replace(sb_cfg, memory_mb=need_mb)
    try:
      sandbox = create_sandbox(task, sb_cfg)
    except errors.LegorlError as e:
      res.status, res.error = st.SANDBOX_ERROR, f"sandbox creation failed: {e}"
      return
    res.durations["sandbox_s"] = time.perf_counter() - t0

    endpoint = hbase.Endpoint(root=f"{sandbox.proxy_url}/sess/{session_id}", token=token)
    spec = adapter.launch(task.instruction, endpoint, home=sandbox.home, workdir=sandbox.workdir,
                          max_turns=config.max_turns, temperature=config.temperature)
    sandbox.write_files(spec.files)
    t1 = time.perf_counter()
    r = sandbox.exec(spec.argv, timeout=config.harness_timeout_s, env=spec.env, cwd=spec.cwd,
                     stdout_path=res.log_paths["stdout"], stderr_path=res.log_paths["stderr"])
    res.durations["harness_s"] = time.perf_counter() - t1
    res.exit_code = r.exit_code
    res.harness_status = adapter.harness_status(
        r.exit_code, r.timed_out, _tail(res.log_paths["stdout"]), _tail(res.log_paths["stderr"]))
    for path in spec.log_files:  # copy harness logs out before the sandbox goes away
      try:
        data = sandbox.read_file(path)
        dest = os.path.join(tdir, os.path.basename(path))
        with open(dest, "wb") as f:
          f.write(data)
        res.log_paths[os.path.basename(path)] = dest
      except (errors.LegorlError, OSError):
        pass

    t2 = time.perf_counter()
    vres = verify(sandbox, task)
    res.durations["verify_s"] = time.perf_counter() - t2
    res.verifier = vres.to_dict()
    res.verifier.pop("output_tail", None)

    if vres.status == st.SANDBOX_ERROR:  # the sandbox broke (container gone, engine restarted)
      res.status, res.error = st.SANDBOX_ERROR, f"sandbox unusable after the harness: {vres.error}"
    elif res.harness_status == hbase.HARNESS_ERROR:
      res.status, res.error = st.HARNESS_ERROR, (
          f"harness exited with code {r.exit_code}: {_tail(res.log_paths['stderr'])[-500:]}")
    elif res.harness_status == hbase.HARNESS_TIMEOUT:
      res.status = st.TIMEOUT
    elif res.harness_status == hbase.HARNESS_OVERLONG:
      res.status = st.OVERLONG
    else:
      res.status = vres.status
    # A reward only counts for a graded, untampered trial.
    res.reward = float(vres.reward) if res.status in (st.SOLVED, st.FAILED) else 0.0
    if vres.status == st.REWARD_HACK:
      res.status, res.reward = st.REWARD_HACK, 0.0
  except errors.SandboxError as e:
    res.status, res.error = st.SANDBOX_ERROR, str(e)
  except Exception as e:  # noqa: BLE001 -- a trial never takes the run down
    res.status = st.HARNESS_ERROR if sandbox is not None else st.SANDBOX_ERROR
    res.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
  finally:
    if sandbox is not None:
      try:
        sandbox.destroy()
      except Exception as e:  # noqa: BLE001
        log.warning("sandbox %s destroy failed: %s", sandbox.id, e)
        res.error += f"; destroy failed: {e}"


def _collect_trajectory(res: TrialResult, proxy, session_id: str, tdir: str, keep_file: bool):
  session = proxy.sessions.pop(session_id)
  if session is None:
    return
  recording = session.trajectory()
  res.trajectory = Trajectory.from_json(recording, f"trial {res.trial_id}")
  _summarise(res)
  if keep_file:
    path = os.path.join(tdir, "trajectory.json")
    with open(path, "w") as f:
      json.dump(recording, f)
    res.trajectory_path = path


def _summarise(res: TrialResult):
  calls = res.trajectory.calls if res.trajectory else []
  res.turns = len(res.trajectory.main_calls) if res.trajectory else 0
  res.prompt_tokens = sum(len(c.prompt_ids) for c in calls)
  res.sampled_tokens = sum(len(c.token_ids) for c in calls)
  res.params_versions = sorted({int(c.params_version) for c in calls})
