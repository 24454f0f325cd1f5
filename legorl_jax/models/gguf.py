"""GGUF import: a llama.cpp model file -> Decoder (and tokenizer), with numpy only.

A GGUF file holds key/value metadata (architecture, shapes, tokenizer) and tensors named
``token_embd``, ``blk.N.attn_q`` ... in quantized blocks. ``from_gguf`` reads it with the
``gguf`` package's reader (memory-mapped), dequantizes one tensor at a time to float32
(``gguf_quants``), maps names and layouts to the HF ones the rest of the package uses, and
places each parameter straight into its sharding. ``convert_gguf`` writes the result once as
a Hugging Face directory, so every entry point (train, eval, serve, export) takes the same
thing and plain ``transformers`` loads it without GGUF support.

Layout facts this relies on:
- GGUF dims are listed fastest-first; the reader's numpy arrays are the reverse, which for a
  linear weight is HF's ``[out_features, in_features]``.
- llama.cpp's converter permutes the rows of the llama ``attn_q`` / ``attn_k`` weights (per
  head, from HF's half-split RoPE order to interleaved pairs): rows of head ``h`` are stored
  as ``reshape(n_head, 2, head_dim // 2, in).swapaxes(1, 2)``. The import undoes this for
  ``llama`` (with the KV head count for ``attn_k``); qwen2 / qwen3 files are not permuted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from legorl_jax import errors
from legorl_jax.models import gguf_quants, gguf_tokenizer, hf_io, loading
from legorl_jax.models.config import ModelConfig
from legorl_jax.models.decoder import Decoder
from legorl_jax.models.gguf_file import GGUFFile, open_gguf, special_token_ids
from legorl_jax.sharding import rules as sharding_rules
from legorl_jax.utils import safe_json

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# GGUF tensor name (per block: "blk.{i}." prefix) -> HF name (per layer: "model.layers.{i}.").
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _unsupported_arch(file: GGUFFile, what: str) -> errors.UnsupportedArchitectureError:
  return errors.UnsupportedArchitectureError(
      f"{file.path.name}: {what}. Supported GGUF architectures: {', '.join(ARCHITECTURES)} "
      "(dense decoders with SiLU MLPs, plain RoPE, full causal attention).")


def _scalar(file: GGUFFile, key: str, default=None, *, required=False):
  value = file.meta.get(key, default)
  if isinstance(value, list):  # Per-layer arrays (e.g. head_count): must be uniform here.
    if len(set(value)) != 1:
      raise _unsupported_arch(file, f"per-layer {key} = {value[:8]}... varies across blocks")
    value = value[0]
  if value is None and required:
    raise errors.CheckpointError(f"{file.path.name}: metadata key {key!r} is missing; the file "
                                 "does not describe a complete model.")
  return value


def _f32(value) -> float:
  """The shortest decimal that rounds to the same float32: metadata stored as float32 (e.g.
  9.99999975e-06) reads back as the value it was written from (1e-05)."""
  return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def config_from_gguf(path: str | os.PathLike | GGUFFile, **overrides) -> ModelConfig:
  """The ModelConfig described by a GGUF file's metadata (and which tensors it has)."""
  file = open_gguf(path)
  arch = file.architecture
  if arch not in ARCHITECTURES:
    raise _unsupported_arch(file, f"GGUF architecture {arch!r} is not supported")
  names = {t.name for t in file.reader.tensors}
  if "rope_freqs.weight" in names:
    raise _unsupported_arch(file, "it carries rope_freqs.weight (Llama 3.1-style RoPE frequency "
                                  "factors), which the GGUF import does not map")
  scaling = file.meta.get(f"{arch}.rope.scaling.type")
  if scaling not in (None, "none"):
    raise _unsupported_arch(file, f"{arch}.rope.scaling.type = {scaling!r}")
  if file.meta.get(f"{arch}.expert_count"):
    raise _unsupported_arch(file, "it is a mixture-of-experts model")

  def get(key, default=None, required=False):
    return _scalar(file, f"{arch}.{key}", default, required=required)

  hidden = int(get("embedding_length", required=True))
  heads = int(get("attention.head_count", required=True))
  kv_heads = int(get("attention.head_count_kv", heads))
  head_dim = int(get("attention.key_length", 0) or get("rope.dimension_count", 0)
                 or hidden // heads)
  value_dim = int(get("attention.value_length", head_dim))
  rope_dim = int(get("rope.dimension_count", head_dim))
  if value_dim != head_dim or rope_dim != head_dim:
    raise _unsupported_arch(file, f"key_length {head_dim}, value_length {value_dim} and "
                                  f"rope.dimension_count {rope_dim} differ (partial RoPE or "
                                  "unequal head sizes)")
  tokens = file.meta.get("tokenizer.ggml.tokens")
  embd = next((t for t in file.reader.tensors if t.name == "token_embd.weight"), None)
  vocab = int(embd.shape[1]) if embd is not None else int(
      get("vocab_size", 0) or len(tokens or ()))
  if not vocab:
    raise errors.CheckpointError(f"{file.path.name}: no token_embd.weight tensor and no vocab.")
  eps = _f32(get("attention.layer_norm_rms_epsilon", 1e-5 if arch == "llama" else 1e-6))
  ids = special_token_ids(file)
  fields = dict(
      architecture=arch, vocab_size=vocab, hidden_size=hidden,
      intermediate_size=int(get("feed_forward_length", required=True)),
      num_layers=int(get("block_count", required=True)), num_heads=heads, num_kv_heads=kv_heads,
      head_dim=head_dim, rope_theta=_f32(get("rope.freq_base", 10_000.0)),
      rms_norm_eps=eps, tie_word_embeddings="output.weight" not in names,
      qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3",
      max_position_embeddings=int(get("context_length", 4096)),
      bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
  fields.update(overrides)
  try:
    return ModelConfig(**fields)
  except errors.ConfigError as e:
    raise errors.CheckpointError(f"{file.path.name}: {e}") from e


def hf_names(file: GGUFFile) -> dict[str, Any]:
  """HF tensor name -> the GGUF ReaderTensor holding it; unknown tensors raise."""
  out, unknown = {}, []
  for t in file.reader.tensors:
    name = _GLOBAL_NAMES.get(t.name)
    if name is None and t.name.startswith("blk."):
      _, idx, rest = t.name.split(".", 2)
      if idx.isdigit() and rest in _BLOCK_NAMES:
        name = f"model.layers.{int(idx)}.{_BLOCK_NAMES[rest]}"
    if name is None:
      unknown.append(t.name)
    else:
      out[name] = t
  if unknown:
    raise _unsupported_arch(
        file, f"tensors {unknown[:5]}{' ...' if len(unknown) > 5 else ''} have no place in a "
              f"{file.architecture} decoder")
  return out


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's per-head q/k row permutation: ``[n_head*hd, in]`` interleaved RoPE
  pairs -> HF's half-split order."""
  rows = w.shape[0]
  return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_tensor(file: GGUFFile, tensor, config: ModelConfig) -> np.ndarray:
  """One GGUF tensor as float32 in HF layout (dequantized, llama q/k rows un-permuted)."""
  shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
  w = gguf_quants.dequantize(tensor.data, tensor.tensor_type, shape, tensor.name)
  if config.architecture == "llama" and tensor.name.endswith((".attn_q.weight", ".attn_k.weight")):
    w = _unpermute(w, config.num_heads if ".attn_q." in tensor.name else config.num_kv_heads)
  return w


def from_gguf(path: str | os.PathLike | GGUFFile, dtype=jnp.float32, mesh: Mesh | None = None,
              *, compute_dtype=None, rules=sharding_rules.DEFAULT_RULES,
              **config_overrides) -> Decoder:
  """Loads a llama / qwen2 / qwen3 GGUF file as a Decoder.

  Args:
    path: a .gguf file (or an open GGUFFile).
    dtype: parameter dtype; weights are dequantized to float32 and cast on the host.
    mesh: if given, each parameter lands directly in its logical-axis NamedSharding.
    compute_dtype: matmul dtype (default: ``dtype``).
    rules: logical-axis sharding rules.
    **config_overrides: extra ModelConfig fields, e.g. ``remat=True``.
  Returns:
    A Decoder; ``model(input_ids int32 [B, T])`` -> float32 logits ``[B, T, V]``.
  """
  file = open_gguf(path)
  config = config_from_gguf(file, **loading.dtype_overrides(dtype, compute_dtype),
                            **config_overrides)
  tensors = hf_names(file)
  slots = loading.ParamSlots(config, mesh, rules)
  wanted = {hf_io.hf_name(p)[0] for p, _ in slots.flat}
  extra = sorted(n for n in tensors if n not in wanted)
  if extra:
    raise _unsupported_arch(file, f"tensors {[tensors[n].name for n in extra[:5]]} do not fit "
                                  f"a {config.architecture} decoder (qkv_bias={config.qkv_bias}, "
                                  f"qk_norm={config.qk_norm})")
  np_dtype = np.dtype(jnp.dtype(config.param_dtype))
  values = {}
  for p, var in slots.flat:
    name, transposed = hf_io.hf_name(p)
    if name not in tensors:
      raise errors.CheckpointError(
          f"{file.path.name}: no GGUF tensor for {name} ({'.'.join(map(str, p))}); a "
          f"{config.architecture} file with this metadata needs it.")
    w = read_tensor(file, tensors[name], config)
    shape = tuple(var.shape)
    if (w.shape[::-1] if transposed else w.shape) != shape:
      raise errors.CheckpointError(
          f"{file.path.name}: tensor {tensors[name].name} has shape {w.shape}, but the "
          f"metadata implies {shape[::-1] if transposed else shape}.")
    w = np.ascontiguousarray((w.T if transposed else w).astype(np_dtype, copy=False))
    values[p] = slots.place(p, shape, lambda idx, w=w: w[idx])
  return slots.model(values)


def _portable_tokenizer_config(file: Path):
  """Names the generic fast-tokenizer class, which transformers 4.x and 5.x both load (5.x
  writes its own class name, ``TokenizersBackend``, unknown to 4.x)."""
  with open(file, "rb") as f:
    cfg = safe_json.load(f, what=str(file))
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
  with open(file, "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)


def convert_gguf(path: str | os.PathLike, out: str | os.PathLike, *, dtype="float32",
                 overwrite: bool = False) -> Path:
  """Writes a GGUF file as a Hugging Face directory (config, safetensors, tokenizer with the
  project's ChatML tool template), atomically: into a temp dir next to ``out``, then renamed.

  Returns:
    ``out``, which ``transformers.AutoModelForCausalLM`` and ``models.from_pretrained`` load.
  """
  out = Path(out).expanduser()
  if jax.process_count() > 1:  # save_pretrained writes on process 0 only
    raise errors.CheckpointError(
        f"converting {Path(str(getattr(path, 'path', path))).name} in a {jax.process_count()}-"
        "process run; convert it once with `python -m experiments.import_model --gguf=FILE "
        "--out=DIR` and pass --config.model.checkpoint=DIR on every host.")
  if out.exists() and any(out.iterdir()) and not overwrite:
    raise errors.CheckpointError(f"{out} exists and is not empty; choose another output "
                                 "directory or pass overwrite=True (--overwrite).")
  file = open_gguf(path)
  model = from_gguf(file, dtype=jnp.float32)
  tokenizer = gguf_tokenizer.tokenizer_from_gguf(file)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
  try:
    hf_io.save_pretrained(model, tmp, tokenizer=tokenizer, dtype=dtype)
    _portable_tokenizer_config(tmp / "tokenizer_config.json")
    with open(tmp / "legorl_import.json", "w") as f:
      json.dump({"source": file.path.name, "architecture": file.architecture,
                 "general.name": file.meta.get("general.name"),
                 "tensor_types": file.tensor_types()}, f, indent=2, sort_keys=True)
    umask = os.umask(0)
    os.umask(umask)
    for p in tmp.iterdir():  # mkdtemp made the directory private; use the usual modes
      os.chmod(p, 0o666 & ~umask)
    os.chmod(tmp, 0o777 & ~umask)
    if out.exists():
      shutil.rmtree(out)
    os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out
