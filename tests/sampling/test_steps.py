"""Device steps: a decode chunk against a full forward, the one-row path, that the compiled
decode loop updates the cache in place (no per-step copy of any layer's cache), and that a
donated window buffer changes nothing but where the window lives."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from legorl_jax.models import create_model
from legorl_jax.sampling import fused as fused_lib
from legorl_jax.sampling import steps
from legorl_jax.sampling.cache import SCRATCH, Cache
from tests.sampling import reference

MAX_LEN, ROWS, STEPS = 64, 4, 6


@pytest.fixture(scope="module")
def model():
  return create_model("tiny", seed=0)


def _rows(tokens, positions, n_stop=2):
  n = len(tokens)
  return steps.DecodeRows(
      tokens=np.asarray(tokens, np.int32), positions=np.asarray(positions, np.int32),
      remaining=np.full(n, 1000, np.int32), temperature=np.zeros(n, np.float32),
      top_p=np.ones(n, np.float32), top_k=np.zeros(n, np.int32), seeds=np.zeros(n, np.uint32),
      stop_ids=np.full((n, n_stop), -1, np.int32))


def _prefilled(model, prompts):
  """A cache holding every prompt but its last token (the engine's protocol), row i = prompt i."""
  graphdef, state = nnx.split(model)
  cache = Cache.zeros(model.config, ROWS, MAX_LEN)
  t = max(len(p) for p in prompts)
  ids = np.zeros((ROWS, t), np.int32)
  pos = np.full((ROWS, t), -1, np.int32)
  for i, p in enumerate(prompts):
    ids[i, :len(p) - 1] = p[:-1]
    pos[i, :len(p) - 1] = np.arange(len(p) - 1)
  cache = steps.PREFILL(graphdef, state, cache, np.arange(ROWS, dtype=np.int32), ids, pos,
                        attn_len=MAX_LEN)
  return graphdef, state, cache


@pytest.mark.parametrize("num_rows", [1, ROWS])
def test_greedy_decode_matches_full_forward(model, num_rows):
  """Each greedy token and its logprob equal a fresh full forward over prompt + tokens so far."""
  rng = np.random.default_rng(num_rows)
  prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (7, 3, 12, 5)]
  graphdef, state, cache = _prefilled(model, prompts)
  live = prompts[:num_rows]
  rows = _rows([p[-1] for p in live], [len(p) - 1 for p in live])
  cache, rows, out_ids, out_logp = steps.DECODE(
      graphdef, state, cache, rows, num_rows=num_rows, attn_len=32, num_steps=STEPS)
  out_ids, out_logp = np.asarray(out_ids), np.asarray(out_logp)
  assert out_ids.shape == (STEPS, num_rows)
  for i, p in enumerate(live):
    seq = p + out_ids[:, i].tolist()
    logits = np.asarray(model(np.asarray([seq], np.int32)))[0]
    for j in range(STEPS):
      row = logits[len(p) - 1 + j]
      assert out_ids[j, i] == int(np.argmax(row))
      assert abs(out_logp[j, i] - reference.log_softmax(row)[out_ids[j, i]]) < 1e-5
  # Rows outside the decode window kept their prefilled K/V: decoding them now still matches.
  if num_rows == 1:
    p = prompts[1]
    rows = _rows([p[-1]] * ROWS, [-1, len(p) - 1, -1, -1])
    _, _, ids, _ = steps.DECODE(graphdef, state, cache, rows, num_rows=ROWS, attn_len=32,
                                num_steps=1)
    want = np.argmax(np.asarray(model(np.asarray([p], np.int32)))[0, -1])
    assert int(np.asarray(ids)[0, 1]) == want


def _buffer(shapes, fill=7.0):
  """A window buffer holding junk: its old content must not leak into the window."""
  return jax.tree.map(lambda x: jnp.full(x.shape, fill, x.dtype), shapes)


@pytest.mark.parametrize("num_rows", [1, ROWS])
def test_window_buffer_gives_the_same_tokens_and_cache(model, num_rows):
  """Decode and prefill built in a donated buffer (the engine's CPU path) return the same ids,
  logprobs and cache as without one; the buffer is consumed and the window handed back."""
  rng = np.random.default_rng(10 + num_rows)
  prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (9, 4, 13, 6)]
  live = prompts[:num_rows]
  outs = []
  for use in (False, True):
    graphdef, state, cache = _prefilled(model, prompts)
    extra = {}
    if use:  # a chunk of the next turn prefilled into rows 0 and 2 through a buffer
      shapes = steps.window_shapes(cache, 2, 32)
      buf = _buffer(shapes)
      cache, win = steps.PREFILL(graphdef, state, cache, np.array([0, 2], np.int32),
                                 np.array([[5, 6], [7, 8]], np.int32),
                                 np.array([[20, 21], [22, -1]], np.int32), attn_len=32,
                                 window_buffer=buf)
      assert buf.k[0].is_deleted()
      assert win.k[0].shape == shapes.k[0].shape
      extra["window_buffer"] = _buffer(steps.decode_window_shapes(cache, num_rows, 32))
    else:
      cache = steps.PREFILL(graphdef, state, cache, np.array([0, 2], np.int32),
                            np.array([[5, 6], [7, 8]], np.int32),
                            np.array([[20, 21], [22, -1]], np.int32), attn_len=32)
    rows = _rows([p[-1] for p in live], [len(p) - 1 for p in live])
    out = steps.DECODE(graphdef, state, cache, rows, num_rows=num_rows, attn_len=32,
                       num_steps=STEPS, **extra)
    assert len(out) == (5 if use else 4)
    if use:
      assert extra["window_buffer"].k[0].is_deleted()
    outs.append(jax.device_get(out[:4]))
  (cache_a, rows_a, ids_a, logp_a), (cache_b, rows_b, ids_b, logp_b) = outs
  np.testing.assert_array_equal(ids_a, ids_b)
  np.testing.assert_array_equal(logp_a, logp_b)
  for a, b in zip(cache_a.k + cache_a.v, cache_b.k + cache_b.v):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("num_rows", [1, 2, ROWS])
@pytest.mark.parametrize("buffered,fused", [(False, False), (True, False), (True, True)])
def test_decode_loop_updates_cache_in_place(model, num_rows, buffered, fused):
  """No op in the compiled decode copies a whole layer's cache window (a copy per step per layer
  once cost more than the model's matmuls), with or without a window buffer, with the engine's
  fused projections too."""
  graphdef, state = nnx.split(model)
  cache = Cache.zeros(model.config, ROWS, MAX_LEN)
  rows = _rows([1] * num_rows, list(range(num_rows)))
  extra = {}
  if buffered:
    extra["window_buffer"] = steps.decode_window_shapes(cache, num_rows, 32)
  if fused:
    extra["fused"] = fused_lib.FUSE(graphdef, state)
  hlo = steps.DECODE.lower(graphdef, state, cache, rows, num_rows=num_rows, attn_len=32,
                           num_steps=STEPS, **extra).compile().as_text()
  c = model.config
  n, h, d, s = num_rows, c.num_kv_heads, c.head_dim, 32 + SCRATCH
  shapes = {f"f32[{n},{h},{d},{s}]", f"f32[{n},{h},{s},{d}]",
            f"f32[{h},{d},{s}]", f"f32[{h},{s},{d}]"}  # one row carries them squeezed
  copies = [line for line in hlo.splitlines()
            if re.search(r"= (\S+)\{[0-9,]*\} copy\(", line)
            and re.search(r"= (\S+)\{", line).group(1) in shapes]
  assert not copies, copies[:3]
