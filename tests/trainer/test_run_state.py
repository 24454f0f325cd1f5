"""RunState: what a checkpoint carries besides the weights, as the same JSON keys earlier
versions wrote, and clear refusals of a state this version cannot resume."""

import json

import pytest

from legorl_jax import errors
from legorl_jax.trainer.run_state import RunState


def test_round_trip_and_the_old_dict_layout():
  s = RunState(phase="rl", rl_step=3, loader={"epoch": 0, "index": 24, "seed": 0, "size": 9},
               before={"solve_rate": 0.5}, version=3)
  s.phase_s.update(sft=12.5, rl=3.0)
  d = s.to_json()
  # The keys the pipeline's host dict had before RunState, plus the phase seconds.
  assert set(d) == {"phase", "rl_step", "loader", "before", "version", "phase_s"}
  assert RunState.from_json(json.loads(json.dumps(d))) == s
  # A checkpoint written before ``phase_s`` existed resumes, with no seconds carried over.
  old = {"phase": "eval_before", "rl_step": 0, "loader": {}, "before": None, "version": 0}
  assert RunState.from_json(old).phase == "eval_before"
  assert RunState.from_json(old).phase_s == {}


def test_unknown_keys_and_phases_are_refused_by_name():
  with pytest.raises(errors.CheckpointError, match="surprise"):
    RunState.from_json({"phase": "rl", "surprise": 1})
  with pytest.raises(errors.CheckpointError, match="'warmup'"):
    RunState.from_json({"phase": "warmup"})
