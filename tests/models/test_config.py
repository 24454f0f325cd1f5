"""ModelConfig validation, presets and hashing."""

import jax.numpy as jnp
import pytest
from flax import nnx

from legorl_jax import errors
from legorl_jax.models import PRESETS, ModelConfig, abstract_model, get_preset


@pytest.mark.parametrize("overrides,pattern", [
    (dict(architecture="mistral"), r"architecture='mistral'.*llama"),
    (dict(vocab_size=0), "vocab_size must be positive"),
    (dict(num_layers=-1), "num_layers must be positive"),
    (dict(head_dim=0), "head_dim must be positive"),
    (dict(num_heads=6, num_kv_heads=4), "multiple of model.num_kv_heads"),
    (dict(dtype="float33"), "model.dtype='float33' is not a dtype"),
    (dict(param_dtype="nope"), "param_dtype"),
])
def test_validation_errors(overrides, pattern):
  with pytest.raises(errors.ConfigError, match=pattern):
    ModelConfig(**overrides)


def test_config_error_is_value_error():
  with pytest.raises(ValueError):
    ModelConfig(hidden_size=0)


def test_get_preset_and_overrides():
  tiny = get_preset("TINY", num_layers=2)
  assert tiny.num_layers == 2 and tiny.hidden_size == PRESETS["tiny"].hidden_size
  assert PRESETS["tiny"].num_layers == 4  # presets are not mutated
  with pytest.raises(errors.ConfigError, match=r"Unknown model preset 'gpt5'.*tiny"):
    get_preset("gpt5")
  with pytest.raises(errors.ConfigError, match="positive"):
    get_preset("tiny", num_heads=0)


def test_compute_dtype():
  assert get_preset("tiny").compute_dtype == jnp.float32
  assert get_preset("tiny", dtype="bfloat16").compute_dtype == jnp.bfloat16


def test_configs_and_graphdefs_hash_with_rope_scaling():
  """rope_scaling is a dict; configs must still hash so graphdefs work as static jit args."""
  a = get_preset("llama-3.2-1b")
  b = a.replace(rope_scaling=dict(a.rope_scaling))
  assert a == b and hash(a) == hash(b)
  assert hash(a) != hash(a.replace(rope_scaling=dict(a.rope_scaling, factor=8.0)))
  small = a.replace(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  graphdef, _ = nnx.split(abstract_model(small))
  assert hash(graphdef) == hash(nnx.split(abstract_model(small))[0])
