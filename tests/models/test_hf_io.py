"""HF checkpoint I/O against `transformers` itself (PyTorch CPU, eager attention)."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from legorl_jax import errors  # noqa: E402
from legorl_jax.models import from_pretrained, get_preset, hf_config, save_pretrained  # noqa: E402
from legorl_jax.models.hf_io import load_config  # noqa: E402
from legorl_jax.sharding import make_mesh, state_shardings  # noqa: E402
from tests.models import hf_reference  # noqa: E402

VOCAB = 160
IDS = np.random.RandomState(0).randint(0, VOCAB, (2, 24)).astype(np.int32)
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
HF_CONFIGS = {
    # GQA, llama3 RoPE scaling, untied head; saved as a sharded checkpoint.
    "llama": lambda: transformers.LlamaConfig(
        **_COMMON, head_dim=16, tie_word_embeddings=False, rope_theta=500_000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16)),
    # q/k/v biases, tied embeddings.
    "qwen2": lambda: transformers.Qwen2Config(**_COMMON, tie_word_embeddings=True,
                                              rope_theta=1_000_000.0),
    # q/k RMSNorm, head_dim (32) * heads (4) != hidden_size (64).
    "qwen3": lambda: transformers.Qwen3Config(**_COMMON, head_dim=32, tie_word_embeddings=True,
                                              rope_theta=1_000_000.0),
}


def _perturb(name, p):
  """Move norms and biases away from 1 / 0 so they are tested."""
  if "norm" in name or name.endswith("bias"):
    p.add_(0.2 * torch.randn_like(p))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """arch -> (checkpoint dir, reference logits [2, 24, V]) of a perturbed random HF model."""
  get = hf_reference.checkpoint_cache(
      tmp_path_factory, "hf", HF_CONFIGS, IDS, _perturb,
      save_kwargs=lambda arch: dict(max_shard_size="40KB" if arch == "llama" else "1GB"))

  def checked(arch):
    path, ref = get(arch)
    assert (path / "model.safetensors.index.json").is_file() == (arch == "llama")
    return path, ref

  return checked


ARCHS = pytest.mark.parametrize("arch", sorted(HF_CONFIGS))


@ARCHS
def test_logits_match_transformers(checkpoint, arch):
  path, ref = checkpoint(arch)
  model = from_pretrained(path)
  assert model.embed[...].dtype == jnp.float32
  assert np.abs(hf_reference.jax_logits(model, IDS) - ref).max() <= 1e-4


@ARCHS
def test_round_trip_into_transformers(checkpoint, arch, tmp_path):
  path, ref = checkpoint(arch)
  model = from_pretrained(path)
  out = save_pretrained(model, tmp_path / "out", max_shard_size="50KB" if arch == "qwen3" else None)
  cfg = json.loads((out / "config.json").read_text())
  assert cfg["model_type"] == arch
  assert cfg["architectures"] == [hf_config.ARCHITECTURE_CLASSES[arch]]
  if arch == "qwen3":
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
  back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  assert type(back).__name__ == hf_config.ARCHITECTURE_CLASSES[arch]
  assert back.config.tie_word_embeddings == model.config.tie_word_embeddings
  assert np.abs(hf_reference.torch_logits(back, IDS) - ref).max() <= 1e-5
  # Reloading our own output gives bit-identical parameters.
  again = nnx.to_flat_state(nnx.state(from_pretrained(out), nnx.Param))
  first = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for p, v in again:
    np.testing.assert_array_equal(np.asarray(v[...]), np.asarray(first[p][...]))


def test_mesh_load_shards_params(checkpoint):
  path, ref = checkpoint("llama")
  mesh = make_mesh(2, 2, 2)
  model = from_pretrained(path, mesh=mesh)
  state = nnx.state(model, nnx.Param)
  expected = dict(nnx.to_flat_state(state_shardings(state, mesh)))
  for p, v in nnx.to_flat_state(state):
    assert v[...].sharding == expected[p].get_value(), p
  q = model.layers[0].attn.q_kernel[...]
  assert q.sharding.spec == P("fsdp", "tensor")
  assert {s.data.shape for s in q.addressable_shards} == {(32, 32)}  # [64, 64] over 2 x 2
  assert model.embed[...].sharding.spec == P("tensor", "fsdp")
  assert model.lm_head[...].sharding.spec == P("fsdp", "tensor")
  assert np.abs(hf_reference.jax_logits(model, IDS) - ref).max() <= 1e-4


def test_save_sharded_model_in_bfloat16(checkpoint, tmp_path):
  """Saving gathers mesh-sharded params; bf16 files load back as their fp32 values."""
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel
  path, _ = checkpoint("llama")
  model = from_pretrained(path, mesh=make_mesh(2, 2, 2))
  out = save_pretrained(model, tmp_path / "bf16", dtype=jnp.bfloat16)
  assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
  with safe_open(out / "model.safetensors", framework="np") as f:
    assert f.get_slice("lm_head.weight").get_dtype() == "BF16"
  back = dict(nnx.to_flat_state(nnx.state(from_pretrained(out), nnx.Param)))
  for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    want = np.asarray(v[...]).astype(jnp.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(back[p][...]), want)


def test_bfloat16_load(checkpoint):
  path, ref = checkpoint("qwen3")
  model = from_pretrained(path, dtype=jnp.bfloat16)
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
  err = np.abs(hf_reference.jax_logits(model, IDS) - ref).max()
  assert err <= 0.05 * np.abs(ref).max(), err


def test_save_tokenizer(checkpoint, tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  # qwen3, not qwen2: transformers 5 AutoTokenizer forces its own Qwen2Tokenizer on qwen2 dirs.
  path, _ = checkpoint("qwen3")
  vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
  model = from_pretrained(path)
  out = save_pretrained(model, tmp_path / "with_tok", tokenizer=fast)
  text = "w3 w17 nope w150"
  loaded = transformers.AutoTokenizer.from_pretrained(out)
  assert loaded.encode(text) == fast.encode(text) == [3, 17, VOCAB - 1, 150]
  copied = save_pretrained(model, tmp_path / "copied", tokenizer=out)  # a tokenizer directory
  assert transformers.AutoTokenizer.from_pretrained(copied).encode(text) == fast.encode(text)
  with pytest.raises(errors.TokenizerError, match="tokenizer"):
    save_pretrained(model, tmp_path / "bad", tokenizer=tmp_path / "nothing_here")


# -- malformed checkpoints ------------------------------------------------------------------------
@pytest.fixture
def broken(checkpoint, tmp_path):
  """A writable copy of the qwen2 checkpoint (tied, single file)."""
  return shutil.copytree(checkpoint("qwen2")[0], tmp_path / "ckpt")


def _edit_config(path, **kw):
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(kw)
  (path / "config.json").write_text(json.dumps(cfg))


def _rewrite_weights(path, fn):
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  tensors = fn(load_file(path / "model.safetensors"))
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_config(broken):
  (broken / "config.json").unlink()
  with pytest.raises(errors.CheckpointError, match="config.json is missing"):
    from_pretrained(broken)
  with pytest.raises(errors.CheckpointError, match="not a directory"):
    from_pretrained(broken / "model.safetensors")


def test_malformed_config(broken):
  (broken / "config.json").write_text("{not json")
  with pytest.raises(errors.CheckpointError, match="not valid JSON"):
    from_pretrained(broken)


def test_missing_weights(broken):
  (broken / "model.safetensors").rename(broken / "pytorch_model.bin")
  with pytest.raises(errors.CheckpointError, match=r"No weights.*pytorch_model\.bin"):
    from_pretrained(broken)


def test_missing_shard_named_by_index(checkpoint, tmp_path):
  dst = shutil.copytree(checkpoint("llama")[0], tmp_path / "ckpt")
  victim = sorted(dst.glob("model-*.safetensors"))[-1]
  victim.unlink()
  with pytest.raises(errors.CheckpointError, match=victim.name):
    from_pretrained(dst)


def test_missing_tensor(broken):
  name = "model.layers.1.self_attn.k_proj.bias"
  _rewrite_weights(broken, lambda t: {k: v for k, v in t.items() if k != name})
  with pytest.raises(errors.CheckpointError, match=rf"{name}.*missing"):
    from_pretrained(broken)


def test_shape_mismatch(broken):
  _edit_config(broken, intermediate_size=128)
  with pytest.raises(errors.CheckpointError, match=r"mlp\.\w+_proj\.weight.*shape \(\d+, \d+\)"):
    from_pretrained(broken)


def test_unexpected_tensor(broken):
  def add_o_bias(t):
    t["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    return t
  _rewrite_weights(broken, add_o_bias)
  with pytest.raises(errors.UnsupportedArchitectureError, match="o_proj.bias"):
    from_pretrained(broken)


def test_unknown_model_type(broken):
  _edit_config(broken, model_type="mistral", architectures=["MistralForCausalLM"])
  with pytest.raises(errors.UnsupportedArchitectureError, match=r"mistral.*Supported.*llama"):
    from_pretrained(broken)


# -- config mapping (no weights) ------------------------------------------------------------------
def _base(arch="llama", **kw):
  cfg = dict(model_type=arch, architectures=[hf_config.ARCHITECTURE_CLASSES[arch]],
             vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
  cfg.update(kw)
  return cfg


@pytest.mark.parametrize("arch,overrides,pattern", [
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
     "rope_type 'yarn'"),
    ("llama", dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_type 'linear'"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=4096), "use_sliding_window"),
    ("qwen3", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    ("llama", dict(mlp_bias=True), "mlp_bias"),
    ("llama", dict(attention_bias=True), "attention_bias"),
    ("qwen3", dict(attention_bias=True), "attention_bias"),
    ("llama", dict(hidden_act="gelu"), "hidden_act"),
    ("llama", dict(architectures=["LlamaForSequenceClassification"]), "LlamaForSequenceClass"),
    ("llama", dict(model_type="gemma2", architectures=None), "gemma2"),
])
def test_unsupported_configs(arch, overrides, pattern):
  with pytest.raises(errors.UnsupportedArchitectureError, match=pattern) as info:
    hf_config.config_from_hf(_base(arch, **overrides))
  assert "Supported" in str(info.value)


def test_config_missing_field_and_bad_llama3():
  cfg = _base()
  del cfg["hidden_size"]
  with pytest.raises(errors.CheckpointError, match="hidden_size"):
    hf_config.config_from_hf(cfg)
  with pytest.raises(errors.CheckpointError, match="low_freq_factor"):
    hf_config.config_from_hf(_base(rope_scaling={"rope_type": "llama3", "factor": 8.0}))
  with pytest.raises(errors.CheckpointError, match="num_heads"):
    hf_config.config_from_hf(_base(num_key_value_heads=3))


def test_rope_layouts_agree():
  scaling = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                 original_max_position_embeddings=8192)
  legacy = _base(rope_theta=500_000.0, rope_scaling={"type": "llama3", **scaling})
  v5 = _base(rope_parameters={"rope_type": "llama3", "rope_theta": 500_000.0, **scaling})
  a, b = hf_config.config_from_hf(legacy), hf_config.config_from_hf(v5)
  assert a == b and a.rope_theta == 500_000.0 and a.rope_scaling == scaling
  plain = hf_config.config_from_hf(_base("qwen3", rope_parameters={"rope_type": "default",
                                                                   "rope_theta": 1e6}))
  assert plain.rope_scaling is None and plain.rope_theta == 1e6 and plain.qk_norm
  # Defaults: kv heads = heads, head_dim = hidden / heads, multiple EOS ids -> the first.
  cfg = _base("qwen2", eos_token_id=[7, 9], num_key_value_heads=None)
  c = hf_config.config_from_hf(cfg)
  assert (c.num_kv_heads, c.head_dim, c.eos_token_id, c.qkv_bias) == (4, 16, 7, True)
  # model_type may be absent when architectures names the class.
  assert hf_config.config_from_hf(_base("qwen3", model_type=None)).architecture == "qwen3"


@pytest.mark.parametrize("preset", ["qwen3-8b", "qwen2.5-coder-7b", "llama-3.2-1b"])
def test_preset_config_round_trip_through_transformers(preset, tmp_path):
  config = get_preset(preset)
  hf = hf_config.config_to_hf(config)
  assert hf_config.config_from_hf(hf, dtype="float32", param_dtype="float32") == config
  (tmp_path / "config.json").write_text(json.dumps(hf))
  theirs = transformers.AutoConfig.from_pretrained(tmp_path)
  assert type(theirs).__name__.lower().startswith(config.architecture.replace("-", ""))
  assert (theirs.hidden_size, theirs.num_key_value_heads, theirs.head_dim) == (
      config.hidden_size, config.num_kv_heads, config.head_dim)
  assert theirs.rope_parameters["rope_theta"] == config.rope_theta
  assert theirs.rope_parameters["rope_type"] == ("llama3" if config.rope_scaling else "default")
  assert load_config(tmp_path) == config
