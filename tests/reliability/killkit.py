"""Process-kill and disk-full kit: the learner, the checkpointer and the whole pipeline
(``python -m experiments.train``) killed or starved at chosen points, then resumed; each
scenario returns a ``faultkit.Outcome`` whose ``ok`` says whether the resumed run ended where an
uninterrupted one ends. Shared by the tests in this directory and
``experiments/benchmarks/faults.py``; the trial-level faults (harness, sandbox, verifier,
proxy) live in ``faultkit``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Callable, Sequence

from legorl_jax.rewards import status as st
from tests.reliability.faultkit import RUN_ENV, Outcome, _alive, _proc_bytes, leaks
from tests.xla_flags import subprocess_xla_flags

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
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_xla_flags())
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
  step) SIGKILLed during start-up, right at a save and at a random point after a later save,
  resumed each time.
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
  # Start-up; the instant "saved 2" is printed (inside step 2's async save, most often); and a
  # random moment up to 0.2 s after a later save (the next step or the save itself).
  points = [("startup", rng.uniform(0.5, 3.0)), ("after_save", 2, 0.0),
            ("after_save", rng.randint(3, total - 2), rng.uniform(0.0, 0.2))]
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


def _train_process(workdir: str, steps: int, env: dict, config: str | None = None,
                   extra: Sequence[str] = ()) -> subprocess.Popen:
  """``experiments.train`` with ``PIPELINE_OVERRIDES``; ``config``: another config file than
  demo_tiny's (e.g. ``demo_tiny_moe.py``), the same overrides on top; ``extra``: more
  ``--config.*`` flags after them."""
  overrides = PIPELINE_OVERRIDES if config is None else (f"--config={config}",
                                                         *PIPELINE_OVERRIDES[1:])
  argv = [sys.executable, "-m", "experiments.train", f"--workdir={workdir}",
          *overrides, *extra, f"--config.trainer.steps={steps}"]
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
                  timeout_s: float = 600.0, config: str | None = None,
                  xla_default: bool = True, extra: Sequence[str] = ()) -> Outcome:
  """``python -m experiments.train`` run uninterrupted, and run again SIGKILLed (its whole
  process group) once the checkpoint of step ``kill_after`` is committed and the trials of
  step ``kill_after + 1`` are running (the first of them has finished), then rerun with the
  same workdir to the end. ``config``: the config file both runs start from (default
  demo_tiny's; ``experiments/configs/demo_tiny_moe.py`` for a mixture-of-experts policy).
  ``xla_default``: the runs compile at XLA's default level, as real runs do (and
  cheaper here: ``tests/xla_flags.py``); False: at the session's test flags. ``extra``: more
  ``--config.*`` flags for every run (e.g. an SFT phase before RL).

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
  env = dict(os.environ, PYTHONPATH=_repo_root(), JAX_PLATFORMS="cpu", TMPDIR=tmp,
             XLA_FLAGS=subprocess_xla_flags(xla_default=xla_default), **{RUN_ENV: marker})
  base_dir = os.path.join(tmp, "legorl_sandboxes")
  why, left, procs = [], [], []

  def run_to_end(workdir):
    p = _train_process(workdir, steps, env, config, extra)
    procs.append(p)
    out, _ = p.communicate(timeout=timeout_s)
    if p.returncode != 0:
      why.append(f"{workdir}: exit {p.returncode}: {out[-1500:]}")
    return out

  run_to_end(j("full"))
  cut_dir = j("killed", "rollouts", f"step_{kill_after + 1:05d}")
  committed = j("killed", "checkpoints", str(kill_after), "commit_success.txt")
  proc = _train_process(j("killed"), steps, env, config, extra)
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
