"""Fault injection kit: a scripted policy that strikes mid-trial, leak checks, one function per
fault scenario. Shared by the tests in this directory and ``experiments/benchmarks/faults.py``.

A scenario runs real trials (``run_trials`` -> sandbox -> harness -> relay -> proxy) and
injects its fault from the proxy: when the harness makes its ``at``-th model call, a hook runs
on a worker thread (SIGKILL the harness, restart dockerd, remove the container, ...) and the
reply is held back ``delay_s`` so the fault lands while the harness waits on the model. Every
sandbox process carries ``LEGORL_FAULT_RUN=<marker>`` in its environment, so a leaked process
is found by its environment whatever its parent or uid became.

Each scenario returns an ``Outcome``: the statuses of every attempt (from ``trials.jsonl``),
how many jobs have no final record (``lost``), what was left behind (``leaked``), and whether
the run met the scenario's expectation (``ok``). Kills of the learner, the checkpointer and the
whole pipeline are in ``killkit``; bad request bodies and a failing engine in ``proxykit``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import uuid
from typing import Callable, Sequence

from legorl_jax.harnesses.builtin import BuiltinAdapter
from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction, tool_call_text
from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sandbox import SandboxConfig

RUN_ENV = "LEGORL_FAULT_RUN"
LOG_CAP = 8 << 20  # the sandboxes' default max_output_bytes


# -- the striking policy ---------------------------------------------------------------------
class FaultPolicy:
  """``reply(request)`` for ``ScriptedBackend``: the scripted fix, optionally preceded by
  ``prepend`` replies (e.g. a shell command that allocates too much), with one fault hook."""

  def __init__(self, tasks):
    self._patches = patches_by_instruction(tasks)
    self._lock = threading.Lock()
    self.arm()

  def arm(self, hook: Callable[[], None] | None = None, *, at: int = 0, delay_s: float = 0.0,
          prepend: Sequence[str] = (), workdir_prefix: str = ""):
    with self._lock:
      self.hook, self.at, self.delay_s, self.prepend = hook, at, delay_s, list(prepend)
      self.scripted = ScriptedPolicy(self._patches, workdir_prefix=workdir_prefix)
      self.calls, self.fired, self.hook_error = 0, 0, None

  async def reply(self, request) -> str:
    with self._lock:
      n, self.calls = self.calls, self.calls + 1
      hook = self.hook if n == self.at else None
    if hook is not None:
      try:
        await asyncio.to_thread(hook)
      except Exception as e:  # noqa: BLE001 -- reported by the scenario
        self.hook_error = f"{type(e).__name__}: {e}"
      self.fired += 1
      if self.delay_s:
        await asyncio.sleep(self.delay_s)
    turns = sum(1 for m in request.messages if m.role == "assistant")
    if turns < len(self.prepend):
      return self.prepend[turns]
    steps = self.scripted.plan(request)
    return steps[min(turns - len(self.prepend), len(steps) - 1)]


# -- processes, containers, dirs -------------------------------------------------------------
def _proc_bytes(pid: str, name: str) -> bytes:
  try:
    with open(f"/proc/{pid}/{name}", "rb") as f:
      return f.read()
  except OSError:
    return b""


def marked_processes(marker: str, match: Callable[[list[str]], bool] | None = None
                     ) -> list[tuple[int, list[str]]]:
  """(pid, argv) of live processes whose environment carries this run's marker."""
  needle = f"{RUN_ENV}={marker}".encode()
  out = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    if needle not in _proc_bytes(pid, "environ").split(b"\0"):
      continue
    argv = [a.decode(errors="replace") for a in _proc_bytes(pid, "cmdline").split(b"\0") if a]
    if argv and (match is None or match(argv)):
      out.append((int(pid), argv))
  return out


def signal_harness(marker: str, match, sig=signal.SIGKILL, wait_s: float = 10.0) -> int:
  """Sends ``sig`` to the harness processes of this run (waits for them to appear)."""
  deadline = time.monotonic() + wait_s
  while True:
    procs = marked_processes(marker, match)
    if procs or time.monotonic() > deadline:
      break
    time.sleep(0.05)
  sent = 0
  for pid, _ in procs:
    try:
      os.kill(pid, sig)
      sent += 1
    except ProcessLookupError:
      pass
  if not sent:
    raise RuntimeError("no harness process to signal")
  return sent


def is_builtin(argv):
  """The agent's interpreter itself (not bwrap / prlimit, whose argv also names the script)."""
  return (len(argv) > 1 and os.path.basename(argv[0]).startswith("python")
          and argv[1].endswith("builtin_agent.py"))


def is_codex(argv):
  return argv[0].endswith("/codex") and "exec" in argv[1:3]


def docker_client():
  try:
    import docker
    c = docker.from_env(timeout=60)
    c.ping()
    return c
  except Exception:  # noqa: BLE001 -- any failure means "no engine"
    return None


def owner_label() -> str:
  return f"{socket.gethostname()}:{os.getpid()}"


def own_containers(client) -> list:
  return client.containers.list(all=True, filters={"label": f"legorl.owner={owner_label()}"})


def leaks(marker: str, base_dir: str, docker: bool, grace_s: float = 10.0) -> list[str]:
  """What this run left behind: processes, sandbox dirs, containers (after a short grace)."""
  deadline = time.monotonic() + grace_s
  while True:
    out = [f"process {pid}: {' '.join(argv)[:120]}" for pid, argv in marked_processes(marker)]
    if os.path.isdir(base_dir):
      out += [f"sandbox dir {os.path.join(base_dir, d)}" for d in os.listdir(base_dir)]
    client = docker_client() if docker else None
    if client is not None:
      out += [f"container {c.name} ({c.status})" for c in own_containers(client)]
    if not out or time.monotonic() > deadline:
      return out
    time.sleep(0.25)


# -- dockerd ---------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
  stat = _proc_bytes(str(pid), "stat")
  return bool(stat) and stat.rsplit(b")", 1)[-1].split()[:1] != [b"Z"]


def _dockerd_pid() -> int | None:
  for pid in os.listdir("/proc"):
    if pid.isdigit() and _proc_bytes(pid, "comm").strip() == b"dockerd" and _alive(int(pid)):
      return int(pid)
  return None


def docker_ok() -> bool:
  return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0


def restart_dockerd(timeout_s: float = 90.0) -> float:
  """Stops dockerd (SIGTERM, as a service manager would) and starts it again with the same
  command line, detached the way ``.ci/setup_system.sh`` starts it; returns the downtime."""
  pid = _dockerd_pid()
  argv = ["dockerd", "--storage-driver=overlay2"]
  t0 = time.monotonic()
  if pid is not None:
    argv = [a.decode() for a in _proc_bytes(str(pid), "cmdline").split(b"\0") if a] or argv
    os.kill(pid, signal.SIGTERM)
    while _alive(pid):
      if time.monotonic() - t0 > timeout_s:
        os.kill(pid, signal.SIGKILL)
      time.sleep(0.1)
  return start_dockerd(argv, timeout_s) - t0


def start_dockerd(argv=("dockerd", "--storage-driver=overlay2"), timeout_s: float = 90.0) -> float:
  """Starts dockerd detached (not our child) unless it answers; returns when it is up."""
  if not docker_ok():
    if _dockerd_pid() is None:
      cmd = " ".join(shlex.quote(a) for a in argv)
      # Its own session: it must outlive this process group (a test runner killing its jobs'
      # groups would otherwise take the engine down with it for every later Docker test).
      subprocess.run(["/bin/sh", "-c", f"setsid nohup {cmd} >>/var/log/dockerd.log 2>&1 </dev/null &"],
                     check=True)
    deadline = time.monotonic() + timeout_s
    while not docker_ok():
      if time.monotonic() > deadline:
        raise RuntimeError("dockerd did not come back; see /var/log/dockerd.log")
      time.sleep(0.5)
  return time.monotonic()


# -- running a scenario ----------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
  fault: str
  backend: str
  harness: str
  attempts: list[str]       # statuses of every attempt, in trials.jsonl order
  final: list[str]          # the counted status of each job
  lost: int                 # jobs without a final record in trials.jsonl
  leaked: list[str]
  ok: bool
  detail: str = ""
  wall_s: float = 0.0

  def row(self) -> dict:
    return dataclasses.asdict(self)


class FaultEnv:
  """A proxy serving ``FaultPolicy`` over ``tasks`` and a scratch root for runs."""

  def __init__(self, tasks, proxy, policy: FaultPolicy, root: str):
    self.tasks, self.proxy, self.policy, self.root = tasks, proxy, policy, root
    self._n = 0

  def run(self, fault: str, adapter, backend: str, *, tasks=None, timeout_s: float = 60.0,
          max_retries: int = 1, max_turns: int = 8, proxy=None, check: Callable[[Outcome, list], str] | None = None,
          **sandbox) -> Outcome:
    """Runs one trial per task (default: the first task) and checks accounting and leaks.
    ``check(outcome, results)`` returns "" when the scenario's expectation holds, else why."""
    self._n += 1
    name = f"{self._n:02d}-{fault}-{backend}"
    out_dir = os.path.join(self.root, name)
    base_dir = os.path.join(self.root, "sandboxes", name)
    marker = uuid.uuid4().hex
    tasks = list(tasks or self.tasks[:1])
    cfg = TrialConfig(harness_timeout_s=timeout_s, max_turns=max_turns,
                      sandbox=SandboxConfig(backend=backend, base_dir=base_dir,
                                            env={RUN_ENV: marker}, **sandbox))
    t0 = time.perf_counter()
    self.current_marker = marker
    results = run_trials([TrialJob(t, adapter, group=i) for i, t in enumerate(tasks)],
                         proxy or self.proxy, cfg, out_dir, concurrency=len(tasks),
                         max_retries=max_retries)
    wall = time.perf_counter() - t0
    with open(os.path.join(out_dir, "trials.jsonl")) as f:
      lines = [json.loads(l) for l in f if l.strip()]
    finals = {l["trial_id"]: l for l in lines if l["final"]}
    lost = sum(1 for r in results if r.trial_id not in finals)
    bad = [l["status"] for l in lines if l["status"] not in st.ALL_STATUSES]
    left = leaks(marker, base_dir, docker=backend == "docker")
    o = Outcome(fault=fault, backend=backend, harness=adapter.name,
                attempts=[l["status"] for l in lines], final=[r.status for r in results],
                lost=lost + len(bad), leaked=left, ok=False, wall_s=round(wall, 2))
    why = []
    if o.lost:
      why.append(f"{o.lost} trial(s) unaccounted")
    if left:
      why.append(f"leaked: {left[:5]}")
    if self.policy.hook_error:
      why.append(f"fault hook failed: {self.policy.hook_error}")
    if check is not None:
      msg = check(o, results)
      if msg:
        why.append(msg)
    errs = "; ".join(f"{r.status}: {r.error[:300]}" for r in results if r.error)
    o.ok, o.detail = not why, "; ".join(why) + (f" | errors: {errs}" if errs and why else "")
    return o


def expect_attempts(*allowed: Sequence[str]):
  """A check: attempt k's status is one of ``allowed[k]`` and there are exactly that many."""
  def check(o, results):
    if len(o.attempts) != len(allowed) or any(a not in ok for a, ok in zip(o.attempts, allowed)):
      return f"attempts {o.attempts}, expected {[sorted(a) for a in allowed]}"
    return ""
  return check


INFRA = st.INFRASTRUCTURE_STATUSES
SOLVED = {st.SOLVED}


# -- the scenarios ---------------------------------------------------------------------------
def harness_sigkill(env: FaultEnv, backend="local", adapter=None, match=is_builtin,
                    workdir_prefix="", timeout_s=120.0) -> Outcome:
  """SIGKILL the harness while it waits for the model: harness_error, retried, solved."""
  adapter = adapter or BuiltinAdapter()
  marker = lambda: env.current_marker  # noqa: E731
  env.policy.arm(lambda: signal_harness(marker(), match), delay_s=1.0,
                 workdir_prefix=workdir_prefix)
  return env.run("harness_sigkill", adapter, backend, timeout_s=timeout_s,
                 check=expect_attempts(INFRA, SOLVED))


def harness_hang(env: FaultEnv, backend="local") -> Outcome:
  """SIGSTOP the harness: it runs past its limit, is killed, and the trial is a timeout."""
  env.policy.arm(lambda: signal_harness(env.current_marker, is_builtin, signal.SIGSTOP))
  return env.run("harness_hang", BuiltinAdapter(), backend, timeout_s=6.0,
                 check=expect_attempts({st.TIMEOUT}))


class FloodingAdapter(BuiltinAdapter):
  """The built-in agent, after its launcher floods stdout and stderr."""

  name = "builtin-flood"

  def __init__(self, stdout_mb: int = 64, stderr_mb: int = 16):
    super().__init__()
    self.stdout_mb, self.stderr_mb = stdout_mb, stderr_mb

  def launch(self, *args, **kwargs):
    spec = super().launch(*args, **kwargs)
    flood = (f"head -c {self.stdout_mb << 20} /dev/zero | tr '\\0' o; "
             f"head -c {self.stderr_mb << 20} /dev/zero | tr '\\0' e >&2; exec \"$@\"")
    spec.argv = ["/bin/sh", "-c", flood, "flood", *spec.argv]
    return spec


def harness_flood(env: FaultEnv, backend="local") -> Outcome:
  """A harness writing 80 MiB of output: the trial goes on, its logs stay capped."""
  env.policy.arm()

  def check(o, results):
    r = results[0]
    sizes = {k: os.path.getsize(r.log_paths[k]) for k in ("stdout", "stderr")}
    if any(s > LOG_CAP + (128 << 10) for s in sizes.values()):
      return f"logs not capped: {sizes}"
    with open(r.log_paths["stdout"], "rb") as f:
      f.seek(LOG_CAP)
      if b"bytes of output dropped" not in f.read(256):
        return "no dropped-output note in the stdout log"
    return expect_attempts(SOLVED)(o, results)

  return env.run("harness_flood", FloodingAdapter(), backend, check=check)


def sandbox_oom(env: FaultEnv, backend="local") -> Outcome:
  """The agent runs a command allocating 2 GiB in a 512 MiB sandbox: the command dies, the
  agent goes on and solves the task."""
  alloc = tool_call_text("bash", {"command": "python3 -c \"b = b'x' * (2 << 30); print(len(b))\""})
  env.policy.arm(prepend=[alloc])
  return env.run("sandbox_oom", BuiltinAdapter(), backend, memory_mb=512,
                 check=expect_attempts(SOLVED))


def sandbox_tiny_memory(env: FaultEnv, backend="local") -> Outcome:
  """A 4 MiB memory limit: the harness cannot start; every attempt is an infrastructure
  failure (never a hang that would be scored as the policy's timeout)."""
  env.policy.arm()
  return env.run("sandbox_tiny_memory", BuiltinAdapter(), backend, memory_mb=4, timeout_s=30.0,
                 check=expect_attempts(INFRA, INFRA))


def docker_restart(env: FaultEnv) -> Outcome:
  """dockerd restarted while the harness waits for the model: the attempt fails as
  infrastructure, the retry (after the engine is back) solves the task."""
  env.policy.arm(restart_dockerd, delay_s=0.5)
  try:
    return env.run("docker_restart", BuiltinAdapter(), "docker",
                   check=expect_attempts(INFRA, SOLVED))
  finally:
    start_dockerd()


def container_removed(env: FaultEnv) -> Outcome:
  """The trial's container is force-removed from outside mid-trial: sandbox_error (not the
  harness's fault), retried in a new container, solved."""
  def remove():
    client = docker_client()
    gone = [c.remove(force=True, v=True) for c in own_containers(client) if c.status == "running"]
    if not gone:
      raise RuntimeError("no running container to remove")

  env.policy.arm(remove, delay_s=0.5)
  return env.run("container_removed", BuiltinAdapter(), "docker",
                 check=expect_attempts({st.SANDBOX_ERROR}, SOLVED))


def _with_hidden_prelude(task, prelude: str, verifier_timeout_s: float | None = None):
  hidden = {path: prelude + body for path, body in task.hidden_tests.items()}
  verifier = task.verifier
  if verifier_timeout_s is not None:
    verifier = dataclasses.replace(verifier, timeout_s=verifier_timeout_s)
  return dataclasses.replace(task, hidden_tests=hidden, verifier=verifier)


def verifier_crash(env: FaultEnv, backend="local") -> Outcome:
  """The test runner is SIGKILLed while importing the hidden tests: verifier_error, retried."""
  env.policy.arm()
  task = _with_hidden_prelude(env.tasks[0], "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
  return env.run("verifier_crash", BuiltinAdapter(), backend, tasks=[task],
                 check=expect_attempts({st.VERIFIER_ERROR}, {st.VERIFIER_ERROR}))


def verifier_hang(env: FaultEnv, backend="local") -> Outcome:
  """The hidden tests hang (ignoring SIGTERM) past the verifier's 3 s limit: the verifier is
  killed and the trial is graded failed with the timeout named in its record."""
  env.policy.arm()
  task = _with_hidden_prelude(
      env.tasks[0], "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
      "time.sleep(3600)\n", verifier_timeout_s=3.0)

  def check(o, results):
    r = results[0]
    if "timed out" not in r.verifier.get("error", "") or not r.verifier.get("timed_out"):
      return f"verifier record does not name the timeout: {r.verifier}"
    return expect_attempts({st.FAILED})(o, results)

  return env.run("verifier_hang", BuiltinAdapter(), backend, tasks=[task], check=check)
