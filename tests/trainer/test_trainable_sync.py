"""Invariant 2 with a partial weight sync: after top:K / LoRA updates, the sampler receives only
what changed (the trained blocks and final norm, or the merged targeted kernels) and its
recorded logprobs equal the learner's teacher-forced ones (fp32 CPU, |delta| < 1e-5)."""

import numpy as np
import pytest

from legorl_jax.models import create_model
from legorl_jax.sampling import Engine, SamplingParams
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers
from tests.trainer.test_trainable import _cfg

ENGINE_KW = dict(max_batch=2, max_len=64, prefill_buckets=(32,), prefill_rows=(2,), decode_rows=(2,),
                 attn_buckets=(64,), decode_chunk=8)


def _row(ids):
  t = len(ids)
  return {"input_ids": np.asarray([ids], np.int32), "positions": np.arange(t, dtype=np.int32)[None],
          "segment_ids": np.ones((1, t), np.int32), "loss_mask": np.ones((1, t), np.float32),
          "advantages": np.zeros((1, t), np.float32)}


def _sampled_vs_learner(engine, learner, prompt, seed):
  c = engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=20, seed=seed))
  logp, _ = learner.logprobs(_row(prompt + c.token_ids))
  return np.asarray(c.logprobs), logp[0, len(prompt):len(prompt) + len(c.token_ids)], c


@pytest.mark.parametrize("trainable", ["top:1", "lora"])
def test_partial_sync_keeps_sampler_and_learner_logprobs_equal(trainable):
  model = create_model(helpers.CFG, seed=0)
  learner = Learner(model, _cfg(trainable, lr=3e-2, targets=("q", "k", "v", "o", "gate", "up", "down")))
  base = Learner(model, _cfg("all"))  # the unchanged policy, to show the updates matter
  engine = Engine(model, seed=0, **ENGINE_KW).start()
  try:
    prompt = np.random.default_rng(0).integers(0, helpers.CFG.vocab_size, 12).tolist()
    for round_ in range(2):  # the second sync completes from the first one's parameters
      learner.update([helpers.make_batch(seed=20 + round_)])
      sync = learner.sync_params()
      if trainable == "top:1":
        assert set(sync) == {k for k in learner.params_copy() if k.startswith(("layers.1.", "final_norm."))}
      else:
        assert set(sync) == set(learner.plan.lora_kernels) and len(sync) == 14
      assert engine.update_params(sync) == round_ + 1
      got, want, c = _sampled_vs_learner(engine, learner, prompt, seed=round_)
      assert c.params_version == round_ + 1 and len(got) == 20
      np.testing.assert_allclose(got, want, atol=1e-5)
      base_logp, _ = base.logprobs(_row(prompt + c.token_ids))
      assert np.abs(base_logp[0, len(prompt):len(prompt) + 20] - got).max() > 1e-3
  finally:
    engine.stop()
