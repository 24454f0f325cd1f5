"""Flax NNX policy models, presets, HF checkpoint I/O and tokenizers."""

from legorl_jax.models.build import abstract_model, create_model, shard_model
from legorl_jax.models.config import PRESETS, ModelConfig, get_preset
from legorl_jax.models.decoder import Decoder, KVCache
from legorl_jax.models.gguf import convert_gguf, from_gguf
from legorl_jax.models.hf_io import from_pretrained, save_pretrained
