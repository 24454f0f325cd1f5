"""Prefix cache across sessions: a GRPO group prefills its shared prompt once (requests
submitted together included), results are bit-identical to a cache-off engine at any
interleaving and whatever ran before, the LRU prefix store keeps evicted rows' prefixes,
a weight sync forgets every cached prefix, and no request compiles a new shape.

Prefill chunks are 64 tokens: XLA:CPU picks its matmul kernel by size, and below ~64 rows
a call's row count (1 or 4 prompts) changes the last bits. Bit-exact comparisons use one
decode shape (``decode_rows=(4,)``, one attention bucket):
the cache changes only prefill, and XLA's decode results differ in the last bits between
decode shapes (rows x window), which the batching picks whatever the cache does."""

import concurrent.futures
import random

import numpy as np
import pytest

from legorl_jax.models import create_model
from legorl_jax.sampling import Engine, SamplingParams, prefix_cache
from legorl_jax.sampling.steps import COMPILATIONS
from tests.sampling import reference
from tests.sampling.test_engine import _prompt, _teacher_logits

MAX_LEN = 128
KW = dict(max_batch=4, max_len=MAX_LEN, prefill_chunk=64, prefill_rows=(1, 4),
          decode_rows=(4,), attn_buckets=(MAX_LEN,), decode_chunk=8, max_stop_ids=4)


@pytest.fixture(scope="module")
def model():
  return create_model("tiny", seed=0)


@pytest.fixture(scope="module")
def plain(model):
  eng = Engine(model, prefix_reuse=False, seed=1, **KW)
  eng.warmup()
  with eng:
    yield eng


def _group(seed, shared, n, own=0):
  """``n`` prompts: ``shared`` common tokens (the harness's system prompt) + ``own`` each."""
  head = _prompt(shared, seed=seed)
  return [head + _prompt(own, seed=seed * 100 + i) for i in range(n)] if own else [head] * n


def _same(a, b):
  assert a.token_ids == b.token_ids
  assert a.logprobs == b.logprobs  # bit for bit


def _check_teacher(model, prompt, comp, temperature):
  logits = _teacher_logits(model, [prompt + comp.token_ids])[0]
  for j, tok in enumerate(comp.token_ids):
    row = logits[len(prompt) - 1 + j]
    want = reference.log_softmax(row / temperature)[tok]
    assert abs(comp.logprobs[j] - want) < 1e-5, (j, comp.logprobs[j], want)


def test_group_submitted_together_prefills_its_prompt_once(model, plain):
  """8 samples of one prompt arrive at once (threads): the first prefills it, the others copy
  it; outputs equal a cache-off engine's bit for bit and the teacher-forced logprobs."""
  prompt = _prompt(100, seed=5)  # 99 prefilled positions: a whole chunk and a partial one
  params = [SamplingParams(temperature=1.0, max_tokens=12, seed=i) for i in range(8)]
  with Engine(model, seed=1, **KW) as eng:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      got = list(pool.map(lambda p: eng.generate(prompt, p, timeout=300), params))
    stats = eng.stats()
  assert stats["prefill_tokens"] == 99  # once, not 8 x 99
  assert stats["reused_tokens"] == 7 * 99 and sum(c.reused_prefix_len for c in got) == 7 * 99
  for p, c in zip(params, got):
    _same(c, plain.generate(prompt, p))
    _check_teacher(model, prompt, c, 1.0)


def test_any_interleaving_is_bit_exact_vs_cache_off(model, plain):
  """Groups sharing a system prompt, multi-turn sessions and one-off prompts, submitted from
  16 threads in a shuffled order, twice, on a cache engine with a small prefix store (forcing
  LRU evictions): every completion equals the cache-off engine's bit for bit."""
  reqs = []
  for g in range(3):  # 3 groups x 4 samples, prompts = system prompt + task
    for s, p in enumerate(_group(7, 40, 4, own=5 + g)):
      reqs.append((p, SamplingParams(temperature=0.8, max_tokens=10, seed=10 * g + s), None))
  for i in range(6):
    reqs.append((_prompt(3 + 9 * i, seed=300 + i), SamplingParams(temperature=0.0,
                                                                    max_tokens=6), None))
  want = [plain.generate(p, sp) for p, sp, _ in reqs]
  store_gb = 2.5 * prefix_cache.row_bytes(model.config, MAX_LEN, None) / (1 << 30)  # 2 rows
  with Engine(model, seed=1, prefix_cache_gb=store_gb, **KW) as eng:
    assert eng.stats()["prefix_store_rows"] == 2
    for order_seed in (0, 1):
      order = list(range(len(reqs)))
      random.Random(order_seed).shuffle(order)
      with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futs = {i: pool.submit(eng.generate, *reqs[i], 300) for i in order}
        got = {i: f.result() for i, f in futs.items()}
      for i in range(len(reqs)):
        _same(got[i], want[i])
    # Multi-turn sessions interleaved with the groups' prompts (other rows come and go).
    histories = {s: _prompt(20 + s, seed=500 + s) for s in range(3)}
    session_reuse = 0
    for turn in range(3):
      with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = {s: pool.submit(eng.generate, h, SamplingParams(temperature=0.0, max_tokens=7),
                               f"sess{s}", 300) for s, h in histories.items()}
        extra = [pool.submit(eng.generate, *reqs[j], 300) for j in range(turn, 12, 6)]
        got = {s: f.result() for s, f in futs.items()}
        for j, f in zip(range(turn, 12, 6), extra):
          _same(f.result(), want[j])
      for s, h in histories.items():
        _same(got[s], plain.generate(h, SamplingParams(temperature=0.0, max_tokens=7)))
        session_reuse += got[s].reused_prefix_len if turn else 0
        histories[s] = h + got[s].token_ids + _prompt(6, seed=600 + 10 * s + turn)
    stats = eng.stats()
  assert session_reuse > 0  # (a 2-row store under this load keeps some session prefixes)
  assert stats["prefix_store_hits"] > 0 and stats["prefix_store_evictions"] > 0
  assert stats["reused_tokens"] > stats["prefill_tokens"]


def test_results_do_not_depend_on_what_ran_before(model):
  prompt = _prompt(50, seed=9)
  params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=3)
  with Engine(model, seed=1, **KW) as fresh:
    want = fresh.generate(prompt, params)
  with Engine(model, seed=1, prefix_cache_gb=0.001, **KW) as used:
    for i in range(6):  # other sessions, some sharing a prefix of the prompt
      used.generate(prompt[:10 + 7 * i] + _prompt(5, seed=i), SamplingParams(max_tokens=5),
                    session_id=f"o{i}")
    got = used.generate(prompt, params)
  assert got.reused_prefix_len > 0
  _same(got, want)


def test_weight_sync_invalidates_every_cached_prefix(model):
  """After ``update_params`` no request reads K/V of the old parameters: the same prompt (held
  by idle rows and the store before the sync) is prefilled afresh and equals a fresh engine
  on the new parameters, bit for bit; a group submitted right after the sync still shares its
  (new) prefill."""
  other = create_model("tiny", seed=1)
  prompt = _prompt(40, seed=12)
  params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i) for i in range(4)]
  with Engine(other, seed=1, **KW) as ref:
    want = [ref.generate(prompt, p) for p in params]
  with Engine(model, seed=1, prefix_cache_gb=0.001, **KW) as eng:
    for i in range(6):  # the prompt in every row and in the store
      eng.generate(prompt, SamplingParams(max_tokens=2), session_id=f"s{i}")
    assert eng.stats()["prefix_store_rows"] > 0
    eng.update_params(other)
    before = eng.stats()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      got = list(pool.map(lambda p: eng.generate(prompt, p, session_id="s0", timeout=300),
                          params[:1]))
      got += list(pool.map(lambda p: eng.generate(prompt, p, timeout=300), params[1:]))
    after = eng.stats()
  assert got[0].reused_prefix_len == 0 and got[0].params_version == 1
  assert after["prefill_tokens"] - before["prefill_tokens"] == 39  # once, with new weights
  for g, w in zip(got, want):
    _same(g, w)
    _check_teacher(other, prompt, g, 1.0)


def test_the_cache_compiles_no_shape_per_request(model):
  kw = dict(KW, attn_buckets=(64, MAX_LEN), decode_rows=(1, 4))
  eng = Engine(model, seed=1, prefix_cache_gb=0.001, **kw)
  eng.warmup()
  before = dict(COMPILATIONS)
  assert before.get("copy_prefix", 0) > 0
  rng = np.random.default_rng(4)
  with eng, concurrent.futures.ThreadPoolExecutor(12) as pool:
    futs = []
    for i in range(40):
      n = int(rng.integers(1, 90))
      p = _prompt(30, seed=1) + _prompt(n, seed=2000 + i % 7)
      sp = SamplingParams(temperature=float(rng.choice([0.0, 1.0])),
                          max_tokens=int(rng.integers(1, MAX_LEN - len(p))))
      futs.append(pool.submit(eng.generate, p, sp, f"s{i % 5}" if i % 2 else None, 300))
    for f in futs:
      f.result()
    stats = eng.stats()
  assert stats["prefix_copies"] > 0 and stats["reused_tokens"] > 0
  assert dict(COMPILATIONS) == before
