"""The difficulty filter: RL draws prefer tasks whose recent pass rate is strictly between 0 and 1.

A GRPO group whose samples all score alike carries no learning signal, so a task the policy
always or never solves is wasted rollout time. The filter remembers, per task key, the solve
rates of its last ``window`` groups; a drawn task whose remembered rate is exactly 0 or 1 is
passed over, at most ``max_skips`` times in a row (then it is drawn again, so a task the policy
has learned to solve, or has improved on, gets probed again rather than forgotten).

The key of a synthetic task is its bug (``synthetic.bug_key``: the same under every renamed
variant, so what the policy showed on one variant informs the next); any other task is keyed by
its id. The state is plain JSON and is checkpointed with the run, so a resumed run filters
exactly as an uninterrupted one.
"""

from __future__ import annotations

from typing import Sequence

from legorl_jax.taskgen.synthetic.generator import bug_key


def task_key(task) -> str:
  extra = getattr(getattr(task, "metadata", None), "extra", None) or {}
  if getattr(task.metadata, "source", "") == "synthetic" and "bug_line" in extra:
    return bug_key(task)
  return task.id


class DifficultyFilter:
  """Host-side memory of recent pass rates, by task key."""

  def __init__(self, window: int = 2, max_skips: int = 2):
    self.window, self.max_skips = max(1, int(window)), max(0, int(max_skips))
    self.rates: dict[str, list[float]] = {}
    self.skips: dict[str, int] = {}

  def verdict(self, task) -> str:
    """"keep", or why to pass it over: "always_solved" / "never_solved"."""
    key = task_key(task)
    rates = self.rates.get(key)
    if not rates or self.skips.get(key, 0) >= self.max_skips:
      return "keep"
    mean = sum(rates) / len(rates)
    if 0.0 < mean < 1.0:
      return "keep"
    return "always_solved" if mean >= 1.0 else "never_solved"

  def passed_over(self, task) -> None:
    key = task_key(task)
    self.skips[key] = self.skips.get(key, 0) + 1

  def record(self, task, outcomes: Sequence[int]) -> None:
    """One group of ``task`` ended with ``outcomes`` (1 solved / 0 not, policy outcomes only)."""
    if not outcomes:
      return
    key = task_key(task)
    self.rates[key] = (self.rates.get(key, []) + [sum(outcomes) / len(outcomes)])[-self.window:]
    self.skips.pop(key, None)

  def state_dict(self) -> dict:
    return {"rates": {k: list(v) for k, v in self.rates.items()}, "skips": dict(self.skips)}

  def load_state_dict(self, state: dict | None) -> None:
    state = state or {}
    self.rates = {k: [float(x) for x in v] for k, v in (state.get("rates") or {}).items()}
    self.skips = {k: int(v) for k, v in (state.get("skips") or {}).items()}
