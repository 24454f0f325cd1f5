"""Progress on the terminal: a long phase's banner, n/N and ETA; live rollout trial counts.

``PhaseProgress`` is for the demo's long phases (demonstrations, SFT steps, evaluation trials,
RL steps): a first-time user otherwise sees minutes of silence and cannot tell a slow phase
from a hung one. ``TrialProgress`` is the per-trial bar of rollouts (status, reward, tokens/s).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from tqdm import tqdm


def _clock_text(seconds: float) -> str:
  """``75`` -> ``1:15``, ``3725`` -> ``1:02:05``."""
  s = max(0, int(round(seconds)))
  h, rest = divmod(s, 3600)
  m, sec = divmod(rest, 60)
  return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class PhaseProgress:
  """A banner when a phase starts, then ``[name n/N pct | elapsed, ETA t] detail`` lines.

  The ETA extrapolates the rate of the items done since the first one: the first item of a
  phase carries its one-off costs (compiles, the SFT trunk cache's fill), which would otherwise
  inflate the estimate for the whole phase (SmolLM2 SFT: a 142 s first step against 3.8 s
  steps made the ETA after 11 steps 40 min instead of 9). Until a second item is done it uses the
  first's time (a resumed phase counts from ``done``). Lines are printed for every ``every``-th item and the last. Safe to
  call from worker threads. ``emit`` and ``clock`` are injectable for tests.
  """

  def __init__(self, name: str, total: int, *, unit: str = "steps", done: int = 0,
               every: int = 1, emit: Callable[[str], None] | None = None,
               clock: Callable[[], float] = time.perf_counter):
    self.name, self.total, self.unit = name, int(total), unit
    self.every = max(1, int(every))
    self._emit = emit or (lambda line: print(line, flush=True))
    self._clock = clock
    self._lock = threading.Lock()
    self._t0, self._n0, self.done = clock(), int(done), int(done)
    self._mark: tuple[float, int] | None = None  # (clock, done) when the first item was counted
    resumed = f", resuming at {self.done}" if self.done else ""
    self._emit(f"== {name}: {self.total} {unit}{resumed} ==")

  def status(self) -> str:
    """``name n/N pct | elapsed, ETA t`` for the items done so far."""
    now = self._clock()
    elapsed = now - self._t0
    pct = 100.0 * self.done / self.total if self.total else 100.0
    out = f"{self.name} {self.done}/{self.total} {pct:3.0f}% | {_clock_text(elapsed)}"
    if self.done > self._n0 and self.done < self.total:
      t, n = (self._t0, self._n0) if self._mark is None or self.done <= self._mark[1] else self._mark
      eta = (now - t) / (self.done - n) * (self.total - self.done)
      out += f", ETA {_clock_text(eta)}"
    return out

  def step(self, detail: str = "", *, done: int | None = None, force: bool = False) -> str | None:
    """Counts one item (or sets the count to ``done``); prints and returns the line when due."""
    with self._lock:
      self.done = self.done + 1 if done is None else int(done)
      if self._mark is None and self.done > self._n0:
        self._mark = (self._clock(), self.done)
      if not (force or self.done % self.every == 0 or self.done >= self.total):
        return None
      line = f"[{self.status()}]" + (f" {detail}" if detail else "")
      self._emit(line)
      return line

  def finish(self, detail: str = "", *, done: int | None = None) -> str:
    """The closing line: what was done (``done``, when counted elsewhere) and how long it took."""
    if done is not None:
      self.done = int(done)
    line = (f"== {self.name} done: {self.done}/{self.total} {self.unit} in "
            f"{_clock_text(self._clock() - self._t0)}" + (f"; {detail}" if detail else "") + " ==")
    self._emit(line)
    return line


class TrialProgress:
  """A tqdm bar fed by ``update(trial_result)`` from worker threads."""

  def __init__(self, total: int, initial: int = 0, queue_depth: Callable[[], int] | None = None,
               desc: str = "trials"):
    self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=True)
    self._lock = threading.Lock()
    self._status = collections.Counter()
    self._reward = 0.0
    self._tokens = 0
    self._t0 = time.perf_counter()
    self._queue_depth = queue_depth

  def update(self, result) -> None:
    with self._lock:
      self._status[result.status] += 1
      self._reward += float(result.reward)
      self._tokens += int(result.sampled_tokens)
      n = sum(self._status.values())
      post = {k: v for k, v in sorted(self._status.items())}
      post["reward"] = f"{self._reward / n:.3f}"
      post["tok/s"] = f"{self._tokens / max(time.perf_counter() - self._t0, 1e-9):.0f}"
      if self._queue_depth is not None:
        try:
          post["queue"] = self._queue_depth()
        except Exception:  # noqa: BLE001 -- progress must never break a run
          pass
      self._bar.set_postfix(post, refresh=False)
      self._bar.update(1)

  def close(self):
    self._bar.close()
