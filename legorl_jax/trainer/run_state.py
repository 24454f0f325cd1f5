"""Where a training run stands between phases: what a checkpoint carries besides the weights.

The pipeline moves through ``sft`` -> ``eval_before`` -> ``rl`` (-> the final evaluation,
which is not resumed: it runs again). ``RunState`` is saved with every checkpoint as plain JSON
(the same keys as the dict earlier versions wrote, so their checkpoints still resume) and read
back on restart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from legorl_jax import errors

# Where a run keeps its evaluation before RL, relative to its workdir: a resumed run reuses it,
# and a sweep arm that changes only the RL phase is seeded with another arm's (``sweep``).
BEFORE_RL_RESULT = ("eval", "before_rl", "result.json")

PHASES = ("sft", "eval_before", "rl")


@dataclasses.dataclass
class RunState:
  """``phase``: the phase to run next; ``rl_step``: RL steps done; ``loader``: the task
  loader's position after them (with the difficulty filter's memory, ``rl_loop.Collected``);
  ``before``: the before-RL evaluation (None until it ran); ``version``: the sampler's
  parameter version after the last update; ``phase_s``: wall seconds per phase summed over
  every process of the run, up to its last checkpoint (a killed process's seconds after its
  last checkpoint are not in it), so a resumed run's ``summary.json`` can report the whole
  run's time (``wall_s_by_phase_all_runs``) and not only its own process's."""

  phase: str = "sft"
  rl_step: int = 0
  loader: dict = dataclasses.field(default_factory=dict)
  before: dict | None = None
  version: int = 0
  phase_s: dict = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "RunState":
    """The state a checkpoint saved; unknown keys (a newer version's) are refused by name."""
    names = {f.name for f in dataclasses.fields(cls)}
    extra = sorted(set(d) - names)
    if extra:
      raise errors.CheckpointError(
          f"the checkpoint's run state has keys {extra} this version does not know; resume it "
          "with the version of legorl_jax that wrote it.")
    state = cls(**{k: v for k, v in d.items() if k in names})
    if state.phase not in PHASES:
      raise errors.CheckpointError(f"the checkpoint's run state has phase {state.phase!r}; "
                                   f"expected one of {PHASES}.")
    state.rl_step, state.version = int(state.rl_step), int(state.version)
    state.phase_s = {str(k): float(v) for k, v in (state.phase_s or {}).items()}
    return state
