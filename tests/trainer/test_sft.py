"""SFT loop: one full batch of one bucket per update, time budget, seeded draws."""

import ml_collections
import numpy as np

from legorl_jax.trainer import sft


class RecordingLearner:
  """Records each update's batch shapes; the loss is a count so the loop's bookkeeping shows."""

  def __init__(self):
    self.shapes = []

  def update(self, batches):
    self.shapes.append([b["input_ids"].shape for b in batches])
    return {"loss/policy": float(len(self.shapes))}


def _demo(n_tokens, n_sampled):
  ids = list(range(1, n_tokens + 1))
  mask = [0] * (n_tokens - n_sampled) + [1] * n_sampled
  return {"segments": [{"token_ids": ids, "loss_mask": mask, "logprobs": [0.0] * n_tokens}]}


def _cfg():
  c = ml_collections.ConfigDict()
  c.trainer = ml_collections.ConfigDict({"rows_per_batch": 4, "buckets": (16, 32), "pack": False})
  return c


def test_each_update_is_one_batch_of_one_bucket_in_proportion():
  demos = [_demo(10, 3)] * 30 + [_demo(25, 5)] * 10
  learner = RecordingLearner()
  last = sft.run_sft(learner, demos, _cfg(), steps=200, seed=0)
  assert all(len(s) == 1 for s in learner.shapes)
  lengths = [s[0][1] for s in learner.shapes]
  assert set(lengths) == {16, 32} and all(s[0][0] == 4 for s in learner.shapes)
  assert 0.6 < lengths.count(16) / len(lengths) < 0.9   # 3:1 demos -> ~75% short-bucket steps
  assert last["sft_step"] == 200 and last["nll"] == 200.0
  again = RecordingLearner()
  sft.run_sft(again, demos, _cfg(), steps=200, seed=0)
  assert again.shapes == learner.shapes


def test_time_budget_stops_early():
  learner = RecordingLearner()
  assert sft.run_sft(learner, [_demo(10, 3)], _cfg(), steps=10**6, max_seconds=0.0) == {}
  assert learner.shapes == []
