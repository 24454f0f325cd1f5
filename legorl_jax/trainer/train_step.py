"""The learner's pure update: teacher-forced logprobs through the fused lm-head op, policy loss,
gradient accumulation over micro-batches, one optax update.

A device batch holds ``[B, T]`` arrays aligned with token ids (entry ``t`` describes token
``t``): ``input_ids`` int32, ``positions`` int32, ``segment_ids`` int32 (0 = padding; several
sequences may share a row), ``loss_mask`` f32 (1 on sampled tokens), ``advantages`` f32,
``rollout_logp`` f32 (recorded by the sampler), optionally ``old_logp`` f32 (learner at
rollout time), ``returns`` / ``old_values`` f32 (PPO critic), ``demo_mask`` f32 (1 on the
tokens of replayed SFT demonstrations, which also have ``loss_mask`` 1: they get the NLL term
of ``loss.demo_replay_weight`` instead of a policy-gradient term), and for mixture-of-experts
policies optionally ``routed_experts`` int8/int16/int32 ``[B, T, L_moe, k]`` (the experts the
sampler selected for every token, prompt tokens included: the prefill records them), used
instead of recomputing top-k when ``trainer.routing_replay`` is true (rollout routing replay).
Token ``t+1`` is predicted from position ``t``; a prediction across a segment boundary is never
scored.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from legorl_jax import errors
from legorl_jax.models.params import ModelDef, Params
from legorl_jax.rl import aggregation as agg
from legorl_jax.rl import losses as rl_losses
from legorl_jax.rl import metrics as rl_metrics
from legorl_jax.rl.token_logprobs import token_logprobs
from legorl_jax.trainer import trainable as trainable_lib
from legorl_jax.trainer.state import TrainState

Batch = dict[str, jax.Array]
REQUIRED_KEYS = ("input_ids", "positions", "segment_ids", "loss_mask", "advantages")
# Optional f32 [B, T, D]: the frozen trunk's output for the batch (``make_trunk_fn``); the step
# then runs only the trained blocks and the head.
TRUNK_KEY = "trunk"
ROUTES_KEY = "routed_experts"
# Optional f32 [B, T]: 1 on replayed demonstration tokens (``loss.demo_replay_weight``).
DEMO_KEY = "demo_mask"


def replay_batch(batch: Batch, routing_replay: bool) -> Batch:
  """The batch the forward sees: without replay the recorded routes are dropped (top-k is
  recomputed); with it they must be there."""
  if not routing_replay:
    return {k: v for k, v in batch.items() if k != ROUTES_KEY}
  if batch.get(ROUTES_KEY) is None:
    raise errors.TrainerError(
        f"trainer.routing_replay=True but the batch has no {ROUTES_KEY!r} [B, T, L_moe, k]; "
        f"record routes in the sampler (return_routes) or set trainer.routing_replay=False.")
  return batch


def _within_segment(segment_ids: jax.Array) -> jax.Array:
  """bool [B, T-1]: the predicted token is real and in the same segment as its context."""
  return (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)


def shifted(batch: Batch) -> dict[str, jax.Array]:
  """Aligns per-token arrays with next-token predictions: ``[B, T] -> [B, T-1]``.

  Returns the targets (``input_ids[:, 1:]``), the scored mask (loss mask of the predicted
  token, zero across segment boundaries) and every other per-token array shifted likewise.
  """
  seg = batch["segment_ids"]
  same = _within_segment(seg)
  out = {"targets": batch["input_ids"][:, 1:],
         "segment_ids": jnp.where(same, seg[:, 1:], 0),
         "loss_mask": batch["loss_mask"][:, 1:].astype(jnp.float32) * same}
  for k in ("advantages", "rollout_logp", "old_logp", "ref_logp", "returns", "old_values",
            DEMO_KEY):
    if batch.get(k) is not None:
      out[k] = batch[k][:, 1:].astype(jnp.float32)
  return out


def scored_mask(batch: Batch) -> jax.Array:
  """bool [B, T-1]: next-token predictions that enter the loss (see ``shifted``)."""
  return (batch["loss_mask"][:, 1:] > 0) & _within_segment(batch["segment_ids"])


def forward_logprobs(model_def: ModelDef, params: Params, batch: Batch, *, temperature: float,
                     impl: str | None = None, value_head=None, scored_cap: int | None = None,
                     shared_prefix: tuple[int, int] | None = None,
                     trunk: jax.Array | None = None, trunk_layer: int = 0,
                     router_aux: bool = False):
  """Teacher-forced logprobs of next tokens.

  With ``scored_cap`` (static), the lm head runs only on the scored predictions (at most
  ``scored_cap`` per call; agent trajectories are mostly prompt, so this skips most of the
  ``[N, D] x [D, V]`` work); other positions get logp = entropy = 0. The caller guarantees the
  cap is not exceeded (``scored_cap_for``). Logits are never materialised. ``shared_prefix``
  (static ``(P, L)``) marks grouped rows: a shared prompt and its branches
  (``batching.make_grouped_batches``). With ``trunk`` ([B, T, D], the input of block
  ``trunk_layer`` as ``Decoder.trunk`` gives it: a frozen trunk's output computed once, see
  ``trainer.trunk_cache``), only blocks ``trunk_layer ..`` and the head run.

  Returns ``(logp [B, T-1], entropy [B, T-1], values [B, T-1] or None)`` in float32; with
  ``router_aux`` (mixture-of-experts policies) also the router's load-balancing loss (f32
  scalar, ``RouteInfo.aux_loss``: mean over sparse layers, valid tokens) as a fourth element.
  """
  model = model_def.merge(params)
  routes = batch.get(ROUTES_KEY)
  if (routes is not None or router_aux) and trunk is not None:
    raise errors.ConfigError("trainer.routing_replay and loss.router_aux_coef do not combine "
                             "with sft.trunk_cache / a frozen-trunk batch; turn one of them off.")
  aux = None
  if routes is not None or router_aux:
    hidden, info = model.hidden_routed(batch["input_ids"], batch["positions"],
                                       batch["segment_ids"], experts=routes,
                                       shared_prefix=shared_prefix)
    aux = info.aux_loss
  elif trunk is None:
    hidden = model.hidden(batch["input_ids"], batch["positions"], batch["segment_ids"],
                          shared_prefix=shared_prefix)
  else:
    hidden = model.hidden_from(trunk.astype(model.config.compute_dtype), trunk_layer,
                               batch["positions"], batch["segment_ids"], shared_prefix=shared_prefix)
  h = hidden[:, :-1]
  b, t, d = h.shape
  targets = batch["input_ids"][:, 1:].reshape(-1).astype(jnp.int32)
  h_flat, lm_head = h.reshape(b * t, d), model.lm_head_kernel().astype(h.dtype)
  if scored_cap is None or scored_cap >= b * t:
    logp, ent = token_logprobs(h_flat, lm_head, targets, temperature=temperature, impl=impl)
  else:
    flat_mask = scored_mask(batch).reshape(-1)
    (idx,) = jnp.nonzero(flat_mask, size=scored_cap, fill_value=0)
    live = jnp.arange(scored_cap) < jnp.sum(flat_mask)
    lp, en = token_logprobs(h_flat[idx], lm_head, targets[idx], temperature=temperature, impl=impl)
    logp = jnp.zeros(b * t, jnp.float32).at[idx].add(jnp.where(live, lp, 0.0))
    ent = jnp.zeros(b * t, jnp.float32).at[idx].add(jnp.where(live, en, 0.0))
  values = None
  if value_head is not None:
    values = (h.astype(jnp.float32) @ value_head["kernel"] + value_head["bias"])[..., 0]
  if router_aux:
    return logp.reshape(b, t), ent.reshape(b, t), values, aux
  return logp.reshape(b, t), ent.reshape(b, t), values


def split_demo(sb: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """A shifted batch with its replayed demonstration tokens taken out of ``loss_mask`` (they
  get no policy-gradient term) and kept as ``demo_mask`` (scored tokens only); unchanged
  without ``DEMO_KEY``."""
  if DEMO_KEY not in sb:
    return sb
  demo = sb[DEMO_KEY] * (sb["loss_mask"] > 0)
  return dict(sb, loss_mask=sb["loss_mask"] * (1.0 - demo), **{DEMO_KEY: demo})


def loss_denominators(sb: dict[str, jax.Array], cfg) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Global (policy, value, demonstration-replay) denominators: they depend on masks only, not
  on parameters. The third is the number of replayed demonstration tokens (0 without any)."""
  sb = split_demo(sb)
  zeros = jnp.zeros_like(sb["loss_mask"])
  _, d_pol = agg.aggregate(zeros, agg.token_mask(sb["loss_mask"], sb["segment_ids"]),
                           sb["segment_ids"], mode=cfg.loss.aggregation, max_len=cfg.loss.get("max_len"))
  _, d_val = agg.aggregate(zeros, agg.token_mask(sb["loss_mask"], sb["segment_ids"]),
                           sb["segment_ids"], mode="token-mean")
  d_demo = jnp.sum(sb[DEMO_KEY]) if DEMO_KEY in sb else jnp.zeros((), jnp.float32)
  return d_pol, d_val, d_demo


def _split_micro(batch: Batch, n: int) -> Batch:
  b = batch["input_ids"].shape[0]
  if b % n:
    raise errors.ConfigError(
        f"trainer.micro_batches={n} must divide the batch size {b}; change one of them.")
  return {k: v.reshape(n, b // n, *v.shape[1:]) for k, v in batch.items() if v is not None}


LOSS_TERMS = ("loss/policy", "loss/value", "loss/demo_nll")  # final per update, not token sums
SCORED_CAP_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 5 / 8, 3 / 4, 7 / 8)


def scored_cap_for(batch: dict, n_micro: int) -> int | None:
  """Host side: the smallest cap in a few fixed fractions of a micro-batch's predictions that
  holds every micro-batch's scored tokens (None = run the lm head on all of them). A handful
  of possible values keeps the number of compilations small."""
  import numpy as np
  seg, mask = np.asarray(batch["segment_ids"]), np.asarray(batch["loss_mask"])
  scored = (mask[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
  rows = scored.shape[0] // n_micro
  need = max(int(scored[i * rows:(i + 1) * rows].sum()) for i in range(n_micro))
  total = rows * scored.shape[1]
  for frac in SCORED_CAP_FRACTIONS:
    cap = max(1, int(total * frac))
    if need <= cap:
      return cap
  return None


def make_train_step(model_def: ModelDef, optimizer: optax.GradientTransformation, cfg,
                    plan: trainable_lib.Plan | None = None
                    ) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
  """Builds ``train_step(state, batch, frozen=None, scored_cap=None, shared_prefix=None)
  -> (state, metrics)`` (pure, unjitted; ``scored_cap`` and ``shared_prefix`` must be static
  under jit, see ``scored_cap_for`` and ``batching.make_grouped_batches``).

  ``state.params`` holds the trainable parameters of ``plan`` (default: from
  ``cfg.trainer.trainable``, "all" when unset) and ``frozen`` the rest of the base model
  (``{}`` or None for "all"); the step runs on ``plan.forward_params(frozen, state.params)``
  (the merged policy; LoRA kernels applied as low-rank products) and differentiates only the
  trainables. With ``loss.kl_coef > 0`` the KL reference is the policy
  of ``state.ref_params`` on the same frozen base.

  ``cfg`` fields: ``loss.name`` (a key of ``rl.POLICY_LOSSES``), the ``rl.LossConfig`` knobs under
  ``loss``, ``loss.temperature`` (the sampling temperature), ``loss.vf_coef``,
  ``loss.vf_clip``, ``trainer.micro_batches``, ``trainer.logprob_impl``, ``trainer.trainable``,
  ``trainer.routing_replay`` (use the batch's ``routed_experts``; default False),
  ``loss.router_aux_coef`` (mixture-of-experts: weight of the router's load-balancing loss,
  meant for SFT, e.g. the checkpoint's ``router_aux_loss_coef``; default 0, RL leaves it off:
  balancing would pull the policy away from the routes it was sampled with). Each
  micro-batch's load-balancing loss enters weighted by its scored tokens over the step's, so
  accumulated batches add up to the token-weighted mean; metric ``router_aux_loss``.
  """
  loss_name = cfg.loss.name
  if loss_name not in rl_losses.POLICY_LOSSES:
    raise errors.ConfigError(
        f"loss.name={loss_name!r} is unknown; choose one of {sorted(rl_losses.POLICY_LOSSES)}.")
  n_micro = int(cfg.trainer.get("micro_batches", 1))
  temperature = float(cfg.loss.get("temperature", 1.0))
  impl = cfg.trainer.get("logprob_impl", None)
  vf_coef = float(cfg.loss.get("vf_coef", 0.0))
  vf_clip = cfg.loss.get("vf_clip", None)
  if plan is None:
    plan = trainable_lib.plan_for(cfg.trainer, model_def.shapes())
  trunk_layer = plan.lowest_trained_layer(model_def.shapes())
  routing_replay = bool(cfg.trainer.get("routing_replay", False))
  aux_coef = float(cfg.loss.get("router_aux_coef", 0.0) or 0.0)
  if aux_coef < 0:
    raise errors.ConfigError(f"loss.router_aux_coef={aux_coef} must be >= 0 (0 = off).")
  demo_weight = float(cfg.loss.get("demo_replay_weight", 0.0) or 0.0)
  if demo_weight < 0:
    raise errors.ConfigError(f"loss.demo_replay_weight={demo_weight} must be >= 0 (0 = off).")

  def micro_loss(trainable, mb, frozen, ref_params, d_pol, d_val, d_demo, scored_cap,
                 shared_prefix):
    params = plan.forward_params(frozen, trainable["policy"])
    trunk = dict(trunk=mb[TRUNK_KEY], trunk_layer=trunk_layer) if TRUNK_KEY in mb else {}
    out = forward_logprobs(model_def, params, mb, temperature=temperature, impl=impl,
                           value_head=trainable["value_head"], scored_cap=scored_cap,
                           shared_prefix=shared_prefix, router_aux=aux_coef > 0, **trunk)
    logp, ent, values = out[:3]
    sb = split_demo(shifted(mb))
    demo = sb.pop(DEMO_KEY, None)
    if ref_params is not None:  # the same frozen trunk: its states serve the reference too
      ref_logp, _, _ = forward_logprobs(model_def, plan.forward_params(frozen, ref_params), mb,
                                        temperature=temperature, impl=impl,
                                        scored_cap=scored_cap, shared_prefix=shared_prefix,
                                        **trunk)
      sb["ref_logp"] = jax.lax.stop_gradient(ref_logp)
    sb.update(logp=logp, entropy=ent)
    pl_sum, _, m = rl_losses.policy_loss(loss_name, sb, cfg.loss)
    total = pl_sum / d_pol
    m["pg_objective_sum"] = pl_sum  # merged by sum; finalized below against d_pol
    if demo is not None:
      nll_sum, n_demo = rl_losses.demo_replay_nll(logp, demo)
      total = total + demo_weight * nll_sum / d_demo
      m["demo_nll_total"] = jax.lax.stop_gradient(nll_sum)
      m["demo_tokens"] = n_demo
    if aux_coef > 0:
      total = total + aux_coef * out[3] * m["tokens"] / d_val
      m["router_aux_loss_sum"] = jax.lax.stop_gradient(out[3]) * m["tokens"]
    if values is not None and vf_coef:
      vl_sum, _, vm = rl_losses.value_loss(values, sb["old_values"], sb["returns"], sb["loss_mask"],
                                           sb["segment_ids"], clip_eps=vf_clip)
      total = total + vf_coef * vl_sum / d_val
      m["vf_loss_total"] = vl_sum
      m["vf_clip_frac_sum"] = vm["vf_clip_frac_sum"]
    return total, m

  grad_fn = jax.grad(micro_loss, has_aux=True)

  def batch_grads(state: TrainState, batch: Batch, frozen: Params | None = None,
                  scored_cap: int | None = None, shared_prefix: tuple[int, int] | None = None,
                  denominators: tuple[jax.Array, jax.Array] | None = None):
    """(grads, summed metrics) of ``batch``'s loss sums over ``denominators`` (default: the
    batch's own, ``loss_denominators``). With the denominators of several batches added, the
    grads of the batches add up to the grad of their global mean (``apply_grads`` once)."""
    frozen = {} if frozen is None else frozen
    batch = replay_batch(batch, routing_replay)
    if denominators is None:
      denominators = loss_denominators(shifted(batch), cfg)
    d_pol, d_val, d_demo = (jnp.maximum(d, 1e-8) for d in denominators)
    trainable = state.trainable()
    ref_params = state.ref_params
    micro = _split_micro(batch, n_micro)

    def body(carry, mb):
      g_acc, m_acc = carry
      g, m = grad_fn(trainable, mb, frozen, ref_params, d_pol, d_val, d_demo, scored_cap,
                     shared_prefix)
      g_acc = jax.tree.map(jnp.add, g_acc, g)
      m_acc = m if m_acc is None else rl_metrics.merge_metrics(m_acc, m)
      return (g_acc, m_acc), None

    zeros = jax.tree.map(jnp.zeros_like, trainable)
    first = jax.tree.map(lambda x: x[0], micro)
    (g0, m0), _ = body((zeros, None), first)
    if n_micro > 1:
      rest = jax.tree.map(lambda x: x[1:], micro)
      (grads, metrics), _ = jax.lax.scan(body, (g0, m0), rest)
    else:
      grads, metrics = g0, m0
    metrics["loss/policy"] = metrics.pop("pg_objective_sum") / d_pol
    vl = metrics.pop("vf_loss_total", None)
    if vl is not None:
      metrics["loss/value"] = vl / d_val
    nll = metrics.pop("demo_nll_total", None)
    if nll is not None:  # the replayed demonstrations' token NLL (the weight's multiplicand)
      metrics["loss/demo_nll"] = nll / d_demo
    return grads, metrics

  def apply_grads(state: TrainState, grads):
    """One optimizer update with ``grads``; (new state, grad and parameter norms)."""
    trainable = state.trainable()
    updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
    new = optax.apply_updates(trainable, updates)
    norms = {"grad_norm": optax.global_norm(grads), "param_norm": optax.global_norm(new["policy"])}
    return state.replace(step=state.step + 1, params=new["policy"],
                         value_head=new["value_head"], opt_state=opt_state), norms

  def train_step(state: TrainState, batch: Batch, frozen: Params | None = None,
                 scored_cap: int | None = None, shared_prefix: tuple[int, int] | None = None):
    grads, metrics = batch_grads(state, batch, frozen, scored_cap, shared_prefix)
    loss_terms = {k: metrics.pop(k) for k in LOSS_TERMS if k in metrics}
    out = rl_metrics.finalize_metrics(metrics)
    out.update(loss_terms)
    new_state, norms = apply_grads(state, grads)
    out.update(norms)
    return new_state, out

  train_step.batch_grads, train_step.apply_grads = batch_grads, apply_grads
  return train_step


def make_trunk_fn(model_def: ModelDef, plan: trainable_lib.Plan):
  """``fn(trainable, frozen, batch, shared_prefix=None) -> [B, T, D]`` float32: the input of
  the lowest trained block (``plan.lowest_trained_layer``), which depends on frozen parameters
  only (the trained blocks do not run). Fed back as ``batch[TRUNK_KEY]``, the train step skips
  the blocks below it with the same result."""
  stop = plan.lowest_trained_layer(model_def.shapes())

  def fn(trainable, frozen, batch, shared_prefix=None):
    model = model_def.merge(plan.forward_params(frozen, trainable))
    x = model.trunk(batch["input_ids"], stop, batch["positions"], batch["segment_ids"],
                    shared_prefix=shared_prefix)
    return x.astype(jnp.float32)

  return fn


def make_logprob_fn(model_def: ModelDef, *, temperature: float, impl: str | None = None,
                    plan: trainable_lib.Plan | None = None, routing_replay: bool = False):
  """``fn(params, batch, shared_prefix=None) -> (logp [B, T], entropy [B, T])`` aligned with
  tokens (column 0 is 0), for old/reference logprobs and sampler-vs-learner agreement checks.

  With ``plan``, ``fn(trainable, frozen, batch, shared_prefix=None)``: the policy of
  ``plan.forward_params(frozen, trainable)``; a batch with ``TRUNK_KEY`` (the input of the
  plan's lowest trained block) runs from there. ``routing_replay``: use the batch's
  ``routed_experts`` (``replay_batch``)."""

  trunk_layer = plan.lowest_trained_layer(model_def.shapes()) if plan is not None else 0

  def full(params, batch, shared_prefix=None):
    batch = replay_batch(batch, routing_replay)
    # A batch carrying its frozen trunk's output (``TRUNK_KEY``) runs only the trained blocks.
    trunk = dict(trunk=batch[TRUNK_KEY], trunk_layer=trunk_layer) if TRUNK_KEY in batch else {}
    logp, ent, _ = forward_logprobs(model_def, params, batch, temperature=temperature, impl=impl,
                                    shared_prefix=shared_prefix, **trunk)
    pad = jnp.zeros((logp.shape[0], 1), jnp.float32)
    return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)

  if plan is None:
    return full
  return lambda trainable, frozen, batch, shared_prefix=None: full(
      plan.forward_params(frozen, trainable), batch, shared_prefix)


def batch_shardings(batch: Batch, mesh: Mesh) -> dict[str, NamedSharding]:
  """Leading (batch) axis over ``data`` x ``fsdp``; everything else replicated."""
  axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
  return {k: NamedSharding(mesh, P(axes, *([None] * (v.ndim - 1)))) for k, v in batch.items()}


def jit_train_step(train_step, state_sh: TrainState, batch_sh, frozen_sh=None,
                   compiler_options: dict | None = None):
  """Jits with explicit shardings and a donated state (updated in place on device); with
  ``frozen_sh`` the step takes the frozen params (never donated) as its third argument.

  ``compiler_options``: see ``compile_options.learner_compiler_options``.
  """
  in_sh = (state_sh, batch_sh) if frozen_sh is None else (state_sh, batch_sh, frozen_sh)
  return jax.jit(train_step, in_shardings=in_sh, out_shardings=(state_sh, None),
                 donate_argnums=(0,), static_argnames=("scored_cap", "shared_prefix"),
                 compiler_options=compiler_options)
