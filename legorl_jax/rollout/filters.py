"""From finished trials to what the learner may use: group masks, overlong policy, rewards.

Infrastructure failures (harness, sandbox or verifier errors) say nothing about the policy:
their trials never enter the loss, and by default their whole group is masked so the group
baseline is not computed from a biased subset. Over-long trials are kept (reward 0), dropped,
or shaped with the DAPO overlong penalty, by config; with a sampled-token limit and a buffer,
the penalty's linear part also reaches finished trials that came near the limit, as in DAPO.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.rewards import status as st

OVERLONG_MODES = ("keep", "drop", "penalty")


@dataclasses.dataclass
class GroupedTrials:
  """Trials arranged ``[G, n]`` (tasks x samples) with the learner's view of each.

  ``rewards`` f32 [G, n]; ``valid`` bool [G, n] (False = must not enter the loss);
  ``trials[g][i]`` the TrialResult (None when missing).
  """

  trials: list[list]
  rewards: np.ndarray
  valid: np.ndarray
  dropped: collections.Counter


def group_trials(results: Sequence, n: int) -> list[list]:
  """Groups results by ``result.group`` (insertion order), each group padded to ``n`` with None."""
  groups: dict[int, list] = collections.OrderedDict()
  for r in results:
    groups.setdefault(r.group, []).append(r)
  out = []
  for g in groups.values():
    if len(g) > n:
      raise errors.RolloutError(f"group {g[0].group} holds {len(g)} trials, more than n={n}.")
    out.append(g + [None] * (n - len(g)))
  return out


def prepare_groups(results: Sequence, n: int, cfg, stale: frozenset = frozenset(),
                   sizes: dict | None = None) -> GroupedTrials:
  """Applies the filters. ``sizes``: {group id: the trials it was run with} where groups
  differ in size (``n`` is then the largest); a group's slots past its own size are padding,
  neither valid nor missing. ``cfg``: ``overlong`` in OVERLONG_MODES, ``overlong_penalty``,
  ``overlong_buffer`` (tokens before the limit where DAPO's linear penalty starts),
  ``max_sampled_tokens``, ``drop_zero_variance`` (bool), ``mask_broken_groups`` (bool).
  ``stale``: trial ids sampled with too old parameters (async mode); excluded like broken
  trials, but only they: staleness says nothing about their group's other samples."""
  mode = cfg.get("overlong", "keep")
  if mode not in OVERLONG_MODES:
    raise errors.ConfigError(f"rollout.overlong={mode!r} must be one of {OVERLONG_MODES}.")
  groups = group_trials(results, n)
  g_count = len(groups)
  rewards = np.zeros((g_count, n), np.float32)
  valid = np.zeros((g_count, n), bool)
  broken = np.zeros(g_count, bool)  # holds a trial that failed for infrastructure reasons
  dropped = collections.Counter()
  for gi, group in enumerate(groups):
    size = n
    if sizes:
      size = int(sizes.get(next(r.group for r in group if r is not None), n))
    for ti, r in enumerate(group):
      if r is None and ti >= size:
        continue  # padding of a smaller group
      if r is None:
        dropped["missing"] += 1
        broken[gi] = True
      elif st.is_infrastructure(r.status):
        dropped[r.status] += 1
        broken[gi] = True
      elif not (r.trajectory and r.trajectory.segments):
        dropped["no_segments"] += 1  # nothing recorded: no gradient, and no fair baseline
        broken[gi] = True
      elif r.trial_id in stale:
        dropped["stale"] += 1
      elif r.status == st.OVERLONG and mode == "drop":
        dropped["overlong"] += 1
      else:
        reward = float(r.reward)
        if mode == "penalty" and (r.status == st.OVERLONG or _soft_zone(cfg)):
          reward += _overlong_penalty(r.sampled_tokens, cfg)
        valid[gi, ti] = True
        rewards[gi, ti] = reward
  if cfg.get("mask_broken_groups", True):
    for gi in np.where(broken)[0]:
      dropped["group_masked"] += int(valid[gi].sum())
      valid[gi] = False
  if cfg.get("drop_zero_variance", False):
    for gi in range(g_count):
      v = valid[gi]
      if v.any() and np.ptp(rewards[gi][v]) == 0:
        dropped["zero_variance"] += int(v.sum())
        valid[gi] = False
  return GroupedTrials(groups, rewards, valid, dropped)


def _soft_zone(cfg) -> bool:
  """DAPO's soft punishment applies to every trial (finished ones too) once a sampled-token
  limit and a buffer before it are configured."""
  return int(cfg.get("max_sampled_tokens", 0)) > 0 and int(cfg.get("overlong_buffer", 0)) > 0


def _overlong_penalty(length: int, cfg) -> float:
  """DAPO soft overlong punishment: 0 below ``max - buffer``, linear to ``-penalty`` at max.
  Without a limit (``max_sampled_tokens`` 0) only over-long trials get here: full penalty."""
  max_len = int(cfg.get("max_sampled_tokens", 0)) or length
  buffer = int(cfg.get("overlong_buffer", 0))
  penalty = float(cfg.get("overlong_penalty", 1.0))
  if buffer <= 0:
    return -penalty
  excess = length - (max_len - buffer)
  return -penalty * min(max(excess / buffer, 0.0), 1.0)
