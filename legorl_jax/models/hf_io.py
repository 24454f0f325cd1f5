"""Hugging Face checkpoint I/O: ``from_pretrained`` / ``save_pretrained`` for the Decoder.

Loading never builds a full parameter copy on a device: the model is created abstractly,
each parameter's NamedSharding comes from its ``logical_axes``, and every device shard is read
straight from the (memory-mapped) safetensors file into that device with
``jax.make_array_from_callback`` — each device reads only its own slice, which is also what a
multi-host load needs. HF stores linear weights ``[out, in]``; our kernels are ``[in, out]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from legorl_jax import errors
from legorl_jax.models import hf_config, hf_moe, loading
from legorl_jax.models.config import ModelConfig
from legorl_jax.models.decoder import Decoder
from legorl_jax.sharding import rules as sharding_rules
from legorl_jax.utils import safe_json

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors a checkpoint may carry that the decoder recomputes or does not need.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
# Files that make up a tokenizer directory (copied when save_pretrained gets a path).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                    "chat_template.jinja", "chat_template.json")

_LAYER_NAMES = {
    ("attn_norm", "weight"): ("input_layernorm.weight", False),
    ("mlp_norm", "weight"): ("post_attention_layernorm.weight", False),
    ("attn", "q_kernel"): ("self_attn.q_proj.weight", True),
    ("attn", "k_kernel"): ("self_attn.k_proj.weight", True),
    ("attn", "v_kernel"): ("self_attn.v_proj.weight", True),
    ("attn", "o_kernel"): ("self_attn.o_proj.weight", True),
    ("attn", "q_bias"): ("self_attn.q_proj.bias", False),
    ("attn", "k_bias"): ("self_attn.k_proj.bias", False),
    ("attn", "v_bias"): ("self_attn.v_proj.bias", False),
    ("attn", "q_norm", "weight"): ("self_attn.q_norm.weight", False),
    ("attn", "k_norm", "weight"): ("self_attn.k_norm.weight", False),
    ("mlp", "gate_kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "up_kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "down_kernel"): ("mlp.down_proj.weight", True),
    ("mlp", "router_kernel"): ("mlp.gate.weight", True),
}


def hf_name(path: tuple, prefix: str = "model.") -> tuple[str, bool]:
  """Our parameter path (e.g. ``('layers', 0, 'attn', 'q_kernel')``) -> (HF name, transposed)."""
  if path == ("embed",):
    return f"{prefix}embed_tokens.weight", False
  if path == ("final_norm", "weight"):
    return f"{prefix}norm.weight", False
  if path == ("lm_head",):
    return "lm_head.weight", True
  if len(path) >= 3 and path[0] == "layers" and tuple(path[2:]) in _LAYER_NAMES:
    name, transposed = _LAYER_NAMES[tuple(path[2:])]
    return f"{prefix}layers.{path[1]}.{name}", transposed
  raise errors.CheckpointError(f"Decoder parameter {'.'.join(map(str, path))} has no HF name.")


# -- reading ------------------------------------------------------------------------------------
def _read_json(file: Path, what: str) -> dict:
  try:
    with open(file, "rb") as f:
      return safe_json.load(f, what=str(file))
  except errors.InvalidJSONError as e:
    raise errors.CheckpointError(f"{e}; {what}.") from e


def load_config(path: str | os.PathLike, **overrides) -> ModelConfig:
  """The ModelConfig of a local HF model directory (reads only config.json)."""
  path = Path(path)
  file = path / CONFIG_FILE
  if not path.is_dir():
    raise errors.CheckpointError(f"{path} is not a directory; pass a local HF model directory "
                                 f"holding {CONFIG_FILE} and *.safetensors.")
  if not file.is_file():
    raise errors.CheckpointError(
        f"{file} is missing; a HF model directory needs {CONFIG_FILE} next to its "
        f"*.safetensors weights (found: {sorted(p.name for p in path.iterdir())}).")
  return hf_config.config_from_hf(_read_json(file, "re-export the checkpoint"),
                                  source=str(file), **overrides)


def weight_map(path: str | os.PathLike) -> dict[str, Path]:
  """HF tensor name -> safetensors file, from the index, the single file, or all shards."""
  path = Path(path)
  index = path / INDEX_FILE
  if index.is_file():
    data = _read_json(index, "it must hold a 'weight_map'")
    if not isinstance(data.get("weight_map"), dict):
      raise errors.CheckpointError(f"{index} has no 'weight_map' object.")
    out = {name: path / fname for name, fname in data["weight_map"].items()}
    for file in sorted(set(out.values())):
      if not file.is_file():
        raise errors.CheckpointError(f"{index} lists {file.name}, which is missing from {path}.")
    return out
  files = [path / SINGLE_FILE] if (path / SINGLE_FILE).is_file() else sorted(
      path.glob("*.safetensors"))
  if not files:
    others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    hint = (f" Found {others}: only safetensors are read; convert them with transformers "
            f"(model.save_pretrained(dir, safe_serialization=True)).") if others else ""
    raise errors.CheckpointError(
        f"No weights in {path}: expected {SINGLE_FILE}, {INDEX_FILE} + shards, or "
        f"*.safetensors.{hint}")
  out = {}
  for file in files:
    with safe_open(file, framework="np") as f:
      out.update({name: file for name in f.keys()})
  return out


def _reader(handle, name: str, transposed: bool, dtype):
  """Callback for make_array_from_callback: reads one device's slice in our layout."""
  cache: dict = {}
  tensor = handle.get_slice(name)

  def read(index):
    index = tuple(index)
    key = tuple((s.start, s.stop, s.step) for s in index)
    if key not in cache:
      hf_index = index[::-1] if transposed else index
      block = tensor[hf_index] if hf_index else tensor[:]
      block = np.asarray(block).astype(dtype, copy=False)
      cache[key] = np.ascontiguousarray(block.T if transposed else block)
    return cache[key]

  return read


def from_pretrained(path: str | os.PathLike, dtype=jnp.float32, mesh: Mesh | None = None, *,
                    compute_dtype=None, rules=sharding_rules.DEFAULT_RULES,
                    **config_overrides) -> Decoder:
  """Loads a local HF Llama / Qwen2 / Qwen3 directory as a Decoder.

  Args:
    path: directory with config.json and safetensors weights (single file or sharded index).
    dtype: parameter dtype (float32 default; bfloat16 allowed); weights are cast on the host.
    mesh: if given, each parameter lands directly in its logical-axis NamedSharding.
    compute_dtype: matmul dtype (default: ``dtype``).
    rules: logical-axis sharding rules.
    **config_overrides: extra ModelConfig fields, e.g. ``remat=True``.
  Returns:
    A Decoder; ``model(input_ids int32 [B, T])`` -> float32 logits ``[B, T, V]``.
  """
  path = Path(path)
  config = load_config(path, **loading.dtype_overrides(dtype, compute_dtype), **config_overrides)
  files = weight_map(path)
  prefix = "model." if "model.embed_tokens.weight" in files else ""
  slots = loading.ParamSlots(config, mesh, rules)
  np_dtype = np.dtype(jnp.dtype(config.param_dtype))
  wanted, stacked = {}, {}
  for p, var in slots.flat:
    names = hf_moe.expert_names(p, config, prefix)
    if names is not None:
      missing = [n for n in names if n not in files]
      if missing:
        raise errors.CheckpointError(
            f"Tensor {missing[0]!r} (an expert of {'.'.join(map(str, p))}) is missing from the "
            f"weights in {path}; config.json says num_experts={config.num_experts}.")
      stacked[p] = names
      wanted.update({n: (p, var, True) for n in names})
      continue
    name, transposed = hf_name(p, prefix)
    if name not in files:
      raise errors.CheckpointError(
          f"Tensor {name!r} (for {'.'.join(map(str, p))}) is missing from the weights in "
          f"{path}; a {config.architecture} checkpoint with this config.json needs it.")
    wanted[name] = (p, var, transposed)
  extra = sorted(n for n in files if n not in wanted and not _IGNORED.search(n)
                 and not (n == "lm_head.weight" and config.tie_word_embeddings))
  if extra:
    raise errors.UnsupportedArchitectureError(
        f"{path} has tensors the {config.architecture} decoder does not use: {extra[:5]}"
        f"{' ...' if len(extra) > 5 else ''}; config.json and weights disagree, or the model "
        f"has parts (e.g. output-projection biases) that are not supported.")

  values = {}
  with contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(safe_open(f, framework="np")) for f in set(files.values())}
    for p, names in stacked.items():
      var = dict(slots.flat)[p]
      want = tuple(var.shape[1:])[::-1]
      for n in names:
        if tuple(handles[files[n]].get_slice(n).get_shape()) != want:
          raise errors.CheckpointError(
              f"Tensor {n!r} has shape {tuple(handles[files[n]].get_slice(n).get_shape())}, but "
              f"config.json implies {want}; the weights do not match the config.")
      values[p] = slots.place(p, tuple(var.shape), hf_moe.stacked_reader(
          [handles[files[n]] for n in names], names, np_dtype))
    for name, (p, var, transposed) in wanted.items():
      if p in stacked:
        continue
      handle = handles[files[name]]
      hf_shape = tuple(handle.get_slice(name).get_shape())
      shape = tuple(var.shape)
      expected = shape[::-1] if transposed else shape
      if hf_shape != expected:
        raise errors.CheckpointError(
            f"Tensor {name!r} in {files[name].name} has shape {hf_shape}, but config.json "
            f"implies {expected}; the weights do not match the config.")
      values[p] = slots.place(p, shape, _reader(handle, name, transposed, np_dtype))
  return slots.model(values)


# -- writing ------------------------------------------------------------------------------------
def _to_host(x: jax.Array) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def _parse_size(size) -> int:
  if isinstance(size, (int, np.integer)):
    return int(size)
  m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(size), re.IGNORECASE)
  if not m:
    raise errors.ConfigError(f"max_shard_size={size!r}: use bytes (int) or e.g. '500MB', '2GB'.")
  unit = (m.group(2) or "B").upper()
  scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
           "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
  return int(float(m.group(1)) * scale)


def _save_tokenizer(tokenizer: Any, path: Path):
  if hasattr(tokenizer, "save_pretrained"):
    tokenizer.save_pretrained(str(path))
    return
  src = Path(tokenizer)
  if src.is_file():
    shutil.copy2(src, path / src.name)
    return
  found = [src / n for n in _TOKENIZER_FILES if (src / n).is_file()] if src.is_dir() else []
  if not found:
    raise errors.TokenizerError(
        f"tokenizer={tokenizer!r}: pass a transformers tokenizer, a tokenizer.json file, or a "
        f"directory with any of {list(_TOKENIZER_FILES)}.")
  for f in found:
    shutil.copy2(f, path / f.name)


def save_pretrained(model: Decoder, path: str | os.PathLike, tokenizer: Any = None, *,
                    max_shard_size: int | str | None = None, dtype=None,
                    generation_config: bool = True) -> Path:
  """Writes ``model`` as a HF directory that ``transformers.AutoModelForCausalLM`` loads.

  Args:
    model: a Decoder (any sharding; gathered to host one tensor at a time).
    path: output directory (created).
    tokenizer: optional transformers tokenizer, tokenizer.json file, or tokenizer directory.
    max_shard_size: split weights into shards of at most this size (bytes or '2GB').
    dtype: weight dtype on disk (default: the parameter dtype).
    generation_config: also write generation_config.json when the config names token ids.
  Returns:
    The output directory.
  """
  path = Path(path)
  config = model.config
  if dtype is not None:
    config = config.replace(param_dtype=jnp.dtype(dtype).name)
  hf = hf_config.config_to_hf(config)
  tensors = {}
  for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    arr = _to_host(var.get_value())
    if dtype is not None:
      arr = arr.astype(np.dtype(jnp.dtype(dtype)))
    names = hf_moe.expert_names(tuple(p), config)
    if names is not None:
      tensors.update(hf_moe.split_stacked(arr, names))
      continue
    name, transposed = hf_name(p)
    tensors[name] = np.ascontiguousarray(arr.T if transposed else arr)
  if jax.process_index() != 0:
    return path
  path.mkdir(parents=True, exist_ok=True)
  with open(path / CONFIG_FILE, "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
  gen = hf_config.generation_config_to_hf(config) if generation_config else None
  if gen:
    with open(path / "generation_config.json", "w") as f:
      json.dump(gen, f, indent=2, sort_keys=True)
  meta = {"format": "pt"}
  names = sorted(tensors, key=_tensor_order)
  limit = _parse_size(max_shard_size) if max_shard_size is not None else None
  shards, current, size = [], [], 0
  for name in names:
    nbytes = tensors[name].nbytes
    if limit is not None and current and size + nbytes > limit:
      shards.append(current)
      current, size = [], 0
    current.append(name)
    size += nbytes
  shards.append(current)
  for stale in list(path.glob("model*.safetensors")) + [path / INDEX_FILE]:
    stale.unlink(missing_ok=True)
  if len(shards) == 1:
    save_file({n: tensors[n] for n in shards[0]}, str(path / SINGLE_FILE), metadata=meta)
  else:
    wmap = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file({n: tensors[n] for n in shard}, str(path / fname), metadata=meta)
      wmap.update({n: fname for n in shard})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
             "weight_map": wmap}
    with open(path / INDEX_FILE, "w") as f:
      json.dump(index, f, indent=2, sort_keys=True)
  if tokenizer is not None:
    _save_tokenizer(tokenizer, path)
  return path


def _tensor_order(name: str):
  """Embedding first, then layers in numeric order, then the final norm and head."""
  m = re.search(r"layers\.(\d+)\.", name)
  if m:
    return (1, int(m.group(1)), name)
  return (0 if "embed_tokens" in name else 2, 0, name)
