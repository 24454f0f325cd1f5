"""Attention windows that follow the fill (``sampling.buckets.fill``) and the engine's use of
them: a call attends over the smallest window covering its rows, at most one step above."""

import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.sampling import Engine, SamplingParams
from legorl_jax.sampling.buckets import bucket, fill


def test_fill_windows_stay_within_a_step_of_any_fill():
  windows = fill(128, 1024)
  assert windows == (128, 256, 384, 512, 640, 768, 896, 1024)
  for need in range(1, 1025):  # the slack above the fill, for every fill a call can have
    assert 0 <= bucket(windows, need) - need < 128


@pytest.mark.parametrize("hi", [4096, 32768, 5000])
def test_fill_past_eight_steps_wastes_at_most_an_eighth(hi):
  windows = fill(128, hi)
  assert list(windows) == sorted(set(windows)) and windows[-1] == hi
  assert windows[:8] == tuple(range(128, 1025, 128))
  for need in range(1025, hi + 1, 7):
    w = bucket(windows, need)
    assert need <= w and w - need < max(128, need / 8)
  if hi == 32768:  # eight per doubling: 1k..32k holds five doublings
    assert len(windows) == 8 + 8 * 5


def test_fill_bad_step_is_a_config_error():
  with pytest.raises(errors.ConfigError, match="step=0"):
    fill(0, 1024)


def test_engine_attends_over_the_filled_window_not_a_power_of_two():
  model = create_model("tiny", seed=0)
  engine = Engine(model, max_batch=2, max_len=512, prefill_chunk=32, prefill_rows=(1,),
                  decode_rows=(2,), decode_chunk=8, attn_step=64)
  assert engine.attn_buckets == (64, 128, 192, 256, 320, 384, 448, 512)
  windows = []
  device_decode = engine._device.decode

  def spy(rows, num_rows, attn, num_steps, **kw):
    windows.append((int(np.max(rows.positions)), attn))
    return device_decode(rows, num_rows, attn, num_steps, **kw)

  engine._device.decode = spy
  prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, 300).tolist()
  with engine:
    out = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=40))
  assert len(out.token_ids) == 40
  # Every chunk's window is the smallest multiple of 64 past its last position (a power-of-two
  # window would be 512 throughout).
  assert windows and all(attn == bucket(engine.attn_buckets, last + 8) for last, attn in windows)
  assert {attn for _, attn in windows} == {320, 384}
