"""legorl_jax.sampling: jitted prefill/decode with a KV cache and a continuous-batching engine."""

from legorl_jax.sampling.engine import Engine
from legorl_jax.sampling.params import Completion, SamplingParams
from legorl_jax.sampling.sample import sample_tokens, truncation_mask
from legorl_jax.sampling.steps import COMPILATIONS, DecodeRows, decode_steps, prefill

__all__ = ["COMPILATIONS", "Completion", "DecodeRows", "Engine", "SamplingParams", "decode_steps",
           "prefill", "sample_tokens", "truncation_mask"]
