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
the run met the scenario's expectation (``ok``).
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
import sys
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


# -- proxy bodies ----------------------------------------------------------------------------
def raw_request(uds: str, data: bytes, read: bool = True, timeout: float = 10.0) -> int | None:
  """Sends raw bytes to the proxy's Unix socket; returns the HTTP status (None: no answer)."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.settimeout(timeout)
    s.connect(uds)
    s.sendall(data)
    if not read:
      return None
    head = b""
    try:
      while b"\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
          break
        head += chunk
    except (socket.timeout, ConnectionResetError):
      return None
  parts = head.split(b" ", 2)
  return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _post(path: str, body: bytes, *, length: int | None = None, ctype=b"application/json",
          token: str = "not-a-token") -> bytes:
  n = len(body) if length is None else length
  return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: " + ctype +
          b"\r\nAuthorization: Bearer " + token.encode() + b"\r\nContent-Length: " +
          str(n).encode() + b"\r\nConnection: close\r\n\r\n" + body)


def bad_bodies(max_body_bytes: int) -> dict[str, tuple[bytes, bool]]:
  """name -> (raw request, whether an answer is expected)."""
  chat = "/v1/chat/completions"
  return {
      "garbage": (_post(chat, os.urandom(4096)), True),
      "not_json": (_post(chat, b"{'model': policy, messages: ["), True),
      "json_array": (_post(chat, b"[1, 2, 3]"), True),
      "wrong_types": (_post(chat, b'{"model": 7, "messages": "hi", "max_tokens": "lots"}'), True),
      "deep_nesting": (_post(chat, b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}"), True),
      "bad_utf8": (_post(chat, b'{"model": "policy", "messages": [{"role": "user", "content": "\xff\xfe"}]}'), True),
      "responses_garbage": (_post("/v1/responses", b"\x00\x01\x02" * 1000), True),
      "messages_garbage": (_post("/v1/messages", b"}{" * 1000), True),
      "oversized": (_post(chat, b"x" * (max_body_bytes + 1024)), True),
      "oversized_claimed": (_post(chat, b"{}", length=max_body_bytes * 4), True),
      "truncated": (_post(chat, b'{"model": "policy", "mess', length=4096), False),
      "not_http": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(300), True),
  }


def proxy_bad_bodies(env: FaultEnv, backend="local") -> Outcome:
  """While a trial waits on the model, the proxy is sent garbage, truncated and oversized
  bodies: each gets a 4xx (or a dropped connection), the proxy stays healthy and the trial
  is solved."""
  answers: dict[str, int | None] = {}

  def hook():
    for name, (data, read) in bad_bodies(env.proxy.config.max_body_bytes).items():
      try:
        answers[name] = raw_request(env.proxy.uds, data, read=read)
      except (BrokenPipeError, ConnectionResetError):
        answers[name] = None
    answers["health"] = raw_request(env.proxy.uds, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n")

  env.policy.arm(hook)

  def check(o, results):
    bad = {k: v for k, v in answers.items()
           if k != "health" and v is not None and not 400 <= v < 500}
    if bad or answers.get("health") != 200:
      return f"proxy answers {answers}"
    return expect_attempts(SOLVED)(o, results)

  o = env.run("proxy_bad_bodies", BuiltinAdapter(), backend, check=check)
  o.detail = (o.detail + " " if o.detail else "") + json.dumps(answers)
  return o


def engine_raises(env: FaultEnv, engine, proxy, backend="local") -> Outcome:
  """The sampling engine's decode step raises during a request (a real ``Engine`` behind the
  proxy): that request fails with a 5xx, the harness retries, the trial ends with a policy
  outcome and the engine keeps serving."""
  original = engine._decode  # noqa: SLF001 -- the fault is injected into the engine itself
  failed0 = engine.stats().get("failed", 0)

  def failing(*args, **kwargs):
    engine._decode = original  # noqa: SLF001
    raise RuntimeError("injected decode failure")

  engine._decode = failing  # noqa: SLF001

  def check(o, results):
    r = results[0]
    failed = engine.stats().get("failed", 0) - failed0
    if failed < 1:
      return "the injected failure did not hit a request"
    if not r.trajectory or not r.trajectory.get("calls"):
      return "no model call was recorded after the failure"
    if st.is_infrastructure(r.status):
      return f"final status {r.status}"
    return ""

  try:
    return env.run("engine_raises", BuiltinAdapter(max_tokens=32), backend, proxy=proxy,
                   timeout_s=180.0, max_turns=3, check=check)
  finally:
    engine._decode = original  # noqa: SLF001


# -- checkpoints and the trainer -------------------------------------------------------------
def mount_small_disk(path: str) -> str | None:
  """Mounts a 2 MiB tmpfs at ``path`` (else a 3 MiB ext4 loop device); returns why not."""
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", path],
                     capture_output=True, text=True)
  if r.returncode == 0:
    return None
  img = path.rstrip("/") + ".img"
  for c in (["truncate", "-s", "3M", img], ["mkfs.ext4", "-q", "-F", img],
            ["mount", "-o", "loop", img, path]):
    r2 = subprocess.run(c, capture_output=True, text=True)
    if r2.returncode != 0:
      return f"tmpfs: {r.stderr.strip()}; loop device: {r2.stderr.strip()}"
  return None


def unmount(path: str) -> None:
  subprocess.run(["umount", "-l", path], check=False)


def _outcome(fault: str, why: list[str], leaked=(), wall=0.0, backend="-") -> Outcome:
  return Outcome(fault=fault, backend=backend, harness="-", attempts=[], final=[], lost=0,
                 leaked=list(leaked), ok=not why and not leaked, detail="; ".join(why),
                 wall_s=round(wall, 2))


def checkpoint_disk_full(disk: str, async_save: bool) -> Outcome:
  """On a mounted 2 MiB ``disk``: step 1 saves, step 2 (4 MiB, incompressible) fills the disk.
  Expect a CheckpointError naming the full disk, no partial save left, step 1 restoring
  exactly in a fresh reader, and the next save (step 3) succeeding."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from legorl_jax import errors
  from legorl_jax.trainer.checkpoint import Checkpointer

  t0 = time.perf_counter()
  ckdir = os.path.join(disk, f"ck-{'async' if async_save else 'sync'}")
  why = []
  ref = np.arange(1000, dtype=np.float32)
  ckpt = Checkpointer(ckdir, keep=3, async_save=async_save)
  ckpt.save(1, {"w": jnp.asarray(ref)}, host={"position": 1})
  ckpt.wait()
  try:
    ckpt.save(2, {"w": jax.random.normal(jax.random.PRNGKey(0), (1 << 20,))}, host={"position": 2})
    ckpt.wait()
    why.append("no error when the disk filled up")
  except errors.CheckpointError as e:
    if "disk is full" not in str(e) or "latest: 1" not in str(e):
      why.append(f"unclear error: {e}")
  left = [os.path.join(ckdir, n) for n in os.listdir(ckdir) if "tmp" in n]

  def restore():
    return Checkpointer(ckdir, async_save=False).restore({"w": jnp.zeros(1000)})

  state, host, step = restore()
  if (step, host) != (1, {"position": 1}) or not np.array_equal(np.asarray(state["w"]), ref):
    why.append(f"restored step {step} {host}, expected step 1 exactly")
  try:
    ckpt.save(3, {"w": jnp.asarray(ref * 3)}, host={"position": 3})
    ckpt.close()
    state, host, step = restore()
    if (step, host) != (3, {"position": 3}) or not np.array_equal(np.asarray(state["w"]), ref * 3):
      why.append(f"after freeing space: restored step {step} {host}, expected step 3")
  except errors.CheckpointError as e:
    why.append(f"the save after the failure failed too: {e}")
  return _outcome("checkpoint_disk_full", why, left, time.perf_counter() - t0,
                  backend="async" if async_save else "sync")


def _learner_worker(root: str, workdir: str, out: str, total: int):
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.Popen([sys.executable, "-m", "tests.trainer.resume_worker", workdir, str(total), out],
                          cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)


def _kill_at(proc, point) -> str:
  """Kills ``proc`` at ``point``: ("startup", seconds) or ("after_save", step, delay_s)."""
  lines = []
  if point[0] == "startup":
    time.sleep(point[1])
  else:
    for line in proc.stdout:
      lines.append(line)
      if line.startswith(f"saved {point[1]}"):
        time.sleep(point[2])  # lands in the next step or inside the async save
        break
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  return "".join(lines)


def trainer_kill(root_dir: str, seed: int = 1234, total: int = 6) -> Outcome:
  """The learner (``tests/trainer/resume_worker.py``: real train step, async orbax saves every
  step) SIGKILLed during start-up and at a random point after a save, resumed each time.
  After every kill the latest checkpoint restores; the finished run's parameters equal an
  uninterrupted run's bit for bit."""
  import random

  import numpy as np

  from legorl_jax.models import create_model
  from legorl_jax.models.params import split_model
  from legorl_jax.trainer import checkpoint, optimizer as opt_lib, state as state_lib
  from tests.trainer import test_train_step as helpers

  t0 = time.perf_counter()
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  rng = random.Random(seed)
  j = lambda *p: os.path.join(root_dir, *p)  # noqa: E731
  full = _learner_worker(repo, j("full"), j("full.npz"), total)
  points = [("startup", rng.uniform(0.5, 3.0)),
            ("after_save", rng.randint(2, total - 2), rng.uniform(0.0, 0.2))]
  cfg = helpers.make_cfg(micro=2)
  cfg.optim.learning_rate, cfg.optim.max_grad_norm = 3e-3, 1.0
  _, params = split_model(create_model(helpers.CFG, seed=0))
  target = state_lib.create_train_state(params, opt_lib.make_optimizer(cfg.optim), seed=1)
  why, last, workers = [], None, [full]
  for point in points:
    w = _learner_worker(repo, j("killed"), j("unused.npz"), total)
    workers.append(w)
    out = _kill_at(w, point)
    ck = checkpoint.Checkpointer(j("killed"), async_save=False)
    step = ck.latest_step()
    # "saved k" is printed when k's async save has started: k - 1 is surely on disk.
    if point[0] == "after_save" and (step is None or step < point[1] - 1):
      why.append(f"after kill at {point}: latest step {step} ({out[-200:]!r})")
    if step is not None:
      try:
        state, host, got = ck.restore(target)
        if not got == step == host["data_position"] == int(state.step):
          why.append(f"checkpoint {step} restored inconsistent: step {got}, host {host}")
        if last is not None and step < last:
          why.append(f"latest step went back from {last} to {step}")
        last = step
      except Exception as e:  # noqa: BLE001 -- an unreadable checkpoint is the failure
        why.append(f"checkpoint {step} unreadable after kill at {point}: {e}")
    ck.close()
  resumed = _learner_worker(repo, j("killed"), j("resumed.npz"), total)
  workers.append(resumed)
  out_resumed, _ = resumed.communicate(timeout=900)
  out_full, _ = full.communicate(timeout=900)
  if resumed.returncode != 0 or "resumed" not in out_resumed:
    why.append(f"resume failed: {out_resumed[-500:]}")
  elif full.returncode != 0:
    why.append(f"uninterrupted run failed: {out_full[-500:]}")
  else:
    a, b = np.load(j("full.npz")), np.load(j("resumed.npz"))
    diff = [k for k in a.files if k not in b.files or not np.array_equal(a[k], b[k])]
    if sorted(a.files) != sorted(b.files) or diff:
      why.append(f"resumed parameters differ from the uninterrupted run: {diff[:5]}")
  left = [f"worker {w.pid}" for w in workers if w.poll() is None]
  return _outcome("trainer_kill", why, left, time.perf_counter() - t0, backend="sync")
