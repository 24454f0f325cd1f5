"""The engine's recorded routes (``Completion.routes``) of a mixture-of-experts policy: every
fed token's experts per sparse layer equal the teacher-forced model's top-k over the same
sequence, whether its K/V were prefilled, decoded, copied from another row or from the prefix
store; the last sampled token has none (-1). Dense engines keep no route cache at all."""

import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model, get_preset
from legorl_jax.sampling import Engine, SamplingParams

CONFIG = get_preset("tiny-moe", vocab_size=256, hidden_size=64, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=16, moe_intermediate_size=32, mlp_only_layers=(1,),
                    initializer_range=0.3)
KW = dict(max_len=128, prefill_chunk=16, attn_buckets=(64, 128),
          decode_chunk=4, seed=0)


def _text(ids):
  return "".join(chr(65 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def model():
  return create_model(CONFIG, seed=0)


def _teacher_forced(model, ids):
  _, info = model.hidden_routed(jnp.asarray(np.asarray(ids, np.int32)[None]))
  return np.asarray(info.experts)[0]


def _check(model, prompt, c):
  """Routes of every fed token equal the teacher-forced ones; the unfed tail is -1."""
  seq = list(prompt) + c.token_ids
  assert c.routes.shape == (len(seq), len(CONFIG.moe_layers), CONFIG.num_experts_per_tok)
  assert c.routes.dtype == np.int8
  fed = (c.routes >= 0).all(axis=(1, 2))
  assert fed[:len(seq) - 1].all() and not (c.routes[fed] < 0).any()
  np.testing.assert_array_equal(c.routes[fed], _teacher_forced(model, seq)[fed])
  return fed


def test_routes_of_batched_requests_with_a_shared_prefix(model):
  rng = np.random.default_rng(0)
  shared = rng.integers(0, 256, 40).tolist()
  prompts = [shared + rng.integers(0, 256, n).tolist() for n in (3, 9, 20)]
  with Engine(model, max_batch=4, **KW) as engine:
    futures = [engine.submit(p, SamplingParams(max_tokens=12, seed=i)) for i, p in enumerate(prompts)]
    done = [f.result(120) for f in futures]
    # Admitted together: one request prefilled the shared chunks, the others copied them.
    assert engine.stats()["prefix_copies"] > 0
    for p, c in zip(prompts, done):
      fed = _check(model, p, c)
      assert not fed[-1]  # the last sampled token is never fed back
    # A session's next turn reuses its row's prefix (positions prefilled by the first turn).
    turn1 = engine.generate(prompts[0], SamplingParams(max_tokens=6, seed=7), session_id="s")
    follow = prompts[0] + turn1.token_ids + rng.integers(0, 256, 5).tolist()
    turn2 = engine.generate(follow, SamplingParams(max_tokens=6, seed=8), session_id="s")
    assert turn2.reused_prefix_len >= len(prompts[0]) - 1
    _check(model, follow, turn2)


def test_routes_through_the_prefix_store_and_a_stop_string(model):
  rng = np.random.default_rng(1)
  a, b = rng.integers(0, 256, 50).tolist(), rng.integers(0, 256, 50).tolist()
  with Engine(model, max_batch=1, prefix_cache_gb=1e-3, decode_fn=_text, **KW) as engine:
    engine.generate(a, SamplingParams(max_tokens=4, seed=0))
    engine.generate(b, SamplingParams(max_tokens=4, seed=0))  # a's prefix goes to the store
    c = engine.generate(a + [1, 2, 3], SamplingParams(max_tokens=4, seed=0))
    assert engine.stats()["prefix_store_hits"] >= 1 and c.reused_prefix_len >= 40
    _check(model, a + [1, 2, 3], c)
    # A stop string cuts the completion (and the tokens sampled after it in its chunk): the
    # routes keep their alignment with what is left.
    free = engine.generate(b, SamplingParams(max_tokens=24, seed=3))
    stop = _text(free.token_ids[5:7])
    cut = engine.generate(b, SamplingParams(max_tokens=24, seed=3, stop=(stop,)))
    assert cut.finish_reason == "stop" and len(cut.token_ids) < len(free.token_ids)
    _check(model, b, cut)


def test_record_routes_off_and_dense_engines_keep_no_route_cache(model):
  with Engine(model, max_batch=1, record_routes=False, **KW) as engine:
    assert engine.generate([1, 2, 3], SamplingParams(max_tokens=3)).routes is None
    assert engine._device.cache.routes is None
  dense = create_model(CONFIG.replace(architecture="qwen3", num_experts=0), seed=0)
  with Engine(dense, max_batch=1, **KW) as engine:
    assert engine.generate([1, 2, 3], SamplingParams(max_tokens=3)).routes is None
    assert engine._device.cache.routes is None and not engine.record_routes
  with pytest.raises(errors.ConfigError, match=r"record_routes=True\) needs a mixture-of-experts"):
    Engine(dense, max_batch=1, record_routes=True, **KW)
