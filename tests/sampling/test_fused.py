"""Fused projections (``sampling.fused``): q|k|v and gate|up as one matmul each compute the
same function as the Decoder's separate kernels, for every block kind (biases, qk-norm, MoE
blocks keeping their experts), in the device steps and in a running engine across updates."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from legorl_jax.models import create_model
from legorl_jax.models.config import get_preset
from legorl_jax.sampling import Engine, SamplingParams
from legorl_jax.sampling import fused as fused_lib
from legorl_jax.sampling.cache import Cache, forward

# tiny: qk-norm, no bias; with qkv_bias (Qwen2's kind); tiny-moe: sparse blocks keep experts.
CONFIGS = {"tiny": get_preset("tiny"),
           "tiny+bias": dataclasses.replace(get_preset("tiny"), qkv_bias=True, qk_norm=False),
           "tiny-moe": get_preset("tiny-moe")}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_forward_matches_separate_kernels_and_teacher_forcing(name):
  cfg = CONFIGS[name]
  model = create_model(cfg, seed=3)
  if cfg.qkv_bias:  # zero-initialised: give the biases values, so a dropped bias would show
    for blk in model.layers:
      for b in ("q_bias", "k_bias", "v_bias"):
        p = getattr(blk.attn, b)
        p[...] = jax.random.normal(jax.random.key(len(b)), p[...].shape) * 0.5
  graphdef, state = nnx.split(model)
  fused = fused_lib.FUSE(graphdef, state)
  d, f = cfg.hidden_size, cfg.intermediate_size
  q_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
  for blk, fb in zip(model.layers, fused):
    assert fb.qkv.shape == (d, q_out)
    assert (fb.qkv_bias is not None) == cfg.qkv_bias
    assert (fb.gate_up is None) == blk.sparse
    if not blk.sparse:
      assert fb.gate_up.shape == (d, 2 * f)
  ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 24)).astype(np.int32)
  pos = np.tile(np.arange(24, dtype=np.int32), (2, 1))
  pos[1, 20:] = -1  # padding
  outs = {}
  for use in (False, True):
    cache = Cache.zeros(cfg, 2, 32)
    hidden, cache = forward(model, ids, pos, cache, fused if use else None)
    outs[use] = (np.asarray(hidden), jax.device_get(cache))
  np.testing.assert_allclose(outs[True][0], outs[False][0], atol=2e-5, rtol=1e-5)
  for a, b in zip(outs[True][1].k + outs[True][1].v, outs[False][1].k + outs[False][1].v):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
  # And both are the teacher-forced Decoder's final hidden state (row 0, no padding).
  logits = np.asarray(model.logits_from_hidden(outs[True][0][0]))
  np.testing.assert_allclose(logits, np.asarray(model(ids[:1]))[0], atol=1e-4, rtol=1e-4)


def _sample(engine, prompts):
  sp = [SamplingParams(temperature=t, max_tokens=12, seed=7 + i)
        for i, t in enumerate([0.0, 0.7, 1.0])]
  with engine:
    return [engine.generate(p, s) for p, s in zip(prompts, sp)]


def test_engine_fused_samples_what_separate_kernels_sample_across_updates():
  """Same tokens, logprobs within 1e-5, with fusion on and off, before and after a parameter
  update (the fused copies are rebuilt from the new parameters)."""
  model = create_model("tiny", seed=0)
  new_params = nnx.split(create_model("tiny", seed=1))[1]
  prompts = [np.random.default_rng(i).integers(0, 8192, 20 + 7 * i).tolist() for i in range(3)]
  kw = dict(max_batch=4, max_len=128, prefill_chunk=16, decode_rows=(4,), attn_buckets=(128,),
            decode_chunk=4)
  results = {}
  for fuse in (False, True):
    eng = Engine(model, fuse_projections=fuse, seed=0, **kw)
    assert (eng._device.fused is not None) == fuse
    before = _sample(eng, prompts)
    old = eng._device.fused
    eng.update_params(new_params)
    if fuse:  # rebuilt, not the old copies
      assert not np.allclose(np.asarray(old[0].qkv), np.asarray(eng._device.fused[0].qkv))
    results[fuse] = (before, _sample(eng, prompts))
  for a_list, b_list in zip(results[False], results[True]):
    for a, b in zip(a_list, b_list):
      assert a.token_ids == b.token_ids
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  # The update changed what is sampled (the check above compared something that moved).
  assert [c.token_ids for c in results[True][0]] != [c.token_ids for c in results[True][1]]


def test_engine_fuses_only_when_asked():
  """Off by default (slower on XLA:CPU, BENCHMARKS.md); on, the copies exist and cost bytes."""
  model = create_model("tiny", seed=0)
  assert Engine(model, max_batch=2, max_len=64, prefill_chunk=16)._device.fused is None
  eng = Engine(model, max_batch=2, max_len=64, prefill_chunk=16, fuse_projections=True)
  assert eng._device.fuse_projections and fused_lib.nbytes(eng._device.fused) > 0
