"""Frozen-trunk cache (``trainer.trunk_cache``): SFT with the frozen blocks' output computed once
per demonstration gives the per-step losses of SFT without it, in every row layout, and past
its memory bound too."""

import ml_collections
import numpy as np
import pytest

from legorl_jax.models import create_model
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.trainer import batching
from legorl_jax.trainer import sft, trunk_cache
from legorl_jax.trainer.learner import Learner
from tests.trainer.test_train_step import CFG

MODEL = CFG.replace(num_layers=4)  # top:2 -> blocks 0-1 frozen, the trunk
PROMPT = list(range(5, 25))  # every demonstration starts with the same "system prompt"


def _demos(n=12, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    tail = rng.integers(30, MODEL.vocab_size, int(rng.integers(6, 14))).tolist()
    ids = PROMPT + tail
    mask = [0] * (len(PROMPT) + 2) + [1] * (len(tail) - 2)
    out.append(Trajectory.from_json(
        {"segments": [{"token_ids": ids, "loss_mask": mask, "logprobs": [0.0] * len(ids)}]}))
  return out


def _cfg(share_prompt=(), cache_mb=0.0, micro=1):
  c = ml_collections.ConfigDict()
  c.loss = ml_collections.ConfigDict(dict(name="reinforce", temperature=1.0, aggregation="token-mean",
                                          kl_coef=0.0, vf_coef=0.0))
  c.trainer = ml_collections.ConfigDict(dict(
      micro_batches=micro, logprob_impl="xla", trainable="top:2", rows_per_batch=2,
      buckets=(24, 40), pack=False, share_prompt=share_prompt))
  # The cached states differ from the in-step ones by float rounding only (a loss differs by
  # 0-1 ulp at step 0). Adam divides by sqrt(v): on near-zero gradients rounding becomes
  # update-sized and grows over steps (to ~6 ulp by step 24 at eps=1e-8); eps=1e-3 keeps
  # rounding rounding-sized, as the compile-options test does.
  c.optim = ml_collections.ConfigDict(dict(learning_rate=3e-3, schedule="constant", max_grad_norm=1.0,
                                           eps=1e-3))
  c.sft = ml_collections.ConfigDict(dict(trunk_cache_mb=cache_mb))
  return c


def _losses(cfg, demos, steps, seed=0):
  learner = Learner(create_model(MODEL, seed=0), cfg, seed=0)
  losses, last = [], {}

  def on_step(_, m):
    losses.append(m["nll"])
    last.update(m)

  sft.run_sft(learner, demos, cfg, steps=steps, seed=seed, on_step=on_step)
  return np.asarray(losses), last


@pytest.mark.parametrize("layout,micro", [((), 1), ((24, 16, 4, 1), 1), ((), 2)],
                         ids=["plain", "shared_prompt", "micro_batches"])
def test_cached_trunk_gives_the_losses_of_the_full_forward(layout, micro):
  demos = _demos()
  steps = 4 * len(demos) // (2 if not layout else 4)  # about four epochs of draws
  ref, _ = _losses(_cfg(layout, 0.0, micro), demos, steps)
  got, m = _losses(_cfg(layout, 64.0, micro), demos, steps)
  assert m["trunk_cache/sequences"] == len(demos) and m["trunk_cache/miss_batches"] == 0
  assert m["trunk_cache/hit_batches"] == steps  # one batch per step, all from the cache
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
  assert ref[-1] < ref[0] - 0.1  # it trains


def test_past_the_bound_batches_train_without_the_cache_and_losses_still_match():
  demos = _demos()
  seq_kb = (len(PROMPT) + 14) * MODEL.hidden_size * 4 / 1024  # at most one sequence, whole
  steps = 24
  ref, _ = _losses(_cfg((), 0.0), demos, steps)
  got, m = _losses(_cfg((), 3 * seq_kb / 1024), demos, steps)
  assert 0 < m["trunk_cache/sequences"] < len(demos) and m["trunk_cache/over_budget"] > 0
  assert m["trunk_cache/hit_batches"] > 0 and m["trunk_cache/miss_batches"] > 0
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def test_states_from_the_cache_equal_the_trunk_of_the_batch_itself():
  """``attach`` assembles the trunk states of a batch laid out differently from the fill's
  (packed rows, a grouped row with another split of the prompt) from per-sequence states."""
  cfg = _cfg((), 64.0)
  learner = Learner(create_model(MODEL, seed=0), cfg, seed=0)
  seqs = [s for d in _demos(6) for s in batching.sequences_from_trajectory(d, advantage=1.0)]
  cache = trunk_cache.TrunkCache(learner.trunk_states, 64.0)
  fill, _ = batching.make_batches(seqs, buckets=(40,), rows_per_batch=3)
  cache.fill(fill)
  # the prompt stored once: the first sequence whole, the others from where they differ
  assert cache.sequences == 6
  assert cache.bytes == (sum(len(s.token_ids) for s in seqs) - 5 * len(PROMPT)) * MODEL.hidden_size * 4
  packed, _ = batching.make_batches(seqs, buckets=(64,), rows_per_batch=3, pack=True)
  grouped, _, _ = batching.make_grouped_batches(seqs, prefix_len=24, branch_len=16, branches=3,
                                                rows_per_batch=2)
  for b in packed + grouped:
    got = cache.attach(b)
    assert got is not None
    want = learner.trunk_states(b)
    real = batching.split_layout(b)[0]["segment_ids"] > 0
    np.testing.assert_allclose(got[trunk_cache.TRUNK_KEY][real], want[real], rtol=0, atol=1e-5)
  other = dict(fill[0], input_ids=fill[0]["input_ids"] + 1)
  assert cache.attach(other) is None and cache.misses == 1
