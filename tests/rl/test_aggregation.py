"""Aggregation modes and per-sequence reductions vs NumPy loops over (row, segment)."""

import numpy as np
import pytest

from legorl_jax.errors import ConfigError
from legorl_jax.rl import aggregation as agg


def _data(seed=0):
  rng = np.random.default_rng(seed)
  seg = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1], [3, 3, 1, 1, 0, 0]], np.int32)
  mask = (rng.random(seg.shape) > 0.2).astype(np.float32)
  mask[0, 2:5] = 0.0  # Segment 2 of row 0 has no counted token: not a sequence.
  loss = rng.normal(size=seg.shape).astype(np.float32)
  return loss, mask, seg


def _np_seqs(mask, seg):
  out = {}
  for (i, t), s in np.ndenumerate(seg):
    if s > 0 and mask[i, t] > 0:
      out.setdefault((i, s), []).append(t)
  return out


@pytest.mark.parametrize("mode", agg.AGGREGATIONS)
def test_aggregate_matches_numpy(mode):
  loss, mask, seg = _data()
  seqs = _np_seqs(mask, seg)
  if mode == "token-mean":
    want = (sum(loss[i, t] for (i, _), ts in seqs.items() for t in ts),
            sum(len(ts) for ts in seqs.values()))
  else:
    per = [sum(loss[i, t] for t in ts) for (i, _), ts in seqs.items()]
    if mode == "seq-mean-token-mean":
      per = [p / len(ts) for p, ts in zip(per, seqs.values())]
    elif mode == "seq-mean-token-sum-norm":
      per = [p / 10.0 for p in per]
    want = (sum(per), len(per))
  s, d = agg.aggregate(loss, mask, seg, mode=mode, max_len=10)
  np.testing.assert_allclose(float(s), want[0], rtol=1e-5)
  assert float(d) == want[1]


def test_sequence_mean_and_default_segments():
  loss, mask, seg = _data(1)
  got = np.asarray(agg.sequence_mean(loss, mask, seg))
  for (i, s), ts in _np_seqs(mask, seg).items():
    want = np.mean([loss[i, t] for t in ts])
    for t in np.nonzero(seg[i] == s)[0]:
      np.testing.assert_allclose(got[i, t], want, rtol=1e-5)
  # No segment ids: one sequence per row.
  s, d = agg.aggregate(loss, mask, None, mode="seq-mean-token-mean")
  want = sum(np.sum(loss[i] * mask[i]) / np.sum(mask[i]) for i in range(3))
  np.testing.assert_allclose(float(s), want, rtol=1e-5)
  assert float(d) == 3
  with pytest.raises(ConfigError, match="unknown loss aggregation"):
    agg.aggregate(loss, mask, seg, mode="sum")
