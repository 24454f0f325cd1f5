"""Hugging Face ``config.json`` <-> ``ModelConfig``.

Reads both config layouts in the wild: transformers 4.x (top-level ``rope_theta`` and
``rope_scaling``) and 5.x (``rope_parameters = {"rope_type", "rope_theta", ...}``). Anything the
decoder cannot reproduce exactly (other RoPE types, sliding windows, MLP / output-projection
biases, other activations) is rejected up front rather than loaded into a model that computes
something else.
"""

from __future__ import annotations

from typing import Any

from legorl_jax import errors
from legorl_jax.models.config import ModelConfig

# model_type -> the transformers class whose checkpoints we read and write.
ARCHITECTURE_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_CLASS_TO_TYPE = {v: k for k, v in ARCHITECTURE_CLASSES.items()}
# transformers' per-class defaults for fields a config.json may omit.
_DEFAULT_MAX_POS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768, "qwen3_moe": 32768}
_QK_NORM = ("qwen3", "qwen3_moe")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


def _supported() -> str:
  return ", ".join(f"{t} ({c})" for t, c in ARCHITECTURE_CLASSES.items())


def _unsupported(what: str, found: Any, source: str) -> errors.UnsupportedArchitectureError:
  return errors.UnsupportedArchitectureError(
      f"{source}: {what} is not supported (found {found!r}). Supported: decoder-only "
      f"{_supported()} with SiLU MLPs, full causal attention, RoPE types "
      f"{SUPPORTED_ROPE_TYPES}, no MLP or output-projection bias.")


def architecture_of(hf: dict, source: str = "config.json") -> str:
  """The model_type (llama / qwen2 / qwen3 / qwen3_moe) of an HF config dict."""
  model_type = hf.get("model_type")
  classes = hf.get("architectures") or []
  if model_type is None:
    known = [_CLASS_TO_TYPE[c] for c in classes if c in _CLASS_TO_TYPE]
    if not known:
      raise _unsupported("a config without a known model_type/architectures",
                         {"model_type": None, "architectures": classes}, source)
    model_type = known[0]
  if model_type not in ARCHITECTURE_CLASSES:
    raise _unsupported(f"model_type {model_type!r}",
                       {"model_type": model_type, "architectures": classes}, source)
  foreign = [c for c in classes if c != ARCHITECTURE_CLASSES[model_type]]
  if classes and foreign:
    raise _unsupported(f"head class {foreign[0]!r} (only causal-LM checkpoints load)",
                       {"model_type": model_type, "architectures": classes}, source)
  return model_type


def _rope(hf: dict, source: str) -> tuple[float, dict | None]:
  """(rope_theta, llama3 scaling dict or None) from either config layout."""
  params = hf.get("rope_parameters")
  if isinstance(params, dict) and params and not any(isinstance(v, dict) for v in params.values()):
    scaling, theta = params, params.get("rope_theta", hf.get("rope_theta"))
  elif isinstance(params, dict) and params:
    raise _unsupported("per-layer-type rope_parameters", params, source)
  else:
    scaling, theta = hf.get("rope_scaling"), hf.get("rope_theta")
  theta = 10_000.0 if theta is None else float(theta)
  if not scaling:
    return theta, None
  rope_type = scaling.get("rope_type", scaling.get("type", "default"))
  if rope_type == "default":
    return theta, None
  if rope_type != "llama3":
    raise _unsupported(f"rope_type {rope_type!r}", scaling, source)
  missing = [k for k in _LLAMA3_KEYS if scaling.get(k) is None]
  if missing:
    raise errors.CheckpointError(
        f"{source}: llama3 RoPE scaling is missing {missing}; it needs {list(_LLAMA3_KEYS)}.")
  out = {k: float(scaling[k]) for k in _LLAMA3_KEYS}
  out["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
  return theta, out


def _first_id(value):
  """Token ids may be lists (several EOS ids); the decoder config keeps the first."""
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else None
  return None if value is None else int(value)


def config_from_hf(hf: dict, *, source: str = "config.json", **overrides) -> ModelConfig:
  """Maps an HF config dict to a ModelConfig; ``overrides`` set ModelConfig fields (dtype...)."""
  arch = architecture_of(hf, source)

  def need(key):
    if hf.get(key) is None:
      raise errors.CheckpointError(f"{source}: required field {key!r} is missing.")
    return int(hf[key])

  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise _unsupported("hidden_act", act, source)
  if hf.get("mlp_bias"):
    raise _unsupported("mlp_bias=True", True, source)
  if arch in ("llama", *_QK_NORM) and hf.get("attention_bias"):
    raise _unsupported(f"attention_bias=True for {arch} (adds an o_proj bias)", True, source)
  if hf.get("use_sliding_window"):
    raise _unsupported("use_sliding_window=True", hf.get("sliding_window"), source)
  layer_types = [t for t in (hf.get("layer_types") or []) if t != "full_attention"]
  if layer_types:
    raise _unsupported("layer_types other than 'full_attention'", sorted(set(layer_types)),
                       source)
  theta, scaling = _rope(hf, source)
  hidden, heads = need("hidden_size"), need("num_attention_heads")
  fields = dict(
      architecture=arch,
      vocab_size=need("vocab_size"),
      hidden_size=hidden,
      intermediate_size=need("intermediate_size"),
      num_layers=need("num_hidden_layers"),
      num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=int(hf.get("head_dim") or hidden // heads),
      rope_theta=theta,
      rope_scaling=scaling,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=arch == "qwen2",
      qk_norm=arch in _QK_NORM,
      max_position_embeddings=int(hf.get("max_position_embeddings") or _DEFAULT_MAX_POS[arch]),
      initializer_range=float(hf.get("initializer_range", 0.02)),
      bos_token_id=_first_id(hf.get("bos_token_id")),
      eos_token_id=_first_id(hf.get("eos_token_id")),
      pad_token_id=_first_id(hf.get("pad_token_id")),
  )
  if arch == "qwen3_moe":
    fields.update(_moe_fields(hf, need, source))
  fields.update(overrides)
  try:
    return ModelConfig(**fields)
  except errors.ConfigError as e:
    raise errors.CheckpointError(f"{source}: {e}") from e


def _moe_fields(hf: dict, need, source: str) -> dict:
  """The mixture-of-experts fields of a qwen3_moe config (transformers 4.x ``num_experts`` or
  5.x ``num_local_experts``)."""
  experts = hf.get("num_experts", hf.get("num_local_experts"))
  if not experts:
    raise errors.CheckpointError(f"{source}: a qwen3_moe config needs num_experts (or "
                                 f"num_local_experts) > 0, found {experts!r}.")
  return dict(
      num_experts=int(experts),
      num_experts_per_tok=need("num_experts_per_tok"),
      moe_intermediate_size=need("moe_intermediate_size"),
      norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
      decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
      mlp_only_layers=tuple(int(i) for i in (hf.get("mlp_only_layers") or ())),
  )


def _torch_dtype_name(dtype: str) -> str:
  return {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(dtype, dtype)


def config_to_hf(config: ModelConfig) -> dict:
  """The config.json that transformers 4.x and 5.x both read as this architecture."""
  c = config
  arch = c.architecture
  if c.qkv_bias != (arch == "qwen2"):
    raise _unsupported(f"{arch} with qkv_bias={c.qkv_bias}", c.qkv_bias, "save_pretrained")
  if c.qk_norm != (arch in _QK_NORM):
    raise _unsupported(f"{arch} with qk_norm={c.qk_norm}", c.qk_norm, "save_pretrained")
  rope_params = {"rope_type": "default", "rope_theta": c.rope_theta}
  rope_scaling = None
  if c.rope_scaling:
    rope_scaling = {"rope_type": "llama3", **dict(c.rope_scaling)}
    rope_params = {**rope_scaling, "rope_theta": c.rope_theta}
  hf = {
      "architectures": [ARCHITECTURE_CLASSES[arch]],
      "model_type": arch,
      "vocab_size": c.vocab_size,
      "hidden_size": c.hidden_size,
      "intermediate_size": c.intermediate_size,
      "num_hidden_layers": c.num_layers,
      "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.num_kv_heads,
      "head_dim": c.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": c.max_position_embeddings,
      "initializer_range": c.initializer_range,
      "rms_norm_eps": c.rms_norm_eps,
      "tie_word_embeddings": c.tie_word_embeddings,
      # Both RoPE layouts: transformers 4.x reads the first two, 5.x the third.
      "rope_theta": c.rope_theta,
      "rope_scaling": rope_scaling,
      "rope_parameters": rope_params,
      "attention_dropout": 0.0,
      "use_cache": True,
      "bos_token_id": c.bos_token_id,
      "eos_token_id": c.eos_token_id,
      "pad_token_id": c.pad_token_id,
      "dtype": _torch_dtype_name(c.param_dtype),  # transformers 5.x name
      "torch_dtype": _torch_dtype_name(c.param_dtype),  # transformers 4.x name
  }
  if arch == "llama":
    hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
  elif arch in _QK_NORM:
    hf.update(attention_bias=False, use_sliding_window=False, sliding_window=None)
  if arch == "qwen3_moe":
    hf.update(num_experts=c.num_experts, num_local_experts=c.num_experts,
              num_experts_per_tok=c.num_experts_per_tok,
              moe_intermediate_size=c.moe_intermediate_size, norm_topk_prob=c.norm_topk_prob,
              decoder_sparse_step=c.decoder_sparse_step, mlp_only_layers=list(c.mlp_only_layers),
              output_router_logits=False, router_aux_loss_coef=c.router_aux_loss_coef)
  else:
    hf.update(use_sliding_window=False, sliding_window=None)
  return hf


def generation_config_to_hf(config: ModelConfig) -> dict | None:
  """generation_config.json contents, or None when the config names no special tokens."""
  ids = {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
  ids = {k: v for k, v in ids.items() if v is not None}
  return ids or None
