"""Engine: logprob agreement with a teacher-forced forward, stops, concurrency, prefix reuse,
compilation counts, parameter updates and error isolation (tiny preset, random weights)."""

import asyncio
import concurrent.futures
import contextlib
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.models.params import split_model
from legorl_jax.sampling import Engine, SamplingParams
from legorl_jax.sampling.steps import COMPILATIONS
from tests.sampling import reference

MAX_LEN = 128
ENGINE_KW = dict(max_batch=4, max_len=MAX_LEN, prefill_buckets=(32,), prefill_rows=(4,),
                 decode_rows=(4,), attn_buckets=(64, MAX_LEN), decode_chunk=8, max_stop_ids=4)
VOCAB = 8192


def _text(ids):
  return "".join(f"{t}|" for t in ids)


@pytest.fixture(scope="module")
def model():
  return create_model("tiny", seed=0)


@pytest.fixture(scope="module")
def engine(model):
  eng = Engine(model, decode_fn=_text, seed=1, **ENGINE_KW)
  eng.warmup()
  with eng:
    yield eng


def _prompt(n, seed):
  return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


_FORWARD = {}


def _teacher_logits(model, seqs):
  """Teacher-forced logits [N, MAX_LEN, V] of each sequence (right-padded; causal)."""
  graphdef, state = nnx.split(model)
  if graphdef not in _FORWARD:
    _FORWARD[graphdef] = jax.jit(lambda s, ids: nnx.merge(graphdef, s)(ids))
  ids = np.zeros((len(seqs), MAX_LEN), np.int32)
  for i, s in enumerate(seqs):
    ids[i, :len(s)] = s
  return np.asarray(_FORWARD[graphdef](state, ids))


def _check_against_teacher(model, prompts, comps, params):
  logits = _teacher_logits(model, [p + c.token_ids for p, c in zip(prompts, comps)])
  for i, (p, c) in enumerate(zip(prompts, comps)):
    n = len(p)
    for j, tok in enumerate(c.token_ids):
      row = logits[i, n - 1 + j]
      t = params.temperature
      want = reference.log_softmax(row if t == 0 else row / t)[tok]
      assert abs(c.logprobs[j] - want) < 1e-5, (i, j, c.logprobs[j], want)
      if t == 0:
        assert tok == int(np.argmax(row))
      else:
        assert tok in reference.allowed_set(row, t, params.top_p, params.top_k)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=24),
    SamplingParams(temperature=0.7, max_tokens=24, seed=3),
    SamplingParams(temperature=1.0, top_p=0.5, max_tokens=24),
    SamplingParams(temperature=1.0, top_k=3, top_p=0.9, max_tokens=24),
], ids=["greedy", "t0.7", "top_p", "top_k"])
def test_logprobs_match_teacher_forced_forward(engine, model, params):
  # Lengths cover: no prefill at all, one chunk, several chunks, windows 64 and 128.
  prompts = [_prompt(n, seed=n) for n in (1, 9, 40, 90)]
  futures = [engine.submit(p, params) for p in prompts]
  comps = [f.result(timeout=300) for f in futures]
  for p, c in zip(prompts, comps):
    assert c.finish_reason == "length" and len(c.token_ids) == 24 and c.prompt_len == len(p)
  _check_against_teacher(model, prompts, comps, params)


def test_stop_token_ids_and_stop_strings(engine):
  prompt = _prompt(20, seed=11)
  seeded = dict(temperature=1.0, seed=4, max_tokens=30)  # same seed + prompt -> same draws
  full = engine.generate(prompt, SamplingParams(**seeded))
  ids = full.token_ids
  j = next(j for j in range(10, 30) if ids[j] not in ids[:j])
  by_id = engine.generate(prompt, SamplingParams(**seeded, stop_token_ids=(ids[j], VOCAB - 1)))
  assert by_id.token_ids == ids[:j + 1] and by_id.finish_reason == "stop" and by_id.stop == ids[j]
  np.testing.assert_allclose(by_id.logprobs, full.logprobs[:j + 1], atol=1e-5)

  stop = _text([ids[7]])[-2:] + _text([ids[8]])[:2]  # spans a token (and a chunk) boundary
  n = next(n for n in range(1, 31) if stop in _text(ids[:n]))
  by_str = engine.generate(prompt, SamplingParams(**seeded, stop=(stop,)))
  assert by_str.token_ids == ids[:n] and by_str.finish_reason == "stop" and by_str.stop == stop
  np.testing.assert_allclose(by_str.logprobs, full.logprobs[:n], atol=1e-5)


def test_concurrent_threads_and_asyncio_match_solo_runs(engine):
  reqs = [(_prompt(5 + 6 * i, seed=100 + i),
           SamplingParams(temperature=[0.0, 0.8, 1.0][i % 3], top_k=[0, 0, 20][i % 3],
                          max_tokens=4 + i, seed=i)) for i in range(16)]
  solo = [engine.generate(p, sp) for p, sp in reqs[:4]]
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    threaded = list(pool.map(lambda r: engine.generate(*r), reqs))

  async def many():
    return await asyncio.gather(*(engine.agenerate(p, sp) for p, sp in reqs))

  asynced = asyncio.run(many())
  for i, (p, sp) in enumerate(reqs):
    assert len(threaded[i].token_ids) == sp.max_tokens
    assert threaded[i].token_ids == asynced[i].token_ids
    np.testing.assert_allclose(threaded[i].logprobs, asynced[i].logprobs, atol=1e-5)
  for s, t in zip(solo, threaded):  # batching does not change what a seeded request samples
    assert s.token_ids == t.token_ids


def test_no_recompilation_after_warmup(engine):
  before = dict(COMPILATIONS)
  n_buckets = (len(engine.prefill_rows) * len(engine.prefill_buckets) * len(engine.attn_buckets)
               + len(engine.decode_rows) * len(engine.attn_buckets))
  assert 0 < sum(before.values()) and n_buckets == 4
  rng = np.random.default_rng(5)
  futures = []
  for i in range(20):
    n = int(rng.integers(1, 100))
    sp = SamplingParams(temperature=float(rng.choice([0.0, 0.5, 1.0])),
                        top_p=float(rng.choice([1.0, 0.7])), top_k=int(rng.choice([0, 5])),
                        max_tokens=int(rng.integers(1, MAX_LEN - n)),
                        stop_token_ids=tuple(rng.integers(0, VOCAB, int(rng.integers(0, 4)))))
    futures.append(engine.submit(_prompt(n, seed=1000 + i), sp, session_id=f"s{i % 3}"))
  for f in futures:
    f.result(timeout=300)
  assert dict(COMPILATIONS) == before


@pytest.mark.parametrize("sampled", [False, True], ids=["exact", "reuse_sampled_kv"])
def test_prefix_reuse_prefills_only_new_tokens(engine, model, sampled):
  """A session's next turn reuses its history's K/V: the prefilled prompt (bit-identical to a
  cache-off run), or with ``reuse_sampled_kv`` the sampled tokens' too (equal to tolerance)."""
  plain = Engine(model, prefix_reuse=False, **ENGINE_KW)
  eng = Engine(model, reuse_sampled_kv=True, **ENGINE_KW) if sampled else engine
  greedy = SamplingParams(temperature=0.0, max_tokens=10)
  history = _prompt(30, seed=21)
  with plain, (eng if sampled else contextlib.nullcontext()):
    last_prompt = 0
    for turn in range(3):
      history = history + _prompt(15, seed=40 + turn)
      before = eng.stats()
      got = eng.generate(history, greedy, session_id=f"agent{sampled}")
      after = eng.stats()
      want = plain.generate(history, greedy)
      if turn > 0 and sampled:  # previous history minus its unfed last token is cached
        assert got.reused_prefix_len == len(history) - 15 - 1
      elif turn > 0:  # the previous prompt minus its last token (fed by a decode step)
        assert got.reused_prefix_len == last_prompt - 1
      assert want.reused_prefix_len == 0
      prefilled = after["prefill_tokens"] - before["prefill_tokens"]
      assert prefilled == len(history) - 1 - got.reused_prefix_len
      assert after["reused_tokens"] - before["reused_tokens"] == got.reused_prefix_len
      assert got.token_ids == want.token_ids
      if sampled:
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
      else:
        assert got.logprobs == want.logprobs  # bit for bit
      last_prompt = len(history)
      history = history + got.token_ids


def test_update_params_swaps_without_recompiling(model):
  other = create_model("tiny", seed=1)
  eng = Engine(model, **ENGINE_KW)
  eng.warmup()  # a no-op when the module's engine compiled the same shapes already
  with eng:
    compiled = dict(COMPILATIONS)
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    prompt = _prompt(12, seed=3)
    first = eng.generate(prompt, greedy, session_id="s")
    assert first.params_version == 0
    inflight = eng.submit(prompt, greedy)  # drains before the swap: sampled with version 0
    assert eng.update_params(other) == 1
    old = inflight.result(timeout=60)
    assert old.params_version == 0 and old.token_ids == first.token_ids
    new = eng.generate(prompt + first.token_ids[:-1], greedy, session_id="s")
    assert new.params_version == 1 and new.reused_prefix_len == 0  # cached K/V are stale
    _check_against_teacher(other, [prompt + first.token_ids[:-1]], [new], greedy)
    assert eng.update_params(split_model(model)[1], version=7) == 7  # flat params dict
    back = eng.generate(prompt, greedy)
    assert back.params_version == 7 and back.token_ids == first.token_ids
    assert dict(COMPILATIONS) == compiled
    flat = split_model(model)[1]
    flat["embed"] = flat["embed"][:, :64]
    with pytest.raises(errors.ConfigError, match="shape"):
      eng.update_params(flat)
    with pytest.raises(errors.ConfigError, match="version"):
      eng.update_params(model, version=3)


def test_bad_requests_fail_alone(model):
  def flaky_decode(ids):
    if len(ids) > 3:
      raise RuntimeError("detokenizer broke")
    return _text(ids)

  with Engine(model, decode_fn=flaky_decode, **ENGINE_KW) as eng:
    ok = SamplingParams(temperature=0.0, max_tokens=20)
    with pytest.raises(errors.ContextLengthError, match="max_len"):
      eng.generate(_prompt(120, seed=1), ok)
    with pytest.raises(errors.ConfigError, match="outside"):
      eng.generate([VOCAB + 5], ok)
    with pytest.raises(errors.ConfigError, match="max_stop_ids"):
      eng.generate([1], SamplingParams(max_tokens=4, stop_token_ids=(1, 2, 3, 4, 5)))
    results = {}

    def run(name, params):
      try:
        results[name] = eng.generate(_prompt(10, seed=len(name)), params)
      except errors.SamplingError as e:
        results[name] = e

    threads = [threading.Thread(target=run, args=("good1", ok)),
               threading.Thread(target=run, args=("bad", SamplingParams(
                   temperature=0.0, max_tokens=20, stop=("never-appears",)))),
               threading.Thread(target=run, args=("good2", ok))]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
    assert isinstance(results["bad"], errors.SamplingError) and "detokenizer" in str(results["bad"])
    assert len(results["good1"].token_ids) == 20 and len(results["good2"].token_ids) == 20
    assert eng.generate([5, 6, 7], ok).finish_reason == "length"  # still serving
    assert eng.stats()["failed"] == 1
  with pytest.raises(errors.ConfigError, match="decode_fn"), Engine(model, **ENGINE_KW) as plain:
    plain.submit([1], SamplingParams(max_tokens=4, stop=("x",)))
  with pytest.raises(errors.SamplingError, match="not running"):
    Engine(model, **ENGINE_KW).generate([1], ok)


@pytest.mark.slow
def test_sharded_model_matches_single_device(model):
  from legorl_jax.sharding.mesh import make_mesh  # 8 host devices (tests/conftest.py)
  mesh = make_mesh(data=1, fsdp=4, tensor=2)
  sharded = create_model("tiny", seed=0, mesh=mesh)
  greedy = SamplingParams(temperature=0.0, max_tokens=20)
  prompts = [_prompt(n, seed=n) for n in (5, 40, 70)]
  with Engine(sharded, **ENGINE_KW) as eng:
    assert eng._device.cache.k[0].sharding.mesh == mesh
    got = [eng.generate(p, greedy) for p in prompts]
    compiled = dict(COMPILATIONS)
    again = [eng.generate(p, greedy) for p in prompts]
    assert dict(COMPILATIONS) == compiled
  with Engine(model, **ENGINE_KW) as eng:
    want = [eng.generate(p, greedy) for p in prompts]
  for g, a, w in zip(got, again, want):
    assert g.token_ids == a.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)


def test_no_recompilation_after_warmup_with_committed_parameters():
  """Parameters placed on a one-device mesh are committed, so every step's outputs are, the
  kept window buffers included; new buffers are committed to match, or each bucket would trace
  again on its second use."""
  from legorl_jax.sharding.mesh import single_device_mesh
  placed = create_model("tiny", seed=0, mesh=single_device_mesh())
  kw = dict(ENGINE_KW, decode_rows=(1, 4))
  eng = Engine(placed, seed=1, **kw)
  eng.warmup()
  before = dict(COMPILATIONS)
  with eng:
    for i in range(3):
      eng.generate(_prompt(20, seed=1100 + i), SamplingParams(max_tokens=20))
    futures = [eng.submit(_prompt(10 + i, seed=1200 + i), SamplingParams(max_tokens=12))
               for i in range(4)]
    for f in futures:
      f.result(timeout=300)
  assert dict(COMPILATIONS) == before


def test_stragglers_in_high_rows_are_compacted_and_sample_the_same(model):
  """A long request left alone in the last row moves to row 0 (its idle neighbour's cached
  prefix swapped up, not lost): later chunks decode one row instead of four, and the tokens and
  logprobs equal a run of the same request alone in row 0."""
  kw = dict(ENGINE_KW, decode_rows=(1, 4))
  long_params = SamplingParams(temperature=1.0, max_tokens=60, seed=11)
  with Engine(model, seed=1, **kw) as eng:
    # All four arrive in one scheduling round. The device thread waits on the scheduler's lock,
    # so holding it while submitting means no round starts between two submissions (CI, loaded,
    # once admitted the long request a round after the short ones: a decode chunk then ran a row
    # still prefilling, 88 live row-steps of 96).
    with eng._scheduler.cv:  # noqa: SLF001
      short = [eng.submit(_prompt(6, seed=70 + i), SamplingParams(max_tokens=2, seed=i),
                          session_id=f"short{i}") for i in range(3)]
      long = eng.submit(_prompt(9, seed=80), long_params, session_id="long")
    for f in short:
      f.result(timeout=300)
    got = long.result(timeout=300)
    stats = eng.stats()
    # The short sessions kept their prefixes: resending one reuses it wherever it now lives.
    again = eng.generate(_prompt(6, seed=70) + short[0].result().token_ids + [5],
                         SamplingParams(max_tokens=1), session_id="short0")
  assert stats["row_moves"] >= 1
  # (the prefilled prompt, all but its last token: sampled tokens' K/V came from decode steps)
  assert again.reused_prefix_len == 6 - 1
  # Without compaction the three 8-step chunks after the short ones finish would run 4 rows.
  assert stats["decode_row_steps"] < 4 * stats["decode_calls"] * kw["decode_chunk"]
  # Compaction kept every row a decode call ran busy.
  assert stats["live_row_steps"] == stats["decode_row_steps"]
  with Engine(model, seed=1, **kw) as solo:
    want = solo.generate(_prompt(9, seed=80), long_params)
  assert got.token_ids == want.token_ids
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_stats_count_live_rows_apart_from_the_rows_decoded_and_time_the_device_calls(model):
  """Three requests in an engine whose decode calls always run 4 rows: at most 3 of every 4
  row-steps hold a request, at least one per decoded token; prefill and decode seconds are
  counted and fit in the wall time."""
  t0 = time.perf_counter()
  with Engine(model, seed=1, **ENGINE_KW) as eng:
    futures = [eng.submit(_prompt(8, seed=90 + i), SamplingParams(max_tokens=20, seed=i))
               for i in range(3)]
    for f in futures:
      f.result(timeout=300)
    stats = eng.stats()
  wall = time.perf_counter() - t0
  assert stats["decoded_tokens"] <= stats["live_row_steps"] <= 0.75 * stats["decode_row_steps"]
  assert stats["prefill_s"] > 0 and stats["decode_s"] > 0
  assert stats["prefill_s"] + stats["decode_s"] <= wall


def test_cancelled_request_frees_its_row_and_is_not_a_failure(model):
  """A caller that gives up cancels the engine's future (``agenerate`` does so when its task is
  cancelled): the engine stops sampling for it at the next chunk, counts it as cancelled (not
  failed) and serves the next request; a request cancelled while queued is never admitted."""
  entered, go = threading.Event(), threading.Event()

  def decode_fn(ids):  # runs on the engine thread after each chunk (stop-string check)
    entered.set()
    go.wait(300)
    return _text(ids)

  with Engine(model, seed=1, decode_fn=decode_fn, **ENGINE_KW) as eng:
    running = eng.submit(_prompt(5, seed=90), SamplingParams(max_tokens=120, stop=("never",)))
    assert entered.wait(300)  # the first of 15 chunks is sampled; the engine waits on us
    assert running.cancel()
    queued = eng.submit(_prompt(5, seed=91), SamplingParams(max_tokens=3))
    assert queued.cancel()
    go.set()
    after = eng.generate(_prompt(6, seed=92), SamplingParams(max_tokens=3), timeout=300)
    stats = eng.stats()
  assert len(after.token_ids) == 3
  assert stats["cancelled"] == 2 and stats["failed"] == 0
  assert stats["decoded_tokens"] == 2 * ENGINE_KW["decode_chunk"] + 3


def test_malformed_prompt_ids_are_refused_with_a_clear_error(engine):
  for bad, match in (([], "non-empty"), ([[1, 2]], "1-D"), (["a"], "integer"),
                     ([1, VOCAB], "outside")):
    with pytest.raises(errors.ConfigError, match=match):
      engine.submit(bad)


@pytest.mark.parametrize("window, calls", [(0.9, 1), (0.0, 2)])
def test_requests_arriving_together_join_one_decode_batch(model, window, calls):
  """A request that arrives within ``join_window_s`` of the previous admission joins it before
  the first decode chunk (one chunk serves both); with no window the first request decodes a
  chunk alone, and the second needs a chunk of its own."""
  params = SamplingParams(max_tokens=ENGINE_KW["decode_chunk"])
  with Engine(model, seed=1, join_window_s=window, **ENGINE_KW) as eng:
    first = eng.submit(_prompt(7, seed=100), params)
    if not window:
      first.result(timeout=300)
    else:
      threading.Event().wait(0.05)
    second = eng.submit(_prompt(8, seed=101), params)
    assert len(first.result(timeout=300).token_ids) == len(second.result(timeout=300).token_ids)
    assert eng.stats()["decode_calls"] == calls


def test_join_window_is_validated(model):
  with pytest.raises(errors.ConfigError, match="join_window_s"):
    Engine(model, join_window_s=-1, **ENGINE_KW)


def test_a_request_submitted_after_the_join_window_waits_for_the_next_chunk(model):
  """Only requests submitted within join_window_s of the last admission join before decoding:
  one that arrives during a slow prefill, after the window, leaves the live row to decode its
  chunk first (a stream of arrivals cannot hold live rows back)."""
  params = SamplingParams(max_tokens=ENGINE_KW["decode_chunk"])
  with Engine(model, seed=1, join_window_s=0.05, **ENGINE_KW) as eng:
    started = threading.Event()
    original = eng._scheduler._run_prefill  # noqa: SLF001 -- a slow prefill, as a long prompt on CPU

    def slow_prefill():
      started.set()
      threading.Event().wait(0.6)
      original()

    eng._scheduler._run_prefill = slow_prefill  # noqa: SLF001
    first = eng.submit(_prompt(7, seed=110), params)
    assert started.wait(300)
    threading.Event().wait(0.2)  # past the window, while the first prompt is still prefilling
    second = eng.submit(_prompt(8, seed=111), params)
    first.result(timeout=300)
    second.result(timeout=300)
    assert eng.stats()["decode_calls"] == 2


def test_fused_projections_are_refused_on_a_mesh(model):
  from legorl_jax.sharding.mesh import make_mesh  # 8 host devices (tests/conftest.py)
  sharded = create_model("tiny", seed=0, mesh=make_mesh(data=1, fsdp=4, tensor=2))
  with pytest.raises(errors.ConfigError, match="fuse_projections.*one device"):
    Engine(sharded, fuse_projections=True, **ENGINE_KW)
  Engine(model, fuse_projections=True, **ENGINE_KW)  # one device: allowed
