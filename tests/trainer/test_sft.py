"""SFT loop: one full batch of one bucket per update, time budget, seeded draws."""

import ml_collections
import numpy as np

from legorl_jax.rollout.trajectory import Trajectory
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
  return Trajectory.from_json(
      {"segments": [{"token_ids": ids, "loss_mask": mask, "logprobs": [0.0] * n_tokens}]})


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


class FixedLogpLearner(RecordingLearner):
  """Scores every token of a demo at log(p) where p is the demo's first token id / 100."""

  def logprobs(self, batch):
    p = batch["input_ids"][:, :1].astype(np.float64) / 100.0
    logp = np.where(batch["segment_ids"] > 0, np.log(np.maximum(p, 1e-9)), 0.0)
    return logp, np.zeros_like(logp)


def _demo_p(p_percent, n_sampled=4):
  d = _demo(10, n_sampled)
  d.segments[0].token_ids = [p_percent] * 10
  return d


def test_imitation_check_against_direct_arithmetic():
  demos = [_demo_p(90), _demo_p(40), _demo_p(60, n_sampled=2)]
  got = sft.imitation_check(FixedLogpLearner(), demos, _cfg())
  seq_p = [0.9 ** 4, 0.4 ** 4, 0.6 ** 2]
  assert np.isclose(got["p_exact"], np.mean(seq_p))
  assert got["greedy_exact"] == 2 / 3                      # 0.4 < 1/2: greedy would differ
  assert np.isclose(got["nll"], -(4 * np.log(0.9) + 4 * np.log(0.4) + 2 * np.log(0.6)) / 10)


def test_check_stops_training_once_greedy_reproduces_held_out_demos():
  learner = FixedLogpLearner()
  last = sft.run_sft(learner, [_demo(10, 3)], _cfg(), steps=100, check_demos=[_demo_p(90)],
                     check_every=7, stop_at_greedy_exact=0.9)
  assert last["sft_step"] == 7 and last["check/greedy_exact"] == 1.0 and len(learner.shapes) == 7
  last = sft.run_sft(FixedLogpLearner(), [_demo(10, 3)], _cfg(), steps=20, check_demos=[_demo_p(40)],
                     check_every=7, stop_at_greedy_exact=0.9)
  assert last["sft_step"] == 20 and last["check/greedy_exact"] == 0.0


def _chat_demo(system, user, reply):
  """Token ids of a rendered chat: 1 starts a message (the first token of every demo)."""
  ids = [1] + system + [1] + user + [1] + reply
  mask = [0] * (len(ids) - len(reply)) + [1] * len(reply)
  return Trajectory.from_json(
      {"segments": [{"token_ids": ids, "loss_mask": mask, "logprobs": [-0.5] * len(ids)}]})


def test_without_shared_prefix_cuts_the_system_prompt_back_to_a_message_start():
  from legorl_jax.trainer import batching
  system = list(range(50, 80))
  # The user messages share their first tokens too: the cut goes back to the message start.
  demos = [_chat_demo(system, [7, 8, 9 + k], [20 + k, 30]) for k in range(3)]
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, advantage=1.0)]
  short = sft.without_shared_prefix(seqs)
  for s, full in zip(short, seqs):
    assert s.token_ids[:3] == [1, 7, 8] and full.token_ids[-len(s.token_ids):] == s.token_ids
    assert s.loss_mask == full.loss_mask[-len(s.loss_mask):] and sum(s.loss_mask) == sum(full.loss_mask)
    assert len(s.logprobs) == len(s.token_ids)
  # One sequence alone shares nothing with anything: left whole.
  assert sft.without_shared_prefix(seqs[:1]) == seqs[:1]


def test_short_context_steps_come_first_in_short_rows_with_more_rows():
  system = list(range(50, 80))
  demos = [_chat_demo(system, [7, 8 + k], [20 + k, 30]) for k in range(5)]  # 37 tokens, 6 short
  learner = RecordingLearner()
  c = _cfg()
  c.trainer.buckets = (64,)
  sft.run_sft(learner, demos, c, steps=6, seed=0, short_context_steps=4)
  shapes = [s[0] for s in learner.shapes]
  assert shapes[:4] == [(16, 16)] * 4  # 6 tokens -> rows of 16 (the shortest); 4 * 64 / 16 rows
  assert shapes[4:] == [(4, 64)] * 2


def test_share_prompt_steps_are_rows_of_one_system_prompt_and_several_demos():
  from legorl_jax.trainer import batching
  system = list(range(50, 80))
  demos = [_chat_demo(system, [7, 8 + k], [20 + k, 30]) for k in range(6)]  # 37 tokens each
  learner = RecordingLearner()
  seen = []
  learner.update = lambda batches: seen.append(batches) or {"loss/policy": 1.0}
  c = _cfg()
  c.trainer.buckets = (64,)
  c.trainer.share_prompt = (40, 8, 4, 2)
  sft.run_sft(learner, demos, c, steps=3, seed=0)
  for batches in seen:
    (b,) = batches
    assert b["input_ids"].shape == (2, 40 + 4 * 8)
    assert tuple(b[batching.LAYOUT_KEY]) == (40, 8)
    # every branch holds one demonstration's user message and reply, behind the 32 tokens
    # up to it that all demonstrations share
    for row in range(2):
      assert sorted(set(b["segment_ids"][row]) - {0}) == [1, 2, 3, 4, 5]
      assert (b["segment_ids"][row] == 1).sum() >= 32
    assert b["loss_mask"].sum() == 8 * 2
