"""qwen3_moe against `transformers`' Qwen3MoeForCausalLM, and the grouped experts against a
naive all-experts reference (forward and backward), and routing replay."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from legorl_jax import errors  # noqa: E402
from legorl_jax.models import from_pretrained, get_preset, save_pretrained  # noqa: E402
from legorl_jax.models import moe  # noqa: E402
from legorl_jax.models.build import create_model  # noqa: E402
from legorl_jax.models.decoder import attend  # noqa: E402
from tests.models import hf_reference  # noqa: E402

VOCAB = 128
IDS = np.random.RandomState(0).randint(0, VOCAB, (2, 20)).astype(np.int32)
HF_CONFIGS = {
    # Every layer sparse, renormalised top-k, untied head.
    "all_sparse": lambda: transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=80, moe_intermediate_size=24,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        tie_word_embeddings=False, rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    # Sparse every 2nd layer, one forced dense layer, raw top-k probabilities, tied embeddings.
    "mixed": lambda: transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
        num_experts=6, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
        mlp_only_layers=[3], tie_word_embeddings=True, rope_theta=10_000.0, rms_norm_eps=1e-5),
}
CONFIGS = pytest.mark.parametrize("name", sorted(HF_CONFIGS))


def _perturb(name, p):
  """Norms off 1; the router spread so that top-k is not a near-tie."""
  if "norm" in name:
    p.add_(0.2 * torch.randn_like(p))
  elif name.endswith("mlp.gate.weight"):
    p.normal_(0.0, 0.5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """name -> (dir, reference logits) of a random HF Qwen3-MoE with perturbed norms."""
  return hf_reference.checkpoint_cache(tmp_path_factory, "moe", HF_CONFIGS, IDS, _perturb)


@CONFIGS
def test_import_matches_transformers(checkpoint, name):
  path, ref = checkpoint(name)
  model = from_pretrained(path)
  c = model.config
  hf = HF_CONFIGS[name]()
  assert c.architecture == "qwen3_moe" and c.num_experts == hf.num_experts
  assert c.moe_layers == tuple(i for i in range(hf.num_hidden_layers)
                               if i not in hf.mlp_only_layers
                               and (i + 1) % hf.decoder_sparse_step == 0)
  err = np.abs(hf_reference.jax_logits(model, IDS) - ref).max()
  assert err <= 1e-4, err


@CONFIGS
def test_export_matches_transformers(checkpoint, name, tmp_path):
  path, ref = checkpoint(name)
  model = from_pretrained(path)
  out = save_pretrained(model, tmp_path / "out")
  assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3MoeForCausalLM"]
  back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  assert type(back).__name__ == "Qwen3MoeForCausalLM"
  err = np.abs(hf_reference.torch_logits(back, IDS) - ref).max()
  assert err <= 1e-4, err
  # A random model of ours, exported, computes our logits in transformers.
  ours = create_model(model.config.replace(initializer_range=0.2), seed=3)
  out2 = save_pretrained(ours, tmp_path / "ours")
  theirs = transformers.AutoModelForCausalLM.from_pretrained(out2, attn_implementation="eager")
  err = np.abs(hf_reference.torch_logits(theirs.eval(), IDS)
               - hf_reference.jax_logits(ours, IDS)).max()
  assert err <= 1e-4, err


def _moe_config(**kw):
  base = dict(architecture="qwen3_moe", vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
              num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8, num_experts=8,
              num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=(1,),
              initializer_range=0.3)
  base.update(kw)
  return get_preset("tiny", **base)


def test_grouped_equals_all_experts_forward_and_backward():
  rng = np.random.RandomState(1)
  n, d, e, i, k = 37, 16, 6, 12, 2
  x = jnp.asarray(rng.randn(n, d), jnp.float32)
  router = jnp.asarray(rng.randn(d, e), jnp.float32)
  w = [jnp.asarray(0.3 * rng.randn(*s), jnp.float32) for s in ((e, d, i), (e, d, i), (e, i, d))]

  def loss(fn, x, router, *w):
    r = moe.route(x, router, k, True)
    y = fn(x, r.experts, r.gates, *w)
    return jnp.sum(jnp.sin(y))

  for norm in (True, False):
    r = moe.route(x, router, k, norm)
    for impl in moe.IMPLS:
      np.testing.assert_allclose(moe.grouped_experts(x, r.experts, r.gates, *w, impl=impl),
                                 moe.dense_experts(x, r.experts, r.gates, *w), atol=1e-5)
  fns = [moe.ragged_experts, moe.blocked_experts, moe.dense_experts]
  grads = [jax.grad(loss, argnums=(1, 2, 3, 4, 5))(fn, x, router, *w) for fn in fns]
  for g in grads[:2]:
    for a, b in zip(g, grads[2]):  # fp32, summation orders differ
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(grads[0][1]).max()) > 0  # the router is trained through the gates
  with pytest.raises(errors.ConfigError, match="ragged"):
    moe.grouped_experts(x, r.experts, r.gates, *w, impl="megablocks")


def test_route_matches_hf_topk_and_validates_replay():
  rng = np.random.RandomState(2)
  x = jnp.asarray(rng.randn(10, 8), jnp.float32)
  router = jnp.asarray(rng.randn(8, 5), jnp.float32)
  r = moe.route(x, router, 2, True)
  probs = torch.softmax(torch.tensor(np.asarray(x @ router)), -1)
  val, idx = torch.topk(probs, 2, -1)
  np.testing.assert_array_equal(r.experts, idx.numpy())
  np.testing.assert_allclose(r.gates, (val / val.sum(-1, keepdim=True)).numpy(), atol=1e-6)
  with pytest.raises(errors.ConfigError, match="num_experts_per_tok"):
    moe.route(x, router, 2, True, experts=jnp.zeros((10, 3), jnp.int32))


def test_load_balancing_loss_matches_transformers():
  from transformers.models.qwen3_moe import modeling_qwen3_moe  # pylint: disable=import-outside-toplevel
  rng = np.random.RandomState(3)
  logits = rng.randn(12, 6).astype(np.float32)
  probs = jax.nn.softmax(jnp.asarray(logits), -1)
  experts = jax.lax.top_k(probs, 2)[1]
  ours = moe.load_balancing_loss(probs, experts, jnp.ones(12, bool))
  theirs = modeling_qwen3_moe.load_balancing_loss_func((torch.tensor(logits),), 6, 2)
  np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-5)


def test_model_grouped_equals_naive_model():
  """The whole model with the all-experts reference in every sparse block: same logits/grads."""
  config = _moe_config()
  model = create_model(config, seed=0)
  ids = jnp.asarray(IDS[:, :12])
  graphdef, state = nnx.split(model)

  def loss(state, dense):
    m = nnx.merge(graphdef, state)
    x = m.embed_tokens(ids)
    pos, mask = jnp.broadcast_to(jnp.arange(12), (2, 12)), jnp.tril(jnp.ones((12, 12), bool))[None]
    for block in m.layers:
      q, kk, v = block.attn.project_qkv(block.attn_norm(x), pos)
      x = x + block.attn.output(attend(q, kk, v, mask))
      if block.sparse:
        y, _ = block.mlp.routed(block.mlp_norm(x), dense=dense)
      else:
        y = block.mlp(block.mlp_norm(x))
      x = x + y
    return jnp.sum(m.logits_from_hidden(m.final_norm(x)) ** 2) * 1e-3

  ref_logits = hf_reference.jax_logits(model, np.asarray(ids))
  np.testing.assert_allclose(loss(state, False), jnp.sum(ref_logits ** 2) * 1e-3, rtol=1e-5)
  ga, gb = jax.grad(loss)(state, False), jax.grad(loss)(state, True)
  for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(a, b, atol=1e-5)


# -- routing replay -------------------------------------------------------------------------------
def _replay_setup():
  config = _moe_config()
  model = create_model(config, seed=0)
  graphdef, state = nnx.split(model)
  return config, graphdef, state, jnp.asarray(IDS[:, :12])


def test_routes_recorded_and_replayed():
  config, graphdef, state, ids = _replay_setup()
  m = nnx.merge(graphdef, state)
  hidden, info = m.hidden_routed(ids)
  assert info.experts.shape == (2, 12, len(config.moe_layers), 2) == (2, 12, 2, 2)
  assert info.experts.dtype == jnp.int32 and config.route_dtype == jnp.int8
  np.testing.assert_array_equal(hidden, m.hidden(ids))
  assert float(info.aux_loss) > 0
  # Replaying the model's own routes (compact int8) reproduces it exactly.
  again, info2 = m.hidden_routed(ids, experts=info.experts.astype(config.route_dtype))
  np.testing.assert_array_equal(again, hidden)
  np.testing.assert_array_equal(info2.experts, info.experts)
  # Other routes give another function, and are what the info reports.
  other = (info.experts + 1) % config.num_experts
  moved, info3 = m.hidden_routed(ids, experts=other)
  np.testing.assert_array_equal(info3.experts, other)
  assert float(jnp.abs(moved - hidden).max()) > 1e-3
  # Prefill + decode through the KV cache records the same routes, and replays them.
  cache = m.init_cache(2, 16)
  pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
  h1, cache1, r1 = m.decode(ids[:, :8], pos[:, :8], cache, return_routes=True)
  h2, _, r2 = m.decode(ids[:, 8:], pos[:, 8:], cache1, return_routes=True)
  assert r1.dtype == jnp.int8
  np.testing.assert_array_equal(np.concatenate([r1, r2], 1), info.experts)
  np.testing.assert_allclose(np.concatenate([h1, h2], 1), hidden, atol=1e-5)
  h3, _, r3 = m.decode(ids[:, :8], pos[:, :8], cache, experts=other[:, :8], return_routes=True)
  np.testing.assert_array_equal(r3, other[:, :8])
  np.testing.assert_allclose(h3, moved[:, :8], atol=1e-5)


def test_router_gets_gradient_under_replay():
  config, graphdef, state, ids = _replay_setup()
  m = nnx.merge(graphdef, state)
  routes = (m.hidden_routed(ids)[1].experts + 3) % config.num_experts

  probe = jnp.asarray(np.random.RandomState(4).randn(config.hidden_size), jnp.float32)

  def loss(state, experts):  # not sum(h**2): the final RMSNorm makes that nearly constant
    h, _ = nnx.merge(graphdef, state).hidden_routed(ids, experts=experts)
    return jnp.sum(h @ probe)

  for experts in (None, routes):
    g = jax.grad(loss)(state, experts)
    for i in config.moe_layers:
      router = g["layers"][i]["mlp"]["router_kernel"][...]
      assert float(jnp.abs(router).max()) > 1e-6, (i, experts is None)


def test_dense_model_has_no_routes():
  model = create_model(get_preset("tiny", vocab_size=VOCAB, num_layers=1), seed=0)
  with pytest.raises(errors.ConfigError, match="mixture-of-experts"):
    model.hidden_routed(jnp.asarray(IDS[:, :4]))
  with pytest.raises(errors.ConfigError, match="num_experts"):
    get_preset("tiny", architecture="qwen3_moe")
