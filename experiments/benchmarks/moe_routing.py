"""Mixture-of-experts: grouped vs naive expert compute, and the router mismatch with and without
rollout routing replay (issue 31). Prints one JSON line.

* ``grouped_vs_naive``: median seconds of a jitted forward+backward of one expert layer, grouped
  (``moe.ragged_experts``: ragged_dot; ``moe.blocked_experts``: padded blocks, the CPU default)
  and the all-experts reference (``moe.dense_experts``), on the same tokens and routes.
* ``mismatch``: a sampler with other numerics (``--sampler bf16``: bfloat16 compute, or
  ``--sampler noise``: its router kernels perturbed by ``--noise`` std) rolls out a tiny
  qwen3_moe policy through the KV-cache decode path, recording each token's logprob and routes;
  the fp32 learner rescoring the same tokens without replay (its own top-k) and with replay
  (the recorded routes) gives: the fraction of router decisions (token, layer, slot) that
  differ, the fraction of tokens differing in at least one layer, |dlogp| p50/p99/max over
  sampled tokens and the importance-ratio extremes exp(learner - sampler).

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.moe_routing
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.moe_routing --sampler noise --noise 0.02
"""

from __future__ import annotations

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models import get_preset, moe  # noqa: E402
from legorl_jax.models.build import create_model  # noqa: E402
from legorl_jax.models.params import split_model  # noqa: E402
from legorl_jax.trainer import train_step as ts  # noqa: E402

flags.DEFINE_integer("tokens", 1024, "Tokens of the timed expert layer.")
flags.DEFINE_integer("dim", 128, "Hidden size of the timed expert layer.")
flags.DEFINE_integer("experts", 128, "Experts (Qwen3-30B-A3B's 128, top-8).")
flags.DEFINE_integer("top_k", 8, "Experts per token.")
flags.DEFINE_integer("width", 64, "Expert intermediate size.")
flags.DEFINE_integer("repeats", 3, "Timed fwd+bwd calls per variant.")
flags.DEFINE_enum("sampler", "bf16", ["bf16", "noise"],
                  "Mismatch: a bfloat16 sampler, or router kernels perturbed by --noise.")
flags.DEFINE_float("noise", 0.02, "Std of the router-kernel noise (--sampler noise).")
flags.DEFINE_integer("rows", 8, "Rollout rows of the mismatch measurement.")
flags.DEFINE_integer("prompt", 32, "Prompt tokens per row.")
flags.DEFINE_integer("new", 32, "Sampled tokens per row.")
FLAGS = flags.FLAGS


def time_experts(tokens, dim, experts, top_k, width, repeats):
  """Median fwd+bwd seconds of grouped and dense expert compute on one routed batch."""
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(tokens, dim), jnp.float32)
  router = jnp.asarray(rng.randn(dim, experts), jnp.float32)
  w = [jnp.asarray(0.05 * rng.randn(*s), jnp.float32)
       for s in ((experts, dim, width), (experts, dim, width), (experts, width, dim))]
  out = {}
  for name, fn in (("ragged", moe.ragged_experts), ("blocked", moe.blocked_experts),
                   ("naive", moe.dense_experts)):
    def loss(x, router, *w, fn=fn):
      r = moe.route(x, router, top_k, True)
      return jnp.sum(fn(x, r.experts, r.gates, *w) ** 2)
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
    times, _ = common.time_calls(lambda step=step: step(x, router, *w), repeats,
                                 sync=jax.block_until_ready)
    out[f"{name}_s"] = float(np.median(times))
  out["speedup_blocked_vs_naive"] = out["naive_s"] / out["blocked_s"]
  out["speedup_ragged_vs_naive"] = out["naive_s"] / out["ragged_s"]
  out.update(tokens=tokens, dim=dim, experts=experts, top_k=top_k, width=width)
  return out


def rollout(model_def, params, rows, prompt, new, seed):
  """KV-cache prefill + decode sampling (the engine's path); recorded logp and routes."""
  model = model_def.merge(params)
  rng = np.random.RandomState(seed)
  t, v = prompt + new, model.config.vocab_size
  ids = np.zeros((rows, t), np.int32)
  ids[:, :prompt] = rng.randint(0, v, (rows, prompt))
  routes = np.zeros((rows, t, len(model.config.moe_layers), model.config.num_experts_per_tok),
                    np.int32)
  logp = np.zeros((rows, t), np.float32)
  pos = np.broadcast_to(np.arange(t, dtype=np.int32), (rows, t))
  prefill = jax.jit(lambda p, i, q, c: model_def.merge(p).decode(i, q, c, return_routes=True))
  head = jax.jit(lambda p, h: jax.nn.log_softmax(model_def.merge(p).logits_from_hidden(h)))
  h, cache, r = prefill(params, jnp.asarray(ids[:, :prompt]), jnp.asarray(pos[:, :prompt]),
                        model.init_cache(rows, t))
  routes[:, :prompt] = np.asarray(r)
  for i in range(prompt, t):
    lp = np.asarray(head(params, h[:, -1]), np.float64)
    p = np.exp(lp)
    tok = np.array([rng.choice(v, p=row / row.sum()) for row in p])
    ids[:, i], logp[:, i] = tok, lp[np.arange(rows), tok]
    if i + 1 < t:
      h, cache, r = prefill(params, jnp.asarray(ids[:, i:i + 1]), jnp.asarray(pos[:, i:i + 1]),
                            cache)
      routes[:, i] = np.asarray(r[:, 0])
  mask = np.zeros((rows, t), np.float32)
  mask[:, prompt:] = 1
  return dict(input_ids=jnp.asarray(ids), positions=jnp.asarray(pos),
              segment_ids=jnp.ones((rows, t), jnp.int32), loss_mask=jnp.asarray(mask),
              rollout_logp=jnp.asarray(logp), routed_experts=jnp.asarray(routes))


def mismatch(args):
  config = get_preset("tiny", architecture="qwen3_moe", vocab_size=512, hidden_size=128,
                      intermediate_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                      head_dim=32, num_experts=16, num_experts_per_tok=4,
                      moe_intermediate_size=64, initializer_range=0.1)
  model_def, params = split_model(create_model(config, seed=0))
  if args.sampler == "bf16":
    sampler_def, _ = split_model(create_model(config.replace(dtype="bfloat16"), seed=0))
    sampler_params = params
  else:
    sampler_def, rng = model_def, np.random.RandomState(1)
    sampler_params = {k: (v + jnp.asarray(args.noise * rng.randn(*v.shape), v.dtype)
                          if k.endswith("router_kernel") else v) for k, v in params.items()}
  batch = rollout(sampler_def, sampler_params, args.rows, args.prompt, args.new, seed=2)
  learner = jax.jit(lambda p, b: model_def.merge(p).hidden_routed(
      b["input_ids"], b["positions"], b["segment_ids"])[1].experts)
  own = np.sort(np.asarray(learner(params, batch))[:, :-1], -1)
  rec = np.sort(np.asarray(batch["routed_experts"])[:, :-1], -1)
  scored = slice(args.prompt, None)
  out = {}
  for replay in (False, True):
    fn = jax.jit(ts.make_logprob_fn(model_def, temperature=1.0, routing_replay=replay))
    lp = np.asarray(fn(params, batch)[0])[:, scored]
    d = lp - np.asarray(batch["rollout_logp"])[:, scored]
    # Decisions the learner's forward used: its own top-k, or the recorded ones under replay.
    used = rec if replay else own
    slots = np.mean([len(np.setdiff1d(a, b)) / a.size
                     for a, b in zip(used.reshape(-1, own.shape[-1]),
                                     rec.reshape(-1, own.shape[-1]))])
    tokens = np.mean(np.any(used != rec, axis=(2, 3)))
    out["replay" if replay else "no_replay"] = dict(
        router_decisions_differ=float(slots), tokens_differ_any_layer=float(tokens),
        dlogp_p50=float(np.percentile(np.abs(d), 50)),
        dlogp_p99=float(np.percentile(np.abs(d), 99)), dlogp_max=float(np.abs(d).max()),
        ratio_min=float(np.exp(d.min())), ratio_max=float(np.exp(d.max())))
  out.update(sampler=args.sampler, noise=args.noise if args.sampler == "noise" else None,
             rows=args.rows, sampled_tokens=args.rows * args.new,
             experts=config.num_experts, top_k=config.num_experts_per_tok,
             moe_layers=len(config.moe_layers))
  return out


def main(argv):
  del argv
  args = FLAGS
  common.emit(dict(
      benchmark="moe_routing", backend=jax.default_backend(),
      grouped_vs_naive=time_experts(args.tokens, args.dim, args.experts, args.top_k,
                                    args.width, args.repeats),
      mismatch=mismatch(args)))


if __name__ == "__main__":
  app.run(main)
