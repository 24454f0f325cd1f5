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
  original = engine._device.decode_step  # noqa: SLF001 -- the fault is injected into the engine itself
  failed0 = engine.stats().get("failed", 0)

  def failing(*args, **kwargs):
    engine._device.decode_step = original  # noqa: SLF001
    raise RuntimeError("injected decode failure")

  engine._device.decode_step = failing  # noqa: SLF001

  def check(o, results):
    r = results[0]
    failed = engine.stats().get("failed", 0) - failed0
    if failed < 1:
      return "the injected failure did not hit a request"
    if not r.trajectory or not r.trajectory.calls:
      return "no model call was recorded after the failure"
    if st.is_infrastructure(r.status):
      return f"final status {r.status}"
    return ""

  try:
    return env.run("engine_raises", BuiltinAdapter(max_tokens=32), backend, proxy=proxy,
                   timeout_s=180.0, max_turns=3, check=check)
  finally:
    engine._device.decode_step = original  # noqa: SLF001


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


def _learner_worker(root: str, workdir: str, out: str, total: int, trainable: str = "all"):
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.Popen([sys.executable, "-m", "tests.trainer.resume_worker", workdir, str(total), out,
                           trainable],
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


def trainer_kill(root_dir: str, seed: int = 1234, total: int = 6, trainable: str = "all") -> Outcome:
  """The learner (``tests/trainer/resume_worker.py``: real train step, async orbax saves every
  step) SIGKILLed during start-up and at a random point after a save, resumed each time.
  After every kill the latest checkpoint restores; the finished run's parameters equal an
  uninterrupted run's bit for bit. ``trainable``: ``trainer.trainable`` of the learner (its
  checkpoints hold the trainables only; the frozen base is rebuilt at every start)."""
  import random

  import numpy as np

  from legorl_jax.trainer import checkpoint
  from tests.trainer import resume_worker

  t0 = time.perf_counter()
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  rng = random.Random(seed)
  j = lambda *p: os.path.join(root_dir, *p)  # noqa: E731
  full = _learner_worker(repo, j("full"), j("full.npz"), total, trainable)
  points = [("startup", rng.uniform(0.5, 3.0)),
            ("after_save", rng.randint(2, total - 2), rng.uniform(0.0, 0.2))]
  target = resume_worker.initial(trainable)[3]
  why, last, workers = [], None, [full]
  for point in points:
    w = _learner_worker(repo, j("killed"), j("unused.npz"), total, trainable)
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
  resumed = _learner_worker(repo, j("killed"), j("resumed.npz"), total, trainable)
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


# -- the whole training pipeline SIGKILLed and resumed ----------------------------------------
# A tiny sync run of the demo configuration: random policy (no SFT), built-in harness in the
# local bwrap sandbox, 2 tasks x 4 samples per step, a checkpoint every step. Rewards are all
# 0 for a random policy, so the entropy bonus is what makes every update depend on the sampled
# tokens.
PIPELINE_OVERRIDES = (
    "--config=experiments/configs/demo_tiny.py", "--config.sft.steps=0",
    "--config.eval.before_after=False", "--config.eval.every=0",
    "--config.rollout.tasks_per_step=2", "--config.rollout.samples_per_task=4",
    "--config.checkpoint.every=1", "--config.loss.entropy_coef=0.01",
    "--config.tasks.num_train=16", "--config.tasks.num_val=2", "--config.harness.max_turns=2",
    "--config.sampling.max_tokens=32", "--config.trainer.rows_per_batch=8",
    "--config.trainer.micro_batches=1")
# Per-step metrics that depend only on what was sampled and learned (not on timing).
STEP_METRICS = ("solve_rate", "reward_mean", "trials", "trials_valid", "trials_in_loss",
                "mean_turns", "batch_sequences", "batch_tokens", "loss/policy", "entropy",
                "grad_norm", "param_norm", "params_version")


def _repo_root() -> str:
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train_process(workdir: str, steps: int, env: dict, config: str | None = None
                   ) -> subprocess.Popen:
  """``experiments.train`` with ``PIPELINE_OVERRIDES``; ``config``: another config file than
  demo_tiny's (e.g. ``demo_tiny_moe.py``), the same overrides on top."""
  overrides = PIPELINE_OVERRIDES if config is None else (f"--config={config}",
                                                         *PIPELINE_OVERRIDES[1:])
  argv = [sys.executable, "-m", "experiments.train", f"--workdir={workdir}",
          *overrides, f"--config.trainer.steps={steps}"]
  return subprocess.Popen(argv, cwd=_repo_root(), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)


def process_tree(pid: int) -> dict[int, bytes]:
  """{pid: start time} of ``pid`` and all its descendants (a pid reused later differs in
  start time)."""
  children: dict[int, list[int]] = {}
  start: dict[int, bytes] = {}
  for p in os.listdir("/proc"):
    if not p.isdigit():
      continue
    fields = _proc_bytes(p, "stat").rsplit(b")", 1)[-1].split()
    if len(fields) > 19:
      children.setdefault(int(fields[1]), []).append(int(p))
      start[int(p)] = fields[19]
  out, todo = {}, [pid]
  while todo:
    p = todo.pop()
    if p in start and p not in out:
      out[p] = start[p]
      todo += children.get(p, [])
  return out


def _cmdline(pid: int) -> str:
  return _proc_bytes(str(pid), "cmdline").replace(b"\0", b" ")[:120].decode(errors="replace")


def surviving(tree: dict[int, bytes], grace_s: float = 10.0) -> list[str]:
  """The processes of ``tree`` still alive (same pid and start time) after ``grace_s``."""
  deadline = time.monotonic() + grace_s
  while True:
    alive = [f"process {p}: {_cmdline(p)}" for p, t in tree.items()
             if _alive(p) and _proc_bytes(str(p), "stat").rsplit(b")", 1)[-1].split()[19:20] == [t]]
    if not alive or time.monotonic() > deadline:
      return alive
    time.sleep(0.25)


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


def _step_metrics(workdir: str) -> dict[int, dict]:
  """The last ``train`` metrics line of each step (a step cut after its line was written is
  written again by the resumed run)."""
  return {m["step"]: m for m in _read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if m.get("phase") == "train"}


def _final_arrays(workdir: str) -> dict:
  import jax
  import numpy as np
  import orbax.checkpoint as ocp

  ck = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(ck) if d.isdigit())
  tree = ocp.PyTreeCheckpointer().restore(os.path.join(ck, str(step), "state"))
  return {"step": step, **{jax.tree_util.keystr(k): np.asarray(v)
                           for k, v in jax.tree_util.tree_leaves_with_path(tree)}}


def _wait_for(proc, cond: Callable[[], bool], what: str, timeout_s: float, lines: list[str]):
  """Reads ``proc``'s output until ``cond()`` holds (checked every 50 ms)."""
  import selectors

  sel = selectors.DefaultSelector()
  sel.register(proc.stdout, selectors.EVENT_READ)
  deadline = time.monotonic() + timeout_s
  while not cond():
    if time.monotonic() > deadline or proc.poll() is not None:
      raise RuntimeError(f"gave up waiting for {what}; output: {''.join(lines)[-1500:]}")
    if sel.select(timeout=0.05):
      line = proc.stdout.readline()
      if line:
        lines.append(line)


def pipeline_kill(root_dir: str, steps: int = 3, kill_after: int = 1,
                  timeout_s: float = 600.0, config: str | None = None) -> Outcome:
  """``python -m experiments.train`` run uninterrupted, and run again SIGKILLed (its whole
  process group) once the checkpoint of step ``kill_after`` is committed and the trials of
  step ``kill_after + 1`` are running (the first of them has finished), then rerun with the
  same workdir to the end. ``config``: the config file both runs start from (default
  demo_tiny's; ``experiments/configs/demo_tiny_moe.py`` for a mixture-of-experts policy).

  Expected: the killed run's latest checkpoint is ``kill_after``; the resumed run's final
  parameters and optimizer state equal the uninterrupted run's bit for bit; so do the
  per-step ``STEP_METRICS`` and each step's trials (task, status, turns, sampled tokens); the
  resumed ``trials.jsonl`` holds every step's trials once (``phase=rl``) and every trial of
  the cut step, finished or not, once more with ``phase=rl_interrupted`` (unfinished ones as
  ``harness_error``); no process of the killed run survives it, and no sandbox dir or marked
  process is left after the resume.
  """
  t0 = time.perf_counter()
  j = lambda *p: os.path.join(root_dir, *p)  # noqa: E731
  tmp = j("tmp")  # the sandboxes' base dir is $TMPDIR/legorl_sandboxes
  os.makedirs(tmp, exist_ok=True)
  marker = uuid.uuid4().hex
  env = dict(os.environ, PYTHONPATH=_repo_root(), JAX_PLATFORMS="cpu", XLA_FLAGS="",
             TMPDIR=tmp, **{RUN_ENV: marker})
  base_dir = os.path.join(tmp, "legorl_sandboxes")
  why, left, procs = [], [], []

  def run_to_end(workdir):
    p = _train_process(workdir, steps, env, config)
    procs.append(p)
    out, _ = p.communicate(timeout=timeout_s)
    if p.returncode != 0:
      why.append(f"{workdir}: exit {p.returncode}: {out[-1500:]}")
    return out

  run_to_end(j("full"))
  cut_dir = j("killed", "rollouts", f"step_{kill_after + 1:05d}")
  committed = j("killed", "checkpoints", str(kill_after), "commit_success.txt")
  proc = _train_process(j("killed"), steps, env, config)
  procs.append(proc)
  lines: list[str] = []
  cut_trials: set[str] = set()
  try:
    _wait_for(proc, lambda: os.path.exists(committed), f"checkpoint {kill_after}", timeout_s, lines)
    _wait_for(proc, lambda: bool(_read_jsonl(os.path.join(cut_dir, "trials.jsonl"))),
              f"a finished trial of step {kill_after + 1}", timeout_s, lines)
    tree = process_tree(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    left += surviving(tree)
    cut_trials = {d for d in os.listdir(cut_dir) if os.path.isdir(os.path.join(cut_dir, d))}
    done = {r["trial_id"] for r in _read_jsonl(os.path.join(cut_dir, "trials.jsonl"))}
    latest = max(int(d) for d in os.listdir(j("killed", "checkpoints")) if d.isdigit())
    if latest != kill_after:
      why.append(f"killed run's latest checkpoint is {latest}, expected {kill_after}")
    print(f"killed during step {kill_after + 1}: {len(done)} of {len(cut_trials)} started "
          f"trials finished", flush=True)
  except RuntimeError as e:
    why.append(str(e))
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  out = run_to_end(j("killed"))
  if "Resumed" not in out:
    why.append(f"the rerun did not resume: {out[-800:]}")
  left += leaks(marker, base_dir, docker=False)
  left += [f"process {p.pid} (train)" for p in procs if p.poll() is None]
  if not why:
    why += _compare_runs(j("full"), j("killed"), steps, kill_after, cut_trials)
    why += _check_resumed_seconds(j("killed", "summary.json"))
  records = _read_jsonl(j("killed", "trials.jsonl"))
  recorded = {r["trial_id"] for r in records if r.get("phase") == "rl_interrupted"}
  return Outcome(fault="pipeline_kill", backend="local", harness="builtin",
                 attempts=[r["status"] for r in records],
                 final=[r["status"] for r in records if r.get("phase") == "rl"],
                 lost=len(cut_trials - recorded), leaked=left, ok=not why and not left,
                 detail="; ".join(why), wall_s=round(time.perf_counter() - t0, 2))


def _check_resumed_seconds(summary_path: str) -> list[str]:
  """The resumed run's summary (``PIPELINE_OVERRIDES`` run no SFT and no evaluation): the whole
  run's phase seconds carry the first process's setup and its RL steps up to the checkpoint it
  was killed after, on top of the resumed process's own."""
  with open(summary_path) as f:
    s = json.load(f)
  own, every = s["wall_s_by_phase"], s.get("wall_s_by_phase_all_runs", {})
  why = []
  for phase in ("setup", "rl"):
    if not every.get(phase, 0) > own.get(phase, 0) > 0:
      why.append(f"the whole run's {phase} seconds {every.get(phase)} do not include the first "
                 f"process's (this process: {own.get(phase)})")
  if abs(s.get("wall_s_all_runs", 0) - sum(every.values())) > 1e-6:
    why.append(f"wall_s_all_runs {s.get('wall_s_all_runs')} is not the sum of {every}")
  return why


def _trial_key(r: dict) -> tuple:
  return (r["group"], r["task_id"], r["status"], r["turns"], r["sampled_tokens"], r["reward"])


def _sampled_tokens(step_dir: str) -> list:
  """Sorted (group, sampled ids of each call) of a step's final trials, from the trajectories."""
  out = []
  for r in _read_jsonl(os.path.join(step_dir, "trials.jsonl")):
    if r["final"]:
      with open(os.path.join(step_dir, r["trial_id"], "trajectory.json")) as f:
        calls = json.load(f)["calls"]
      out.append((r["group"], [c["token_ids"] for c in calls]))
  return sorted(out)


def _compare_runs(full: str, resumed: str, steps: int, kill_after: int,
                  cut_trials: set[str]) -> list[str]:
  import numpy as np

  why = []
  a, b = _final_arrays(full), _final_arrays(resumed)
  if a["step"] != steps or b["step"] != steps:
    why.append(f"final checkpoints at steps {a['step']} / {b['step']}, expected {steps}")
  if sorted(a) != sorted(b):
    why.append("checkpoint trees differ")
  else:
    diff = {k: float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
            for k in a if k != "step" and not np.array_equal(a[k], b[k])}
    if diff:
      worst = sorted(diff.items(), key=lambda kv: -kv[1])[:3]
      why.append(f"{len(diff)} of {len(a) - 1} checkpoint arrays differ (largest: {worst})")
  ma, mb = _step_metrics(full), _step_metrics(resumed)
  for step in range(1, steps + 1):
    if step not in ma or step not in mb:
      run = "the uninterrupted" if step not in ma else "the resumed"
      why.append(f"step {step} has no metrics in {run} run")
      continue
    bad = {k: (ma[step].get(k), mb[step].get(k)) for k in STEP_METRICS
           if ma[step].get(k) != mb[step].get(k)}
    if bad:
      why.append(f"step {step} metrics differ (uninterrupted, resumed): {bad}")
  ra, rb = (_read_jsonl(os.path.join(w, "trials.jsonl")) for w in (full, resumed))
  for step in range(1, steps + 1):
    ka = sorted(_trial_key(r) for r in ra if r["step"] == step and r["phase"] == "rl")
    kb = sorted(_trial_key(r) for r in rb if r["step"] == step and r["phase"] == "rl")
    if ka != kb:
      why.append(f"step {step} trials differ: {ka} vs {kb}")
  for step in range(1, steps + 1):
    ta, tb = (_sampled_tokens(os.path.join(w, "rollouts", f"step_{step:05d}"))
              for w in (full, resumed))
    if ta != tb:
      why.append(f"step {step}: the trials sampled different tokens")
  cut = [r for r in rb if r["phase"] == "rl_interrupted"]
  if {r["trial_id"] for r in cut} != cut_trials or len(cut) != len(cut_trials):
    why.append(f"cut step's trials {sorted(cut_trials)} recorded as {[r['trial_id'] for r in cut]}")
  if any(r["step"] != kill_after + 1 or r["status"] not in st.ALL_STATUSES or not r["interrupted"]
         for r in cut):
    why.append(f"cut trials badly marked: {[(r['step'], r['status']) for r in cut]}")
  return why
