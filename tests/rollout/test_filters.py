"""Filters: infrastructure failures never count as failures; their group is masked."""

import dataclasses

import ml_collections
import numpy as np

from legorl_jax.rollout import filters


@dataclasses.dataclass
class R:  # the fields of TrialResult the filters read
  trial_id: str
  group: int
  status: str
  reward: float
  sampled_tokens: int = 10
  trajectory: dict = dataclasses.field(default_factory=lambda: {"segments": [{"token_ids": [1]}]})


def cfg(**kw):
  c = ml_collections.ConfigDict(dict(overlong="keep", overlong_penalty=1.0, overlong_buffer=0,
                                     max_sampled_tokens=0, drop_zero_variance=False,
                                     mask_broken_groups=True))
  c.update(kw)
  return c


def test_broken_trial_masks_its_group_only():
  rs = [R("a0", 0, "solved", 1.0), R("a1", 0, "harness_error", 0.0),
        R("b0", 1, "solved", 1.0), R("b1", 1, "failed", 0.0)]
  g = filters.prepare_groups(rs, 2, cfg())
  np.testing.assert_array_equal(g.valid, [[False, False], [True, True]])
  assert g.dropped["harness_error"] == 1 and g.dropped["group_masked"] == 1
  g2 = filters.prepare_groups(rs, 2, cfg(mask_broken_groups=False))
  np.testing.assert_array_equal(g2.valid, [[True, False], [True, True]])


def test_overlong_modes_and_zero_variance():
  rs = [R("a0", 0, "overlong", 0.0, sampled_tokens=100), R("a1", 0, "solved", 1.0)]
  keep = filters.prepare_groups(rs, 2, cfg())
  assert keep.valid.all() and keep.rewards[0, 0] == 0.0
  drop = filters.prepare_groups(rs, 2, cfg(overlong="drop"))
  np.testing.assert_array_equal(drop.valid, [[False, True]])
  pen = filters.prepare_groups(rs, 2, cfg(overlong="penalty", overlong_penalty=0.5,
                                          overlong_buffer=50, max_sampled_tokens=120))
  assert np.isclose(pen.rewards[0, 0], -0.5 * (100 - 70) / 50)
  same = [R("c0", 0, "failed", 0.0), R("c1", 0, "failed", 0.0)]
  zv = filters.prepare_groups(same, 2, cfg(drop_zero_variance=True))
  assert not zv.valid.any() and zv.dropped["zero_variance"] == 2


def test_stale_trials_are_excluded_without_masking_the_group():
  rs = [R("a0", 0, "solved", 1.0), R("a1", 0, "failed", 0.0), R("a2", 0, "failed", 0.0)]
  g = filters.prepare_groups(rs, 3, cfg(), stale=frozenset({"a1"}))
  np.testing.assert_array_equal(g.valid, [[True, False, True]])
  assert g.dropped["stale"] == 1
