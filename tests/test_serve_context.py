"""``serve`` takes the model's context: --max_len follows max_position_embeddings, capped by
--kv_cache_gb; an over-long request's error names its length, the limit and the flag."""

import dataclasses

import pytest

from legorl_jax import errors
from legorl_jax.models.config import get_preset
from legorl_jax.sampling.cache import SCRATCH
from legorl_jax.serve import _parser, build_server, choose_context


def test_context_follows_the_model_capped_by_the_kv_budget():
  cfg = dataclasses.replace(get_preset("tiny"), max_position_embeddings=32768)
  per_pos = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # fp32 K and V
  assert choose_context(cfg, 8, None, 100.0) == 32768  # the budget holds it all
  gb = 8 * per_pos * (5000 + SCRATCH) / (1 << 30)
  assert choose_context(cfg, 8, None, gb) == 5000  # 8 rows of 5000 positions fill the budget
  assert choose_context(cfg, 8, 4096, 0.001) == 4096  # an explicit --max_len wins
  assert choose_context(cfg, 8, 10 ** 6, 1.0) == 32768  # never past the model's
  with pytest.raises(errors.ConfigError, match="--kv_cache_gb"):
    choose_context(cfg, 8, None, 1e-9)


def test_over_long_request_error_names_length_limit_and_flag(capsys):
  args = _parser().parse_args(["--model=tiny", "--max_batch=2", "--kv_cache_gb=0.002"])
  engine, server = build_server(args)
  log = capsys.readouterr().err
  ctx = engine.max_len
  assert ctx < engine.config.max_position_embeddings  # the budget capped it
  assert f"context: {ctx} tokens" in log and "KV cache 2 rows" in log
  with pytest.raises(errors.ProxyError) as e:
    server.service.sampling_params(None, prompt_len=ctx + 50)
  msg = str(e.value)
  assert f"{ctx + 50} tokens" in msg and f"{ctx - 1} maximum" in msg
  assert "--max_len" in msg and "--kv_cache_gb" in msg and e.value.status == 400
