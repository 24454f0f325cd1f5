"""Filters: infrastructure failures never count as failures; their group is masked."""

import dataclasses

import ml_collections
import numpy as np

from legorl_jax.rollout import filters
from legorl_jax.rollout.trajectory import Segment, Trajectory


@dataclasses.dataclass
class R:  # the fields of TrialResult the filters read
  trial_id: str
  group: int
  status: str
  reward: float
  sampled_tokens: int = 10
  trajectory: Trajectory = dataclasses.field(
      default_factory=lambda: Trajectory(segments=[Segment([1], [1], [-0.5])]))


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
  assert np.isclose(pen.rewards[0, 1], 1.0)  # 10 tokens: far below the buffer zone


def test_dapo_soft_penalty_reaches_finished_trials_near_the_limit():
  def dapo(length, l_max=120, l_cache=50, p=0.5):  # DAPO's R_length, scaled by p
    if length <= l_max - l_cache:
      return 0.0
    return p * max((l_max - l_cache - length) / l_cache, -1.0)
  lengths = [10, 70, 71, 95, 119, 120, 500]
  rs = [R(f"t{i}", i, "solved", 1.0, sampled_tokens=n) for i, n in enumerate(lengths)]
  g = filters.prepare_groups(rs, 1, cfg(overlong="penalty", overlong_penalty=0.5,
                                        overlong_buffer=50, max_sampled_tokens=120))
  np.testing.assert_allclose(g.rewards[:, 0], [1.0 + dapo(n) for n in lengths], atol=1e-6)
  # No buffer or no limit: finished trials are not shaped, over-long ones still are.
  for kw in (dict(overlong_buffer=0, max_sampled_tokens=120), dict(overlong_buffer=50)):
    g = filters.prepare_groups(rs + [R("o", 7, "overlong", 0.0, sampled_tokens=130)], 1,
                               cfg(overlong="penalty", overlong_penalty=0.5, **kw))
    np.testing.assert_allclose(g.rewards[:, 0], [1.0] * 7 + [-0.5])
  same = [R("c0", 0, "failed", 0.0), R("c1", 0, "failed", 0.0)]
  zv = filters.prepare_groups(same, 2, cfg(drop_zero_variance=True))
  assert not zv.valid.any() and zv.dropped["zero_variance"] == 2


def test_stale_trials_are_excluded_without_masking_the_group():
  rs = [R("a0", 0, "solved", 1.0), R("a1", 0, "failed", 0.0), R("a2", 0, "failed", 0.0)]
  g = filters.prepare_groups(rs, 3, cfg(), stale=frozenset({"a1"}))
  np.testing.assert_array_equal(g.valid, [[True, False, True]])
  assert g.dropped["stale"] == 1
