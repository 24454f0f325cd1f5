"""Shared-prompt decode attention (``sampling.shared_prefix``): the merged prefix + suffix
attention against the plain one, the host plan, and a running engine against the
teacher-forced decoder for mixed groups, rows joining and leaving, groups of one and prompts
shorter than any split (tiny preset, random weights)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax.models import create_model
from legorl_jax.models.config import get_preset
from legorl_jax.sampling import Engine, SamplingParams
from legorl_jax.sampling import shared_prefix
from legorl_jax.sampling.cache import SCRATCH, Cache, attend
from tests.sampling import reference
from tests.sampling import test_engine as te


def test_plan_picks_the_split_that_saves_most_and_pads_groups():
  a = np.arange(100)
  b = np.concatenate([np.arange(70), 1000 + np.arange(30)])  # agrees with a on 70 tokens
  c = 5000 + np.arange(100)
  rows = [(0, a, 99), (1, a, 99), (2, a, 99), (3, b, 99), (4, c, 99)]
  p, g, saved = shared_prefix.plan(rows, 8, [32, 64, 96])
  # P=64: {0,1,2,3} + {4} saves 64 * 3; P=96: {0,1,2} + {3} + {4} saves 96 * 2 = 192 = P=64's.
  assert p == 64 and saved == 64 * 3
  assert g.members.shape == (2, 4)  # 2 groups, 4 members (powers of two)
  assert sorted(g.members[0].tolist()) == [0, 1, 2, 3] and g.leaders[0] == 0
  assert g.members[1].tolist() == [4, 8, 8, 8] and g.leaders[1] == 4
  flat = g.members.reshape(-1)
  for r in range(5):
    assert flat[g.where[r]] == r


def test_plan_declines_when_nothing_is_shared_or_a_prompt_is_too_short():
  a, c = np.arange(100), 5000 + np.arange(100)
  assert shared_prefix.plan([(0, a, 99), (1, c, 99)], 4, [32, 64]) is None  # nothing in common
  assert shared_prefix.plan([(0, a, 99), (1, a, 20)], 4, [32, 64]) is None  # one row below 32
  assert shared_prefix.plan([(0, a, 99)], 1, [32, 64]) is None  # one row


def test_merged_attention_equals_plain_attention_over_the_whole_window():
  rng = np.random.default_rng(0)
  r, h, hkv, dh, w, p = 6, 4, 2, 8, 48, 32
  kt = rng.normal(size=(r, hkv, dh, SCRATCH + w)).astype(np.float32)
  v = rng.normal(size=(r, hkv, SCRATCH + w, dh)).astype(np.float32)
  # Rows 0, 2, 3 share row 0's prefix; rows 1 and 4 share row 1's; row 5 is alone.
  for dst, src in ((2, 0), (3, 0), (4, 1)):
    kt[dst, :, :, :SCRATCH + p] = kt[src, :, :, :SCRATCH + p]
    v[dst, :, :SCRATCH + p] = v[src, :, :SCRATCH + p]
  positions = np.array([40, 33, 47, 32, 39, 45])
  q = rng.normal(size=(r, 1, h, dh)).astype(np.float32)
  slots = np.arange(SCRATCH + w) - SCRATCH
  mask = (slots[None, None] >= 0) & (slots[None, None] <= positions[:, None, None])
  want = attend(jnp.asarray(q), jnp.asarray(kt), jnp.asarray(v), jnp.asarray(mask))
  groups = shared_prefix.Groups(leaders=np.array([0, 1, 5, 0], np.int32),
                                members=np.array([[0, 2, 3, 6], [1, 4, 6, 6], [5, 6, 6, 6],
                                                  [6, 6, 6, 6]], np.int32),
                                where=np.array([0, 4, 1, 2, 5, 8], np.int32))
  cache = Cache(k=(jnp.asarray(kt),), v=(jnp.asarray(v),))
  prefix = shared_prefix.gather(cache, p, groups)
  sub = shared_prefix.suffix_window(cache, r, p, w)
  spos = np.concatenate([np.full(SCRATCH, -1), np.arange(p, w)])  # the suffix slots' positions
  smask = (spos[None, None] >= 0) & (spos[None, None] <= positions[:, None, None])
  got = prefix.attend(0, jnp.asarray(q), sub.k[0], sub.v[0], jnp.asarray(smask))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=1e-5)


def test_suffix_window_round_trips():
  cfg = get_preset("tiny")
  cache = jax.tree.map(lambda x: x + jnp.arange(x.size, dtype=x.dtype).reshape(x.shape),
                       Cache.zeros(cfg, 3, 64))
  sub = shared_prefix.suffix_window(cache, 2, 32, 48)
  assert sub.v[0].shape[2] == SCRATCH + 16
  np.testing.assert_array_equal(sub.v[0][:, :, SCRATCH:], cache.v[0][:2, :, SCRATCH + 32:
                                                                    SCRATCH + 48])
  back = shared_prefix.put_suffix_window(cache, 32, jax.tree.map(lambda x: x * 0, sub))
  assert float(jnp.abs(back.v[0][:2, :, SCRATCH + 32:SCRATCH + 48]).max()) == 0
  np.testing.assert_array_equal(back.v[0][2], cache.v[0][2])  # rows past the window untouched
  np.testing.assert_array_equal(back.k[0][:, :, :, SCRATCH:SCRATCH + 32],
                                cache.k[0][:, :, :, SCRATCH:SCRATCH + 32])


ENGINE_KW = dict(te.ENGINE_KW, attn_buckets=(32, 64, 96, 128), max_batch=8, decode_rows=(8,),
                 prefill_rows=(4,))


@pytest.fixture(scope="module")
def model():
  return create_model("tiny", seed=0)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_with_shared_prefix_matches_the_teacher_forced_decoder(model, temperature):
  # Two groups (3 and 2 samples of 70-token prompts that agree on 40 tokens), a row alone, a
  # prompt shorter than the smallest split; staggered budgets, so rows leave and later ones
  # join decode calls already running.
  base = te._prompt(70, seed=1)  # noqa: SLF001 -- the engine tests' prompt maker
  other = base[:40] + te._prompt(30, seed=2)  # noqa: SLF001
  alone = te._prompt(66, seed=3)  # noqa: SLF001
  short = te._prompt(12, seed=4)  # noqa: SLF001
  first = [short, base, base, base, other, other, alone]
  later = [base, other]
  eng = Engine(model, decode_fn=te._text, seed=1, share_prefix=True, **ENGINE_KW)  # noqa: SLF001
  with eng:
    futs = [eng.submit(p, SamplingParams(temperature=temperature, max_tokens=8 + 6 * i,
                                         seed=10 + i)) for i, p in enumerate(first)]
    comps = [futs[0].result(timeout=300)]
    futs += [eng.submit(p, SamplingParams(temperature=temperature, max_tokens=20, seed=30 + i))
             for i, p in enumerate(later)]
    comps = [f.result(timeout=300) for f in futs]
    stats = eng.stats()
  assert stats["shared_prefix_calls"] > 0 and stats["shared_prefix_saved_slots"] > 0
  params = SamplingParams(temperature=temperature)
  te._check_against_teacher(model, first + later, comps, params)  # noqa: SLF001


def test_shared_prefix_samples_what_the_plain_engine_samples(model):
  prompts = [te._prompt(70, seed=5)] * 4 + [te._prompt(70, seed=6)] * 3  # noqa: SLF001
  out = {}
  for share in (False, True):
    with Engine(model, decode_fn=te._text, seed=1, share_prefix=share, **ENGINE_KW) as eng:  # noqa: SLF001
      futs = [eng.submit(p, SamplingParams(temperature=0.8, max_tokens=24, seed=i))
              for i, p in enumerate(prompts)]
      out[share] = [f.result(timeout=300) for f in futs]
  for a, b in zip(out[False], out[True]):
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_mixture_of_experts_routes_and_logprobs_with_a_shared_prefix():
  from tests.sampling import test_engine_routes as ter  # pylint: disable=import-outside-toplevel
  moe = create_model(ter.CONFIG, seed=0)
  rng = np.random.default_rng(0)
  shared = rng.integers(0, 256, 40).tolist()
  prompts = [shared + rng.integers(0, 256, n).tolist() for n in (3, 9, 20)]
  kw = dict(ter.KW, attn_buckets=(32, 64, 96, 128))
  with Engine(moe, max_batch=4, share_prefix=True, **kw) as eng:
    futures = [eng.submit(p, SamplingParams(temperature=0.0, max_tokens=12))
               for p in prompts]
    done = [f.result(120) for f in futures]
    assert eng.stats()["shared_prefix_calls"] > 0
  for p, c in zip(prompts, done):
    ter._check(moe, p, c)  # noqa: SLF001 -- every fed token's experts equal teacher forcing
  # Greedy tokens are the teacher-forced argmax (logprobs within float tolerance).
  seqs = [p + c.token_ids for p, c in zip(prompts, done)]
  for p, c, seq in zip(prompts, done, seqs):
    logits = np.asarray(moe(jnp.asarray(np.asarray(seq, np.int32)[None])))[0]
    for j, tok in enumerate(c.token_ids):
      row = logits[len(p) - 1 + j]
      assert tok == int(np.argmax(row))
      want = reference.log_softmax(row)[tok]
      assert abs(c.logprobs[j] - want) < 1e-4, (j, c.logprobs[j], want)
