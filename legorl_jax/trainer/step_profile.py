"""Where an RL step's time and CPU go: the rollout against the update, thread by thread.

Issue 29 asks what bounds an RL step on a small host: empty engine rows, prefill stalls, host-side
Python, or the trial processes taking the cores. ``StepProfile`` answers it for every step of a
real run, from three ``thread_cpu`` snapshots (step start, rollout done, update done) and the
engine's counters, and returns plain floats for ``metrics.jsonl``:

- ``cores_busy_rollout`` / ``cores_busy_update`` / ``cores_busy_step``: this process and its
  reaped children's CPU seconds over the wall seconds of each part (2.0 is a full 2-core host).
- ``rollout_cpu/<who>``: the rollout's CPU seconds by thread class (``legorl-sampler`` is the
  engine's device thread, ``legorl-trial`` the trial threads, ``legorl-proxy`` and the
  per-connection HTTP threads the proxy, XLA's pools by their OS names), ``children`` (the
  trials' sandbox, harness and verifier processes), ``exited_threads`` and ``other_processes``
  (the rest of the machine).
- ``engine_busy_frac``: the share of the rollout's wall the engine's device thread spent in
  prefill or decode calls (``engine_prefill_s``, ``engine_decode_s``); the rest it waited for
  requests. ``engine_live_row_frac``: of the row-steps its decode calls ran, those that held a
  request. ``engine_prefill_calls`` / ``engine_decode_calls``: device calls of each kind;
  ``engine_shared_prefix_frac``: the decode calls that used shared-prompt attention;
  ``engine_compiled``: shapes the engine's steps compiled during the rollout (first uses).

Host-side only (reads ``/proc`` and counters); nothing here touches a device.
"""

from __future__ import annotations

from typing import Callable

from legorl_jax.utils import thread_cpu

_ENGINE_KEYS = ("prefill_s", "decode_s", "decode_row_steps", "live_row_steps", "decoded_tokens",
                "prefill_tokens", "prefill_calls", "decode_calls", "shared_prefix_calls",
                "compiled")


class StepProfile:
  """``start()`` before the rollout, ``rollout_done()`` after it, ``update_done()`` after the
  update (returns the step's metrics); checkpoints and mid-run evaluations fall between
  ``update_done()`` and the next ``start()``, outside every figure. ``engine_stats`` is the engine's ``stats`` method (a
  callable returning a dict; missing keys read 0). In async mode the rollout of the next step
  overlaps this one's update, so only the ``*_step`` figures describe the step."""

  def __init__(self, engine_stats: Callable[[], dict]):
    self._engine_stats = engine_stats
    self._a = self._b = None
    self._ea = self._eb = None

  def _engine(self) -> dict:
    try:
      s = self._engine_stats()
    except Exception:  # noqa: BLE001 -- a profile must never fail a step
      s = {}
    s = dict(s, compiled=sum((s.get("compilations") or {}).values()))
    return {k: float(s.get(k, 0.0)) for k in _ENGINE_KEYS}

  def start(self) -> None:
    self._a, self._ea = thread_cpu.CpuSnapshot.take(), self._engine()

  def rollout_done(self) -> None:
    self._b, self._eb = thread_cpu.CpuSnapshot.take(), self._engine()

  def update_done(self) -> dict[str, float]:
    if self._a is None or self._b is None:
      raise RuntimeError("StepProfile.update_done() before start() and rollout_done()")
    c = thread_cpu.CpuSnapshot.take()
    rollout = thread_cpu.breakdown(self._a, self._b)
    update = thread_cpu.breakdown(self._b, c)
    step = thread_cpu.breakdown(self._a, c)
    out = {"cores_busy_rollout": rollout["cores_busy"], "cores_busy_update": update["cores_busy"],
           "cores_busy_step": step["cores_busy"], "update_wall_s": update["wall_s"]}
    for k, v in rollout.items():
      if k not in ("wall_s", "cores_busy"):
        out[f"rollout_cpu/{k.removeprefix('thread/')}"] = v
    e = {k: self._eb[k] - self._ea[k] for k in _ENGINE_KEYS}
    out["engine_prefill_s"], out["engine_decode_s"] = e["prefill_s"], e["decode_s"]
    out["engine_busy_frac"] = (e["prefill_s"] + e["decode_s"]) / max(rollout["wall_s"], 1e-9)
    if e["decode_row_steps"]:
      out["engine_live_row_frac"] = e["live_row_steps"] / e["decode_row_steps"]
    if e["decode_s"]:
      out["engine_decode_tokens_per_s"] = e["decoded_tokens"] / e["decode_s"]
    out["engine_prefill_calls"], out["engine_decode_calls"] = e["prefill_calls"], e["decode_calls"]
    if e["decode_calls"]:
      out["engine_shared_prefix_frac"] = e["shared_prefix_calls"] / e["decode_calls"]
    out["engine_compiled"] = e["compiled"]
    self._a = self._b = None
    return out

  @staticmethod
  def summary(m: dict[str, float]) -> str:
    """One log line: cores busy per part, engine busy share and live rows, top CPU users."""
    who = thread_cpu.top({k.removeprefix("rollout_cpu/"): v for k, v in m.items()
                          if k.startswith("rollout_cpu/")}, n=5)
    return (f"cores busy rollout {m['cores_busy_rollout']:.2f} update {m['cores_busy_update']:.2f}"
            f" | engine busy {m['engine_busy_frac']:.0%}, live rows "
            f"{m.get('engine_live_row_frac', float('nan')):.0%} | rollout CPU-s: {who}")
