"""Live rollout progress on the terminal: trials done by status, reward, tokens/s, queue."""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from tqdm import tqdm


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
