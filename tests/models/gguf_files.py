"""Writes small GGUF model files for tests, with `gguf`'s own writer and quantizers.

Weights are random; block-quantized tensors come from ``gguf.quants.quantize`` where `gguf`
has a quantizer, and are random bytes (with finite, small f16 scales) for the K-quants, so
every bit pattern of the codes is exercised. The tokenizer metadata reuses the bundled
tokenizer's vocabulary and merges, so no test needs a download.
"""

from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from legorl_jax.models import chat_template as ct
from legorl_jax.models import tokenizer as tk

# Shapes: hidden 64, 2 layers, MLP 256 (K-quants need rows of 256 values: ffn_down).
LAYOUTS = {
    "llama": dict(hidden=64, ffn=256, layers=2, heads=4, kv_heads=2, head_dim=16, tied=True,
                  pre="smollm"),
    "qwen2": dict(hidden=64, ffn=256, layers=2, heads=4, kv_heads=2, head_dim=16, tied=False,
                  pre="qwen2"),
    # transformers' GGUF loader ignores key_length for qwen3 and uses Qwen3Config's default
    # head_dim (128); the file says 128 too, so both loaders build the same model.
    "qwen3": dict(hidden=64, ffn=256, layers=2, heads=2, kv_heads=1, head_dim=128, tied=True,
                  pre="qwen2"),
}
# One quant type per tensor kind; block 1 uses Q6_K for ffn_down, block 0 Q4_K.
QTYPES = {"token_embd": Q.Q8_0, "output": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1,
          "attn_v": Q.BF16, "attn_output": Q.F16, "ffn_gate": Q.Q8_0, "ffn_up": Q.Q4_1,
          "ffn_down": (Q.Q4_K, Q.Q6_K)}


def bundled_vocab() -> tuple[list[str], list[str], list[int]]:
  """(tokens in id order, merges as "a b", GGUF token types) of the bundled tokenizer."""
  data = json.loads((tk.bundled_tokenizer_dir() / "tokenizer.json").read_text())
  vocab = dict(data["model"]["vocab"])
  for t in data["added_tokens"]:
    vocab[t["content"]] = t["id"]
  tokens = [None] * len(vocab)
  for t, i in vocab.items():
    tokens[i] = t
  merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
  types = [3 if t in ct.CONTROL_TOKENS else 4 if t in ct.MARKUP_TOKENS else 1 for t in tokens]
  return tokens, merges, types


def tensor_shapes(arch: str, lay: dict) -> dict[str, tuple[int, ...]]:
  """GGUF tensor name -> numpy (HF) shape."""
  d, f, hd = lay["hidden"], lay["ffn"], lay["head_dim"]
  q, kv, v = lay["heads"] * hd, lay["kv_heads"] * hd, len(bundled_vocab()[0])
  out = {"token_embd.weight": (v, d), "output_norm.weight": (d,)}
  if not lay["tied"]:
    out["output.weight"] = (v, d)
  for i in range(lay["layers"]):
    b = f"blk.{i}."
    out.update({b + "attn_norm.weight": (d,), b + "ffn_norm.weight": (d,),
                b + "attn_q.weight": (q, d), b + "attn_k.weight": (kv, d),
                b + "attn_v.weight": (kv, d), b + "attn_output.weight": (d, q),
                b + "ffn_gate.weight": (f, d), b + "ffn_up.weight": (f, d),
                b + "ffn_down.weight": (d, f)})
    if arch == "qwen2":
      out.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
    if arch == "qwen3":
      out.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
  return out


def random_k_blocks(rng, qtype, rows: int, cols: int) -> np.ndarray:
  """Random bytes of a K-quant tensor ``[rows, cols]``, f16 scales set small and finite."""
  block, size = GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
  scale_at = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}[qtype]
  magnitude = {Q.Q4_K: 2e-3, Q.Q6_K: 2e-4}[qtype]
  for at in scale_at:
    raw[:, at:at + 2] = (rng.uniform(0.2, 1.0, raw.shape[0]) * magnitude).astype(
        np.float16).view(np.uint8).reshape(-1, 2)
  return raw.reshape(rows, cols // block * size)


def encode(rng, name: str, w: np.ndarray, qtype) -> tuple[np.ndarray, Q | None]:
  """(data for GGUFWriter.add_tensor, raw_dtype)."""
  if qtype == Q.F32:
    return w.astype(np.float32), None
  if qtype == Q.F16:
    return w.astype(np.float16), None
  if qtype in (Q.Q4_K, Q.Q6_K):
    return random_k_blocks(rng, qtype, *w.shape), qtype
  return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def qtype_of(name: str, qtypes: dict) -> Q:
  kind = name.split(".")[-2]
  if name.endswith(".bias") or "norm" in kind:
    return Q.F32
  qt = qtypes.get(kind, Q.F32)
  if isinstance(qt, tuple):
    qt = qt[int(name.split(".")[1]) % len(qt)]
  return qt


def write_gguf(path: pathlib.Path, arch: str = "llama", *, seed: int = 0, qtypes=None,
               tensors: dict[str, np.ndarray] | None = None, layout: dict | None = None,
               tokenizer: dict | None = None, skip: tuple[str, ...] = (),
               meta_arch: str | None = None) -> pathlib.Path:
  """Writes a GGUF model file; returns ``path``.

  Args:
    arch: llama / qwen2 / qwen3 (names, metadata); ``meta_arch`` overrides the written
      ``general.architecture`` (for unsupported-architecture tests).
    qtypes: tensor kind -> quant type (default ``QTYPES``); F32 everywhere with ``{}``.
    tensors: exact float32 tensors (GGUF layout, numpy shapes) instead of random ones.
    tokenizer: overrides of the tokenizer metadata (``model``, ``pre``).
    skip: tensor names to leave out.
  """
  rng = np.random.default_rng(seed)
  lay = dict(LAYOUTS[arch], **(layout or {}))
  qtypes = QTYPES if qtypes is None else qtypes
  w = gguf.GGUFWriter(str(path), meta_arch or arch)
  w.add_name(f"test-{arch}")
  w.add_block_count(lay["layers"])
  w.add_context_length(lay.get("context", 512))
  w.add_embedding_length(lay["hidden"])
  w.add_feed_forward_length(lay["ffn"])
  w.add_head_count(lay["heads"])
  w.add_head_count_kv(lay["kv_heads"])
  w.add_rope_freq_base(100_000.0 if arch == "llama" else 1_000_000.0)
  w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
  if arch == "llama":
    w.add_rope_dimension_count(lay["head_dim"])
  if arch == "qwen3":
    w.add_key_length(lay["head_dim"])
    w.add_value_length(lay["head_dim"])
  tok = {"model": "gpt2", "pre": lay["pre"], **(tokenizer or {})}
  tokens, merges, types = bundled_vocab()
  w.add_tokenizer_model(tok["model"])
  w.add_tokenizer_pre(tok["pre"])
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(merges)
  w.add_bos_token_id(tokens.index(ct.IM_START))
  w.add_eos_token_id(tokens.index(ct.ENDOFTEXT))
  w.add_pad_token_id(tokens.index(ct.ENDOFTEXT))
  w.add_add_bos_token(bool(tok.get("add_bos", False)))
  for name, shape in tensor_shapes(arch, lay).items():
    if name in skip:
      continue
    if tensors is not None:
      arr = tensors[name]
    elif "norm" in name:
      arr = 1.0 + 0.1 * rng.standard_normal(shape)
    else:
      arr = (0.5 if name.startswith("token_embd") else 0.15) * rng.standard_normal(shape)
    data, raw = encode(rng, name, np.asarray(arr, np.float32), qtype_of(name, qtypes))
    w.add_tensor(name, data, raw_dtype=raw)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's converter permutation of llama q/k rows (HF order -> GGUF order)."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)
