"""Batching against a per-token walk of the input sequences."""

import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.trainer import batching


def _seq(n, start, adv, sampled_from):
  ids = list(range(start, start + n))
  mask = [1 if i >= sampled_from else 0 for i in range(n)]
  lps = [-0.1 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
  return batching.TrainSequence(ids, mask, lps, adv)


def test_every_token_lands_once_with_its_metadata():
  seqs = [_seq(5, 100, 1.0, 2), _seq(9, 200, -1.0, 4), _seq(3, 300, 0.5, 1), _seq(12, 400, 2.0, 6)]
  for pack in (False, True):
    batches, stats = batching.make_batches(seqs, buckets=(8, 16), rows_per_batch=2, pack=pack)
    assert stats["sequences"] == 4 and stats["tokens"] == 29
    seen = {}
    for b in batches:
      assert b["input_ids"].shape[0] == 2 and b["input_ids"].shape[1] in (8, 16)
      for r in range(2):
        for sid in set(b["segment_ids"][r]) - {0}:
          sel = b["segment_ids"][r] == sid
          ids = b["input_ids"][r][sel].tolist()
          seen[ids[0]] = ids
          np.testing.assert_array_equal(b["positions"][r][sel], np.arange(sel.sum()))
          assert len(set(b["advantages"][r][sel])) == 1
    for s in seqs:
      assert seen[s.token_ids[0]] == s.token_ids


def test_packing_uses_fewer_rows():
  seqs = [_seq(4, 10 * i, 1.0, 1) for i in range(8)]
  unpacked, _ = batching.make_batches(seqs, buckets=(16,), rows_per_batch=8, pack=False)
  packed, st = batching.make_batches(seqs, buckets=(16,), rows_per_batch=8, pack=True)
  used = lambda bs: sum(int((b["segment_ids"] > 0).any(axis=1).sum()) for b in bs)  # noqa: E731
  assert used(unpacked) == 8 and used(packed) == 2
  assert st["padding_rows"] == 6


def test_long_sequences_are_truncated_and_counted():
  batches, stats = batching.make_batches([_seq(20, 0, 1.0, 2)], buckets=(8,), rows_per_batch=1)
  assert stats["truncated"] == 1
  assert batches[0]["input_ids"].tolist() == [list(range(8))]


def test_trajectory_segments_and_side_streams():
  traj = {"segments": [{"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [0, -1, -2],
                        "train": True},
                       {"token_ids": [4, 5], "loss_mask": [0, 0], "logprobs": [0, 0], "train": True}],
          "side_segments": [{"token_ids": [9], "loss_mask": [1], "logprobs": [-1], "train": False}]}
  seqs = batching.sequences_from_trajectory(Trajectory.from_json(traj), 0.3, "t1")
  assert len(seqs) == 1 and seqs[0].token_ids == [1, 2, 3] and seqs[0].advantage == 0.3


def test_bad_batching_config_is_named():
  with pytest.raises(errors.ConfigError):
    batching.make_batches([], buckets=(), rows_per_batch=1)


def _expand(batch, row):
  """The sequences a grouped row stands for: prompt tokens + each branch after its first."""
  arrays, (p, l) = batching.split_layout(batch)
  ids, seg, pos = arrays["input_ids"][row], arrays["segment_ids"][row], arrays["positions"][row]
  n = int((seg[:p] == 1).sum())
  out = []
  for j in range((len(ids) - p) // l):
    sl = slice(p + j * l, p + (j + 1) * l)
    live = seg[sl] > 0
    if not live.any():
      continue
    assert pos[sl][live][0] == n and (np.diff(pos[sl][live]) == 1).all()
    mask, logp = arrays["loss_mask"][row][sl][live], arrays["rollout_logp"][row][sl][live]
    assert not arrays["loss_mask"][row][:p].any()  # shared tokens are never trained
    out.append(([int(x) for x in ids[:n]] + [int(x) for x in ids[sl][live]],
                [0] * n + [int(x) for x in mask], [0.0] * n + [float(x) for x in logp],
                float(arrays["advantages"][row][sl][live][0])))
  return out


def test_grouped_batches_hold_every_sequence_once():
  rng = np.random.default_rng(0)
  seqs = []
  system = list(rng.integers(3, 100, 6))
  for g in range(5):  # five prompts behind one system prompt, 3 samples each
    prompt = system + list(rng.integers(3, 100, 4))
    for i in range(3):
      first = [7] if i < 2 else [8]  # two samples share their first sampled token
      comp = first + list(rng.integers(3, 100, int(rng.integers(1, 6))))
      seqs.append(batching.TrainSequence(prompt + comp, [0] * len(prompt) + [1] * len(comp),
                                         [0.0] * len(prompt) + [-1.0] * len(comp), float(g * 3 + i)))
  seqs.append(batching.TrainSequence(list(rng.integers(3, 100, 40)), [0] * 10 + [1] * 30,
                                     [0.0] * 40, 9.0))  # too long for a branch
  seqs.append(batching.TrainSequence(system + [1, 2], [0] * 8, [0.0] * 8, 10.0))  # nothing sampled
  batches, rest, stats = batching.make_grouped_batches(seqs, prefix_len=12, branch_len=8,
                                                       branches=4, rows_per_batch=2)
  assert [s.advantage for s in rest] == [9.0]
  got = [x for b in batches for r in range(b["input_ids"].shape[0]) for x in _expand(b, r)]
  want = [(s.token_ids, s.loss_mask, s.logprobs, s.advantage) for s in seqs[:-2]]
  assert sorted(got) == sorted(want)
  assert stats["sequences"] == 15 and stats["tokens"] < stats["unshared_tokens"]
  assert stats["no_trainable_tokens"] == 1  # every input is in a row, in rest, or counted


def test_grouped_batches_reject_bad_layout():
  with pytest.raises(errors.ConfigError, match="branches >= 2"):
    batching.make_grouped_batches([], prefix_len=8, branch_len=8, branches=1, rows_per_batch=1)


def test_shared_prompt_length_stops_at_divergence_and_at_trained_tokens():
  def naive(seqs):  # position by position: all equal so far and none trained there
    n = 0
    while all(n < len(s.token_ids) for s in seqs) and \
        len({s.token_ids[n] for s in seqs}) == 1 and not any(s.loss_mask[n] for s in seqs):
      n += 1
    return n
  system = [5, 6, 7, 8, 9]
  cases = [
      [batching.TrainSequence(system + [1, 2], [0] * 6 + [1], [0.0] * 7, 1.0),
       batching.TrainSequence(system + [3, 4], [0] * 6 + [1], [0.0] * 7, 1.0)],  # diverge at 5
      [batching.TrainSequence(system + [1], [0, 0, 0, 1, 1, 1], [0.0] * 6, 1.0),
       batching.TrainSequence(system + [1], [0] * 6, [0.0] * 6, 1.0)],  # trained from 3
      [batching.TrainSequence(system, [0] * 5, [0.0] * 5, 1.0)] * 2,  # identical, untrained
  ]
  for seqs in cases:
    assert batching.shared_prompt_length(seqs) == naive(seqs)
  assert [batching.shared_prompt_length(c) for c in cases] == [5, 3, 5]
  assert batching.shared_prompt_length([]) == 0
