"""Device steps: a decode chunk against a full forward, the one-row path, and that the compiled
decode loop updates the cache in place (no per-step copy of any layer's cache)."""

import re

import numpy as np
import pytest
from flax import nnx

from legorl_jax.models import create_model
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


@pytest.mark.parametrize("num_rows", [1, 2, ROWS])
def test_decode_loop_updates_cache_in_place(model, num_rows):
  """No op in the compiled decode copies a whole layer's cache window (a copy per step per layer
  once cost more than the model's matmuls)."""
  graphdef, state = nnx.split(model)
  cache = Cache.zeros(model.config, ROWS, MAX_LEN)
  rows = _rows([1] * num_rows, list(range(num_rows)))
  hlo = steps.DECODE.lower(graphdef, state, cache, rows, num_rows=num_rows, attn_len=32,
                           num_steps=STEPS).compile().as_text()
  c = model.config
  n, h, d, s = num_rows, c.num_kv_heads, c.head_dim, 32 + SCRATCH
  shapes = {f"f32[{n},{h},{d},{s}]", f"f32[{n},{h},{s},{d}]",
            f"f32[{h},{d},{s}]", f"f32[{h},{s},{d}]"}  # one row carries them squeezed
  copies = [line for line in hlo.splitlines()
            if re.search(r"= (\S+)\{[0-9,]*\} copy\(", line)
            and re.search(r"= (\S+)\{", line).group(1) in shapes]
  assert not copies, copies[:3]
