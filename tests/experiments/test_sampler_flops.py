"""The sampler benchmark's FLOPs per decoded token against the config's own parameter count."""

import pytest

from experiments.benchmarks.sampler import decode_token_flops
from legorl_jax.models import PRESETS


@pytest.mark.parametrize("name", ["tiny", "small", "smollm2-135m", "qwen3-0.6b"])
def test_a_token_costs_two_flops_per_matmul_weight(name):
  """At no context a decoded token does one multiply-add per weight of every kernel and of the
  lm head (a tied head is the embedding); the norms are all that ``num_params`` holds beside."""
  cfg = PRESETS[name]
  head_apart = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
  weights = cfg.num_params() - head_apart  # the embedding lookup multiplies nothing
  assert decode_token_flops(cfg, 0) == pytest.approx(2.0 * weights, rel=0.01)
  # Attention adds QK^T and PV per layer, linear in the context.
  grow = decode_token_flops(cfg, 200) - decode_token_flops(cfg, 100)
  assert grow == pytest.approx(100 * 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim)


def test_a_moe_policy_has_no_single_figure():
  assert decode_token_flops(PRESETS["tiny-moe"], 0) is None
