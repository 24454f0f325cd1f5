"""The learner object the loops drive: state on the mesh, one jitted update, weight export.

Everything on device goes through two jitted functions (``train_step``, ``logprobs``); the
class only keeps the state (the trainable parameters, ``trainer.trainable``) and the frozen
rest of the base model, and hands out parameter copies for the sampler (a device-side copy,
because the update donates its input buffers): the full merged policy (``params_copy``) or
only what an update changed (``sync_params``).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from legorl_jax import errors
from legorl_jax.models.params import split_model
from legorl_jax.rl import metrics as rl_metrics
from legorl_jax.trainer import batching
from legorl_jax.sharding import make_mesh
from legorl_jax.trainer import compile_options
from legorl_jax.trainer import optimizer as opt_lib
from legorl_jax.trainer import state as state_lib
from legorl_jax.trainer import train_step as ts
from legorl_jax.trainer import trainable as trainable_lib


@jax.jit
def _device_copy(tree):
  return jax.tree.map(jnp.copy, tree)


def merge_update_metrics(merged: dict[str, float], m, i: int) -> None:
  """Folds update ``i``'s metrics into ``merged``: sums and counts add, maxima max, means
  (already final per update) average over the updates."""
  for k, v in m.items():
    v = float(v)
    if k not in merged:
      merged[k] = v
    elif k.endswith(("_max", "_p99")):
      merged[k] = max(merged[k], v)
    elif k in ("tokens", "seqs"):
      merged[k] += v
    else:
      merged[k] = merged[k] + (v - merged[k]) / (i + 1)


def _recorded_route_counts(batch) -> tuple[int, int]:
  """(tokens with a recorded route in every sparse layer, tokens) of a host batch."""
  tokens = np.asarray(batch["segment_ids"]) > 0
  recorded = (np.asarray(batch[ts.ROUTES_KEY]) >= 0).all(axis=(-1, -2)) & tokens
  return int(recorded.sum()), int(tokens.sum())


class Learner:
  """Holds ``TrainState`` (sharded over ``cfg.mesh``) and applies updates.

  ``start``: trainable parameters to begin from instead of the model's own (another learner's
  ``trainables()`` on the same base, e.g. the SFT phase's LoRA adapters for RL); the frozen
  part always comes from ``model``.

  ``trainer.routing_replay`` (mixture-of-experts policies): every forward replays the batch's
  ``routed_experts`` (the sampler's routes, ``batching``); tokens without one, and batches
  without any (SFT demonstrations), use the learner's own top-k. ``update`` then reports
  ``routes_recorded_frac``, the share of tokens that replayed a recorded route.
  """

  def __init__(self, model, cfg, seed: int = 0, start=None):
    self.cfg = cfg
    self.model_def, base = split_model(model)
    self.plan = trainable_lib.plan_for(cfg.trainer, base)
    frozen, params = self.plan.split(base, seed=int(seed) + 7919)
    if start is not None:
      if set(start) != set(params) or any(start[k].shape != params[k].shape for k in params):
        raise errors.ConfigError(
            "Learner start parameters do not match trainer.trainable="
            f"{cfg.trainer.get('trainable', 'all')!r} of this model; start a phase with the "
            "same trainer.trainable (and LoRA rank/targets) as the phase it continues.")
      params = start
    params = _device_copy(params)  # the update donates its state: never the caller's arrays
    self.optimizer = opt_lib.make_optimizer(cfg.optim)
    ref = _device_copy(params) if float(cfg.loss.get("kl_coef", 0.0) or 0.0) > 0 else None
    state = state_lib.create_train_state(params, self.optimizer, seed=seed, ref_params=ref)
    mesh_cfg = cfg.get("mesh", None)
    self.mesh = None
    step_fn = ts.make_train_step(self.model_def, self.optimizer, cfg, plan=self.plan)
    self.compiler_options = compile_options.learner_compiler_options(cfg.trainer)
    if mesh_cfg is not None and jax.device_count() > 1:
      self.mesh = make_mesh(mesh_cfg.get("data", 1), mesh_cfg.get("fsdp", -1), mesh_cfg.get("tensor", 1))
      self.state_sh = state_lib.state_shardings(state, self.model_def, self.mesh)
      state = jax.device_put(state, self.state_sh)
      param_sh = self.model_def.shardings(self.mesh)
      self.frozen_sh = {k: param_sh[k] for k in frozen}
      frozen = jax.device_put(frozen, self.frozen_sh)
      self._step = None
      self._step_fn = step_fn
      self._sharded_steps = {}
    else:
      self.state_sh = self.frozen_sh = None
      # Committed to the device, as a restored checkpoint's arrays are: a fresh and a resumed
      # run then lower the same update program (an uncommitted argument lowers without a
      # sharding, a committed one with it), and the resumed run finds it in the compile cache.
      state = jax.device_put(state, jax.devices()[0])
      self._step = jax.jit(step_fn, donate_argnums=(0,),
                           static_argnames=("scored_cap", "shared_prefix"),
                           compiler_options=self.compiler_options)
    # trainer.accumulate: one optimizer update per step over every batch (their gradients
    # against the global loss denominator add up), instead of one update per batch.
    self._grads = jax.jit(step_fn.batch_grads, static_argnames=("scored_cap", "shared_prefix"),
                          compiler_options=self.compiler_options)
    self._apply = jax.jit(step_fn.apply_grads, donate_argnums=(0,))
    self._denominators = jax.jit(lambda b: ts.loss_denominators(ts.shifted(b), cfg))
    self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=(0,))
    self.state = state
    self.frozen = frozen  # never donated, never checkpointed: rebuilt from the base model
    # trainer.routing_replay: the forward uses the sampler's routes (batch "routed_experts").
    self._replay = bool(cfg.trainer.get("routing_replay", False))
    mc = model.config
    if self._replay and not mc.moe_layers:
      raise errors.ConfigError(
          f"trainer.routing_replay=True needs a mixture-of-experts policy (qwen3_moe); this "
          f"{mc.architecture} model routes nothing: set trainer.routing_replay=False.")
    self._route_shape = (len(mc.moe_layers), mc.num_experts_per_tok)
    self._route_dtype = np.dtype(mc.route_dtype)
    self._logprob = jax.jit(ts.make_logprob_fn(
        self.model_def, temperature=float(cfg.loss.get("temperature", 1.0)),
        impl=cfg.trainer.get("logprob_impl", None), plan=self.plan,
        routing_replay=self._replay),
        static_argnames=("shared_prefix",), compiler_options=self.compiler_options)
    self._trunk = jax.jit(ts.make_trunk_fn(self.model_def, self.plan),
                          static_argnames=("shared_prefix",), compiler_options=self.compiler_options)
    self._merge = jax.jit(self.plan.merge)
    self._changed = jax.jit(self.plan.changed)

  @property
  def step(self) -> int:
    return int(self.state.step)

  def _jitted(self, batch, cap, layout):
    """The update for ``batch``'s keys; on a mesh, one jitted step per (scored-token cap,
    layout) (both closed over: jit with explicit in_shardings takes positional arguments only)."""
    if self.mesh is None:
      return functools.partial(self._step, scored_cap=cap, shared_prefix=layout)
    key = (cap, layout)
    if key not in self._sharded_steps:  # batch shardings depend on keys and ranks only
      self._sharded_steps[key] = ts.jit_train_step(
          functools.partial(self._step_fn, scored_cap=cap, shared_prefix=layout),
          self.state_sh, ts.batch_shardings(batch, self.mesh), self.frozen_sh,
          compiler_options=self.compiler_options)
    return self._sharded_steps[key]

  def update(self, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Optimizer updates over ``batches``; returns metrics merged over the updates (sums and
    counts add, maxima max) plus ``learner_tokens``, ``learner_time_s`` and
    ``optimizer_updates``.

    By default one update per batch. ``trainer.accumulate``: one update over all of them (the
    exact gradient of the step's global loss mean). ``trainer.updates_per_batch`` (mu): that
    many passes over the batches, every pass's ratios against the logprobs the step started
    from (so the clip bounds how far the passes move the policy)."""
    merged, t0, tokens = {}, time.perf_counter(), 0
    passes = max(1, int(self.cfg.trainer.get("updates_per_batch", 1)))
    accumulate = bool(self.cfg.trainer.get("accumulate", False))
    score_old = ((len(batches) > 1 or passes > 1) and "old_logp" not in batches[0]
                 and self.cfg.loss.name != "reinforce")
    if self._reuse_trunk(batches, passes + int(score_old)):
      # The frozen trunk's output is the same in every pass: compute it once per batch, and
      # let the scoring and every update run only the trained blocks and the head.
      batches = [b if ts.TRUNK_KEY in b else dict(b, **{ts.TRUNK_KEY: self.trunk_states(b)})
                 for b in batches]
    if score_old:
      # Every update after the first sees moved parameters: score all batches under the
      # parameters the step started from, so each batch's PPO ratio is against them (REINFORCE,
      # also the SFT loss, has no ratio).
      batches = [dict(b, old_logp=self.logprobs(b)[0]) for b in batches]
    prepared, routed = [], []
    for batch in batches:
      batch, layout = batching.split_layout(batch)
      batch = self._routed(batch)
      if self._replay and ts.ROUTES_KEY in batch:
        routed.append(_recorded_route_counts(batch))
      cap = (ts.scored_cap_for(batch, int(self.cfg.trainer.get("micro_batches", 1)))
             if self.cfg.trainer.get("lm_head_on_scored_only", True) else None)
      prepared.append(({k: jnp.asarray(v) for k, v in batch.items()}, cap, layout))
      tokens += int(np.sum(batch["segment_ids"] > 0))
    n_updates = 0
    for _ in range(passes):
      if accumulate:
        merge_update_metrics(merged, self._accumulated_update(prepared), n_updates)
        n_updates += 1
        continue
      for dev, cap, layout in prepared:
        self.state, m = self._jitted(dev, cap, layout)(self.state, dev, self.frozen)
        merge_update_metrics(merged, m, n_updates)
        n_updates += 1
    if routed:  # how much of what the learner saw replayed the sampler's routes
      merged["routes_recorded_frac"] = sum(r for r, _ in routed) / max(sum(n for _, n in routed), 1)
    merged["optimizer_updates"] = n_updates
    merged["learner_tokens"] = tokens * passes
    merged["learner_time_s"] = time.perf_counter() - t0
    merged["learner_tokens_per_s"] = tokens * passes / max(merged["learner_time_s"], 1e-9)
    return merged

  def _reuse_trunk(self, batches, forwards: int) -> bool:
    """Whether ``update`` computes each batch's frozen-trunk states once for its ``forwards``
    passes (``trainer.reuse_trunk``, default on): only with a frozen trunk (``top:K``, or LoRA
    in the top blocks only), one device, more than one pass, and no mixture-of-experts routes
    (the routed forward does not take trunk states)."""
    return (bool(self.cfg.trainer.get("reuse_trunk", True)) and forwards > 1
            and self.mesh is None and self.trunk_layer > 0 and bool(batches)
            and all(batching.ROUTES_KEY not in b for b in batches)
            and not bool(self.cfg.trainer.get("routing_replay", False))
            and not float(self.cfg.loss.get("router_aux_coef", 0.0) or 0.0) > 0)

  def _accumulated_update(self, prepared) -> dict:
    """One optimizer update from the summed gradients of every prepared batch."""
    dens = [self._denominators(dev) for dev, _, _ in prepared]
    total = tuple(sum(d[i] for d in dens) for i in range(3))
    grads = summed = None
    for dev, cap, layout in prepared:
      g, m = self._grads(self.state, dev, self.frozen, scored_cap=cap, shared_prefix=layout,
                         denominators=total)
      grads = g if grads is None else self._add(grads, g)
      summed = m if summed is None else rl_metrics.merge_metrics(summed, m)
    loss_terms = {k: summed.pop(k) for k in ts.LOSS_TERMS if k in summed}
    out = rl_metrics.finalize_metrics(summed)
    out.update(loss_terms)
    self.state, norms = self._apply(self.state, grads)
    out.update(norms)
    return out

  def logprobs(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced (logp, entropy) ``[B, T]`` aligned with tokens, current parameters."""
    batch, layout = batching.split_layout(batch)
    dev = {k: jnp.asarray(v) for k, v in self._routed(batch).items()}
    logp, ent = self._logprob(self.state.params, self.frozen, dev, shared_prefix=layout)
    return np.asarray(logp), np.asarray(ent)

  def _routed(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The host batch the device gets. Without replay its routes stay behind. With replay, a
    batch that carries none (SFT demonstrations: no sampler produced them) gets -1 for every
    token, which is the learner's own top-k (``moe.route``), as for any unrecorded token
    (a frozen-trunk batch, ``trainer.trunk_cache``, stays without: its trunk ran top-k)."""
    if not self._replay:
      return ts.replay_batch(batch, False)
    if batch.get(ts.ROUTES_KEY) is not None or ts.TRUNK_KEY in batch:
      return batch
    b, t = np.shape(batch["input_ids"])
    return dict(batch, **{ts.ROUTES_KEY: np.full((b, t, *self._route_shape), -1, self._route_dtype)})

  @property
  def trunk_layer(self) -> int:
    """The lowest trained block: blocks below it are frozen (0: nothing is)."""
    return self.plan.lowest_trained_layer(self.model_def.shapes())

  def trunk_states(self, batch: dict[str, np.ndarray]) -> np.ndarray:
    """float32 ``[B, T, D]``: the input of block ``trunk_layer`` for ``batch`` (frozen
    parameters only). ``update`` takes it back as ``batch[train_step.TRUNK_KEY]`` and then runs
    only the trained blocks and the head, with the same result (``trainer.trunk_cache``)."""
    batch, layout = batching.split_layout(batch)
    dev = {k: jnp.asarray(v) for k, v in batch.items() if k != ts.TRUNK_KEY}
    return np.asarray(self._trunk(self.state.params, self.frozen, dev, shared_prefix=layout))

  def params_copy(self):
    """A device-side copy of the full (merged) policy parameters, safe to hand to the sampler."""
    if self.plan.kind == "all":
      return _device_copy(self.state.params)
    return _device_copy(self._merge(self.frozen, self.state.params))

  def sync_params(self):
    """A device-side copy of the policy parameters an update can change, for the sampler's
    ``update_params`` (which keeps the rest): all of them, the top blocks and final norm
    (``top:K``), or the merged targeted kernels (LoRA)."""
    if self.plan.kind == "lora":
      return self._changed(self.frozen, self.state.params)  # fresh arrays: nothing donated
    return _device_copy(self.state.params)

  def trainables(self):
    """A device-side copy of the trainable parameters (``start`` of a following phase)."""
    return _device_copy(self.state.params)

  def base_model(self):
    """The frozen base with this learner's current trainables, as a Decoder whose ``Learner``
    splits back into the same frozen part (LoRA: the base model itself)."""
    return self.model_def.merge(self.plan.base(self.frozen, self.state.params))

  def with_config(self, cfg, seed: int = 0) -> "Learner":
    """A new learner for another phase (``cfg``: its loss and optimizer; the same
    ``trainer.trainable``): same frozen base, starting from the current trainables, fresh
    optimizer state (and, with a KL term, the current policy as its reference)."""
    return Learner(self.base_model(), cfg, seed=seed, start=self.state.params)  # copied there

  def model(self):
    """The current policy as a Decoder (over a parameter copy)."""
    return self.model_def.merge(self.params_copy())
