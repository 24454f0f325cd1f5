"""Demonstration replay: a few SFT demonstrations mixed into every RL step, against forgetting.

With ``loss.demo_replay_weight`` w > 0, each RL step adds ``loss.demo_replay_seqs`` sequences of
the run's SFT demonstrations to its update rows; the train step gives their tokens
``w * token-mean NLL`` (``rl.losses.demo_replay_nll``) instead of a policy-gradient term. RL on
bugs without demonstrations otherwise pulls the policy away from what SFT taught on the others
(issue 44: lr 3e-4 lost 13 points on ``names_demo``).

The demonstrations are the ones SFT trained on: ``sft.demos`` when set, else the run's own
``WORKDIR/sft_demos/demos.jsonl``. Which ones a step replays is a function of (seed, step), so a
resumed run replays what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.trainer import batching


class DemoReplay:
  """Draws each step's replayed demonstration sequences (``TrainSequence.demo`` set)."""

  def __init__(self, demos: Sequence[Trajectory], count: int, seed: int = 0):
    if count < 1:
      raise errors.ConfigError(f"config loss.demo_replay_seqs={count} must be >= 1 when "
                               "loss.demo_replay_weight > 0.")
    self.seqs = [dataclasses.replace(s, demo=True, advantage=0.0)
                 for d in demos for s in batching.sequences_from_trajectory(d, 0.0)]
    if not self.seqs:
      raise errors.ConfigError("loss.demo_replay_weight > 0 but the demonstrations hold no "
                               "trained segment; point sft.demos at a demos.jsonl, or set the "
                               "weight to 0.")
    self.count, self.seed = int(count), int(seed)

  def draw(self, step: int) -> list[batching.TrainSequence]:
    """``count`` distinct sequences (all of them when there are fewer) for RL step ``step``."""
    rng = np.random.default_rng([self.seed, int(step), 0x5EED])
    k = min(self.count, len(self.seqs))
    return [self.seqs[i] for i in sorted(rng.choice(len(self.seqs), size=k, replace=False))]


def demos_path(cfg, demos_dir: str) -> str:
  """Where the run's demonstrations are: ``sft.demos``, else the SFT phase's own file in
  ``demos_dir`` (the run's ``sft_demos`` directory)."""
  return cfg.sft.get("demos", "") or os.path.join(demos_dir, "demos.jsonl")


def from_config(cfg, demos_dir: str) -> DemoReplay | None:
  """The run's ``DemoReplay``, or None when ``loss.demo_replay_weight`` is 0."""
  weight = float(cfg.loss.get("demo_replay_weight", 0.0) or 0.0)
  if weight < 0:
    raise errors.ConfigError(f"config loss.demo_replay_weight={weight} must be >= 0 (0: off).")
  if weight == 0:
    return None
  path = demos_path(cfg, demos_dir)
  if not os.path.exists(path):
    raise errors.ConfigError(
        f"config loss.demo_replay_weight={weight} replays SFT demonstrations, but {path} does not "
        "exist (this run did no SFT here); set sft.demos to a demos.jsonl (e.g. the SFT run's "
        "WORKDIR/sft_demos/demos.jsonl) or set loss.demo_replay_weight=0.")
  from legorl_jax.trainer import sft  # pylint: disable=import-outside-toplevel
  return DemoReplay(sft.load_demonstrations(path), int(cfg.loss.get("demo_replay_seqs", 4)),
                    seed=int(cfg.seed))
