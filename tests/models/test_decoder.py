"""Decoder behaviour: mesh invariance, KV-cache decoding, packing, dtypes, remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from legorl_jax.models import KVCache, abstract_model, create_model, get_preset, shard_model
from legorl_jax.sharding import make_mesh


def _small(arch="qwen3", **kw):
  """A 2-layer config with the architecture's switches (fast to compile)."""
  base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, max_position_embeddings=128)
  if arch == "llama":
    base.update(rope_theta=500_000.0, tie_word_embeddings=False, qk_norm=False,
                rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=16))
  elif arch == "qwen2":
    base.update(qkv_bias=True, qk_norm=False)
  return get_preset("tiny", architecture=arch, **{**base, **kw})


def _perturb(model, seed=1):
  """Moves norms and biases away from 1 / 0 so masks and caches see non-trivial values."""
  rng = np.random.RandomState(seed)
  state = nnx.state(model, nnx.Param)
  for path, var in nnx.to_flat_state(state):
    name = ".".join(map(str, path))
    if "norm" in name or name.endswith("bias"):
      var.set_value(var.get_value() + 0.3 * jnp.asarray(rng.randn(*var.shape), var.dtype))
  nnx.update(model, state)
  return model


def _forward(model, ids, positions=None, segment_ids=None):
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))
  return np.asarray(fn(state, ids, positions, segment_ids))


def _ids(b, t, vocab, seed=0):
  return jnp.asarray(np.random.RandomState(seed).randint(0, vocab, (b, t)), jnp.int32)


def test_mesh_matches_single_device_tiny():
  config = get_preset("tiny")
  model = create_model(config, seed=0)
  initial = {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  model = _perturb(model)
  ids = _ids(4, 32, config.vocab_size)
  ref = _forward(model, ids)
  mesh = make_mesh(2, 2, 2)
  sharded = shard_model(model, mesh)
  out = _forward(sharded, ids)
  assert sharded.layers[0].mlp.gate_kernel[...].sharding.spec == P("fsdp", "tensor")
  assert np.abs(out - ref).max() <= 1e-5
  # Creating directly in the shardings gives the same initial parameters as on one device.
  direct = nnx.state(create_model(config, seed=0, mesh=mesh), nnx.Param)
  for p, v in nnx.to_flat_state(direct):
    assert v[...].sharding.mesh.shape == mesh.shape
    np.testing.assert_allclose(np.asarray(v[...]), initial[p], atol=1e-7)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_kv_cache_decode_matches_full_forward(arch):
  config = _small(arch)
  model = _perturb(create_model(config, seed=0))
  b, t, prefill = 2, 12, 5
  ids = _ids(b, t, config.vocab_size, seed=3)
  ref = _forward(model, ids)
  graphdef, state = nnx.split(model)

  @jax.jit
  def step(state, ids, positions, cache):
    m = nnx.merge(graphdef, state)
    hidden, cache = m.decode(ids, positions, cache)
    return m.logits_from_hidden(hidden), cache

  cache = model.init_cache(b, 16)
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  outs = []
  logits, cache = step(state, ids[:, :prefill], pos[:, :prefill], cache)
  outs.append(logits)
  for i in range(prefill, t):
    logits, cache = step(state, ids[:, i:i + 1], pos[:, i:i + 1], cache)
    outs.append(logits)
  got = np.concatenate([np.asarray(o) for o in outs], axis=1)
  assert np.abs(got - ref).max() <= 1e-5
  assert isinstance(cache, KVCache) and cache.max_len == 16
  assert not np.any(np.asarray(cache.k[0])[:, t:])  # slots past the last position untouched


def test_decode_padding_positions_are_ignored():
  config = _small()
  model = _perturb(create_model(config, seed=0))
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, ids, positions, cache):
    m = nnx.merge(graphdef, state)
    hidden, cache = m.decode(ids, positions, cache)
    return m.logits_from_hidden(hidden), cache

  ids = _ids(2, 8, config.vocab_size, seed=5)
  pos = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
  ref, ref_cache = run(state, ids, pos, model.init_cache(2, 12))
  # Row 0: 3 left-pad tokens then the first 5 real ones; row 1: 6 real then 2 right-pad.
  garbage = _ids(2, 8, config.vocab_size, seed=6)
  ids_p = jnp.stack([jnp.concatenate([garbage[0, :3], ids[0, :5]]),
                     jnp.concatenate([ids[1, :6], garbage[1, :2]])])
  pos_p = jnp.asarray([[-1, -1, -1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, -1, -1]], jnp.int32)
  got, cache = run(state, ids_p, pos_p, model.init_cache(2, 12))
  got, ref = np.asarray(got), np.asarray(ref)
  assert np.abs(got[0, 3:] - ref[0, :5]).max() <= 1e-5
  assert np.abs(got[1, :6] - ref[1, :6]).max() <= 1e-5
  for layer in range(config.num_layers):
    k, k_ref = np.asarray(cache.k[layer]), np.asarray(ref_cache.k[layer])
    np.testing.assert_allclose(k[0, :5], k_ref[0, :5], atol=1e-6)
    np.testing.assert_allclose(k[1, :6], k_ref[1, :6], atol=1e-6)
    assert not k[0, 5:].any() and not k[1, 6:].any()  # padding wrote nothing


def test_packed_segments_equal_separate_sequences():
  config = _small("llama")
  model = _perturb(create_model(config, seed=0))
  lens = (5, 7, 3)
  seqs = [_ids(1, n, config.vocab_size, seed=10 + i)[0] for i, n in enumerate(lens)]
  t = 16
  pad = t - sum(lens)
  packed = jnp.concatenate(seqs + [jnp.zeros(pad, jnp.int32)])[None]
  segs = jnp.asarray(np.repeat([1, 2, 3, 0], lens + (pad,)), jnp.int32)[None]
  pos = jnp.asarray(np.concatenate([np.arange(n) for n in lens] + [np.zeros(pad)]), jnp.int32)
  # Two rows: the packed one and the same tokens in one unpacked padded row per sequence.
  alone = jnp.stack([jnp.pad(s, (0, t - len(s))) for s in seqs])
  ids = jnp.concatenate([packed, alone])
  positions = jnp.concatenate([pos[None], jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32),
                                                           (3, t))])
  segment_ids = jnp.concatenate([segs, jnp.ones((3, t), jnp.int32)])
  out = _forward(model, ids, positions, segment_ids)
  start = 0
  for i, n in enumerate(lens):
    assert np.abs(out[0, start:start + n] - out[1 + i, :n]).max() <= 1e-5
    start += n


def test_bfloat16_compute_close_to_float32():
  config = _small()
  model = _perturb(create_model(config, seed=0))
  ids = _ids(2, 16, config.vocab_size)
  ref = _forward(model, ids)
  bf16 = nnx.merge(nnx.split(abstract_model(config.replace(dtype="bfloat16")))[0],
                   nnx.state(model))
  got = _forward(bf16, ids)
  assert got.dtype == np.float32
  err = np.abs(got - ref).max()
  assert 0 < err <= 0.03 * np.abs(ref).max(), err


def test_remat_gives_same_gradients():
  config = _small()
  ids = _ids(2, 8, config.vocab_size)
  _, state = nnx.split(_perturb(create_model(config, seed=0)))

  def grads(remat):
    graphdef = nnx.split(abstract_model(config.replace(remat=remat)))[0]

    def loss(state):
      logits = nnx.merge(graphdef, state)(ids)
      return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
          logits, ids[..., None], -1)[..., 0])

    jaxpr = str(jax.make_jaxpr(jax.grad(loss))(state))
    return jax.jit(jax.grad(loss))(state), ("checkpoint" in jaxpr or "remat" in jaxpr)

  g0, used0 = grads(False)
  g1, used1 = grads(True)
  assert used1 and not used0
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_cpu_preset_param_counts():
  for name, lo, hi in (("tiny", 1e6, 3e6), ("small", 20e6, 40e6)):
    config = get_preset(name)
    state = nnx.state(abstract_model(config), nnx.Param)
    counted = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))
    assert counted == config.num_params()
    assert lo <= counted <= hi, (name, counted)
  for arch in ("llama", "qwen2"):  # bias / untied paths of num_params
    config = _small(arch)
    state = nnx.state(abstract_model(config), nnx.Param)
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state)) == config.num_params()


# Published sizes (model cards): total and non-embedding parameters.
PUBLISHED = {
    "qwen3-0.6b": (0.6e9, 0.44e9),
    "qwen3-1.7b": (1.7e9, 1.4e9),
    "qwen3-4b": (4.0e9, 3.6e9),
    "qwen3-8b": (8.2e9, 6.95e9),
    "qwen2.5-coder-7b": (7.61e9, 6.53e9),
    "llama-3.2-1b": (1.24e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_accelerator_preset_param_counts(name):
  config = get_preset(name)
  total, non_embedding = PUBLISHED[name]
  n = config.num_params()
  assert abs(n - total) <= 0.03 * total, n
  if non_embedding:
    emb = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    assert abs(n - emb - non_embedding) <= 0.03 * non_embedding, n - emb


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_grouped_rows_equal_separate_sequences(arch):
  """A row [prompt | branches] gives every token the hidden state of its own unshared
  sequence: prompt tokens as a prefix of it, branch tokens as its continuation."""
  config = _small(arch)
  model = _perturb(create_model(config, seed=0))
  p, l, k = 10, 8, 3
  # row 0: a 9-token prompt and three completions; row 1: a 6-token prompt, two completions
  # and an empty branch (padding)
  rows = [(9, (4, 6, 2)), (6, (7, 1))]
  ids = np.zeros((2, p + k * l), np.int32)
  pos = np.zeros_like(ids)
  seg = np.zeros_like(ids)
  full = []  # (row, prompt_len, branch index, full sequence)
  rng = np.random.RandomState(3)
  for r, (plen, comps) in enumerate(rows):
    prompt = rng.randint(0, config.vocab_size, plen)
    ids[r, :plen - 1], pos[r, :plen - 1], seg[r, :plen - 1] = prompt[:-1], np.arange(plen - 1), 1
    for j, n in enumerate(comps):
      comp = rng.randint(0, config.vocab_size, n)
      branch = np.concatenate([prompt[-1:], comp])
      sl = slice(p + j * l, p + j * l + len(branch))
      ids[r, sl], pos[r, sl], seg[r, sl] = branch, plen - 1 + np.arange(len(branch)), 2 + j
      full.append((r, plen, j, np.concatenate([prompt, comp])))
  graphdef, state = nnx.split(model)
  grouped = jax.jit(lambda s, *a: nnx.merge(graphdef, s).hidden(*a, shared_prefix=(p, l)))
  out = np.asarray(grouped(state, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(seg)))
  alone = jax.jit(lambda s, x: nnx.merge(graphdef, s).hidden(x))
  for r, plen, j, sequence in full:
    ref = np.asarray(alone(state, jnp.asarray(sequence[None])))[0]
    assert np.abs(out[r, :plen - 1] - ref[:plen - 1]).max() <= 1e-5
    got = out[r, p + j * l:p + j * l + len(sequence) - plen + 1]
    assert np.abs(got - ref[plen - 1:]).max() <= 1e-5, (r, j)
  # padding never leaks: changing padded tokens leaves every real token's state unchanged
  noisy = np.where(seg == 0, rng.randint(0, config.vocab_size, ids.shape), ids)
  out2 = np.asarray(grouped(state, jnp.asarray(noisy), jnp.asarray(pos), jnp.asarray(seg)))
  assert np.abs((out2 - out)[seg > 0]).max() == 0.0


def test_grouped_row_of_wrong_length_names_the_layout():
  model = create_model(_small(), seed=0)
  with pytest.raises(ValueError, match="prompt \\+ K \\* branch"):
    model.hidden(jnp.zeros((1, 20), jnp.int32), shared_prefix=(8, 5))
