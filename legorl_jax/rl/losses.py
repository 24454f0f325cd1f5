"""Policy-gradient losses over per-token arrays, with off-policy correction, KL and entropy.

All arrays are [B, T] (rows may pack several sequences, see ``aggregation``). The learner
calls ``policy_loss(name, batch, cfg)`` with ``batch`` a mapping holding:

==============  ========  ================================================================
key             needed    meaning
==============  ========  ================================================================
logp            yes       log-prob of the sampled token under the current parameters
advantages      yes       per-token advantage (a sequence's advantage broadcast to its tokens)
loss_mask       yes       1 for tokens trained on (sampled by the policy), 0 otherwise
segment_ids     no        sequence id per token, 0 = padding (None: one sequence per row)
old_logp        no        learner log-prob at rollout time; None = on-policy (stop_grad(logp))
rollout_logp    no        log-prob recorded by the sampler (needed by TIS / MIS)
ref_logp        no        frozen reference policy log-prob (needed when kl_coef > 0)
entropy         no        per-token entropy, differentiable (needed when entropy_coef > 0)
==============  ========  ================================================================

It returns ``(loss_sum, denom, metrics)``; the loss is ``loss_sum / denom`` and both add up
across micro-batches (see ``aggregation`` for each mode's denominator, ``metrics`` for how the
metrics merge). Everything is jittable; ``name`` and ``cfg`` are static.

Train/inference mismatch correction multiplies each token's policy term by a stop-gradient
weight built from ``w = exp(old_logp - rollout_logp)``: TIS truncates it at ``tis_cap``,
MIS zeroes it outside ``[mis_low, mis_high]``. At ``is_level="sequence"`` the weight is one
per sequence: the geometric mean ``exp(mean_t log w_t)`` by default, which is length-neutral
and does not overflow on long agent trajectories (``is_seq_reduce="product"`` uses the exact
sequence ratio ``exp(sum_t log w_t)`` instead).
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp

from legorl_jax.errors import ConfigError
from legorl_jax.rl import aggregation as agg
from legorl_jax.rl import metrics as mt

Array = jax.Array
sg = jax.lax.stop_gradient


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Loss knobs; an ml_collections ConfigDict with any subset of these fields works too."""
  clip_eps_low: float = 0.2        # ratio lower bound 1 - eps_low (PPO, GRPO, GSPO*).
  clip_eps_high: float = 0.2       # upper bound 1 + eps_high (DAPO clip-higher: 0.28).
  dual_clip_c: Optional[float] = None  # Dual clip for negative advantages, e.g. 3.0.
  cispo_eps_low: Optional[float] = None  # CISPO IS-weight bounds; None = no lower bound.
  cispo_eps_high: float = 4.0
  is_correction: str = "none"      # "none" | "tis" | "mis" (against rollout_logp).
  is_level: str = "token"          # "token" | "sequence".
  is_seq_reduce: str = "geo_mean"  # "geo_mean" | "product" (sequence level only).
  tis_cap: float = 2.0
  mis_low: float = 0.5
  mis_high: float = 2.0
  kl_coef: float = 0.0
  kl_estimator: str = "k3"         # "k1" | "k2" | "k3".
  entropy_coef: float = 0.0
  aggregation: str = "token-mean"  # See aggregation.AGGREGATIONS.
  max_len: Optional[int] = None    # Constant of "seq-mean-token-sum-norm".


_DEFAULTS = LossConfig()


def _cfg(cfg: Any, name: str):
  if cfg is None:
    return getattr(_DEFAULTS, name)
  try:
    value = getattr(cfg, name)
  except (AttributeError, KeyError):
    return getattr(_DEFAULTS, name)
  return value


def _float(x) -> Array:
  """Keeps floating dtypes (f32, or f64 under x64 in tests); casts anything else to f32."""
  x = jnp.asarray(x)
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def _opt(batch: Mapping[str, Any], key: str):
  value = batch.get(key)
  return None if value is None else _float(value)


# ---------------------------------------------------------------- per-token building blocks


def clipped_surrogate(ratio: Array, adv: Array, *, eps_low: float, eps_high: float,
                      dual_clip_c: Optional[float] = None) -> Tuple[Array, Dict[str, Array]]:
  """PPO clipped surrogate per token (asymmetric clip, optional dual clip).

  Args:
    ratio, adv: [B, T].
  Returns:
    loss [B, T] = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), capped at -A c for A < 0
    when ``dual_clip_c`` is set; and bool [B, T] indicators of the tokens whose gradient
    each clip removed: ``clip_low``, ``clip_high``, ``dual_clip``.
  """
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(-adv * ratio, -adv * clipped)
  aux = {"clip_low": (adv < 0) & (ratio < 1.0 - eps_low),
         "clip_high": (adv > 0) & (ratio > 1.0 + eps_high)}
  if dual_clip_c is not None:
    if dual_clip_c <= 1.0:
      raise ConfigError(f"dual_clip_c must be > 1 (got {dual_clip_c}); typical value 3.0.")
    loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip_c), loss)
    aux["dual_clip"] = (adv < 0) & (ratio > dual_clip_c)
  return loss, aux


def kl_penalty(logp: Array, ref_logp: Array, estimator: str = "k3") -> Array:
  """Per-token estimate of KL(pi || pi_ref) from samples of pi: [B, T].

  k1 = log r, k2 = (log r)^2 / 2, k3 = 1/r - 1 + log r with r = pi / pi_ref (Schulman's
  estimators; k3 is unbiased and non-negative).
  """
  log_r = logp - ref_logp
  if estimator == "k1":
    return log_r
  if estimator == "k2":
    return 0.5 * jnp.square(log_r)
  if estimator == "k3":
    return jnp.exp(-log_r) - 1.0 + log_r
  raise ConfigError(f"unknown kl_estimator {estimator!r}; choose 'k1', 'k2' or 'k3'.")


def mismatch_weights(old_logp: Array, rollout_logp: Array, mask: Array,
                     segment_ids: Optional[Array], cfg: Any) -> Tuple[Array, Array, Array]:
  """Stop-gradient train/inference mismatch weights (TIS or MIS), token or sequence level.

  Returns:
    (weight [B, T], raw ratio [B, T] before truncation/masking, bool [B, T] tokens whose
    weight was truncated (TIS) or zeroed (MIS)).
  """
  mode, level = _cfg(cfg, "is_correction"), _cfg(cfg, "is_level")
  log_w = sg(old_logp - rollout_logp)
  if level == "sequence":
    reduce = _cfg(cfg, "is_seq_reduce")
    if reduce == "geo_mean":
      log_w = agg.sequence_mean(log_w, mask, segment_ids)
    elif reduce == "product":
      seg = agg.default_segment_ids(mask) if segment_ids is None else segment_ids
      log_w = agg.sequence_sum(log_w * agg.token_mask(mask, seg), seg)
    else:
      raise ConfigError(f"unknown is_seq_reduce {reduce!r}; choose 'geo_mean' or 'product'.")
  elif level != "token":
    raise ConfigError(f"unknown is_level {level!r}; choose 'token' or 'sequence'.")
  raw = jnp.exp(log_w)
  if mode == "tis":
    cap = _cfg(cfg, "tis_cap")
    return jnp.minimum(raw, cap), raw, raw > cap
  if mode == "mis":
    lo, hi = _cfg(cfg, "mis_low"), _cfg(cfg, "mis_high")
    out = (raw < lo) | (raw > hi)
    return jnp.where(out, 0.0, raw), raw, out
  raise ConfigError(f"unknown is_correction {mode!r}; choose 'none', 'tis' or 'mis'.")


# ------------------------------------------------------------------------- policy losses
# Each returns (per-token loss [B, T], aux) where aux holds the ratio used and bool clip
# indicators. ``b`` is the batch mapping with old_logp already filled in.


def ppo_loss(b: Mapping[str, Array], cfg: Any):
  """PPO / GRPO token-level clipped surrogate on r_t = pi / pi_old."""
  ratio = jnp.exp(b["logp"] - b["old_logp"])
  loss, aux = clipped_surrogate(ratio, b["advantages"], eps_low=_cfg(cfg, "clip_eps_low"),
                                eps_high=_cfg(cfg, "clip_eps_high"),
                                dual_clip_c=_cfg(cfg, "dual_clip_c"))
  return loss, dict(aux, ratio=ratio)


def gspo_loss(b: Mapping[str, Array], cfg: Any):
  """GSPO: clipped surrogate on the sequence ratio s = exp(mean_t(logp - old_logp)).

  Each token carries its sequence's loss; with "seq-mean-token-mean" aggregation this is
  exactly the paper's objective. The advantage used is the sequence mean of ``advantages``.
  """
  mask, seg = b["loss_mask"], b.get("segment_ids")
  s = jnp.exp(agg.sequence_mean(b["logp"] - b["old_logp"], mask, seg))
  adv = agg.sequence_mean(b["advantages"], mask, seg)
  loss, aux = clipped_surrogate(s, adv, eps_low=_cfg(cfg, "clip_eps_low"),
                                eps_high=_cfg(cfg, "clip_eps_high"),
                                dual_clip_c=_cfg(cfg, "dual_clip_c"))
  return loss, dict(aux, ratio=s)


def gspo_token_loss(b: Mapping[str, Array], cfg: Any):
  """GSPO-token: s_t = sg(s) * pi_t / sg(pi_t), per-token advantages; equals GSPO in value
  and gradient when the advantages are constant over a sequence."""
  mask, seg = b["loss_mask"], b.get("segment_ids")
  log_s = agg.sequence_mean(b["logp"] - b["old_logp"], mask, seg)
  ratio = jnp.exp(sg(log_s) + b["logp"] - sg(b["logp"]))
  loss, aux = clipped_surrogate(ratio, b["advantages"], eps_low=_cfg(cfg, "clip_eps_low"),
                                eps_high=_cfg(cfg, "clip_eps_high"),
                                dual_clip_c=_cfg(cfg, "dual_clip_c"))
  return loss, dict(aux, ratio=ratio)


def cispo_loss(b: Mapping[str, Array], cfg: Any):
  """CISPO: -sg(clip(r, 1-eps_low, 1+eps_high)) * A * logp; every token keeps a gradient."""
  ratio = jnp.exp(b["logp"] - b["old_logp"])
  lo, hi = _cfg(cfg, "cispo_eps_low"), _cfg(cfg, "cispo_eps_high")
  lower = 0.0 if lo is None else 1.0 - lo
  w = sg(jnp.clip(ratio, lower, 1.0 + hi))
  loss = -w * b["advantages"] * b["logp"]
  return loss, {"ratio": ratio, "clip_low": ratio < lower, "clip_high": ratio > 1.0 + hi}


def reinforce_loss(b: Mapping[str, Array], cfg: Any):
  """Plain REINFORCE: -A * logp."""
  del cfg
  ratio = jnp.exp(b["logp"] - b["old_logp"])
  return -b["advantages"] * b["logp"], {"ratio": ratio}


POLICY_LOSSES: Dict[str, Callable] = {
    "ppo": ppo_loss,
    "grpo": ppo_loss,  # Same surrogate; GRPO differs in its (group) advantages.
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "cispo": cispo_loss,
    "reinforce": reinforce_loss,
}


def policy_loss(name: str, batch: Mapping[str, Any], cfg: Any = None
                ) -> Tuple[Array, Array, Dict[str, Array]]:
  """Full policy objective: mismatch-weighted policy term + KL to reference - entropy bonus.

  Args:
    name: key of ``POLICY_LOSSES``.
    batch: mapping of [B, T] arrays (see module docstring).
    cfg: ``LossConfig``, a ConfigDict with any of its fields, or None for defaults.
  Returns:
    (loss_sum scalar, denom scalar, metrics dict of scalars; see ``metrics``).
  """
  if name not in POLICY_LOSSES:
    raise ConfigError(f"unknown policy loss {name!r}; choose one of {sorted(POLICY_LOSSES)}.")
  logp = _float(batch["logp"])
  mask = jnp.asarray(batch["loss_mask"], logp.dtype)
  seg = batch.get("segment_ids")
  mask = agg.token_mask(mask, seg)
  # Off-mask entries (padding may hold 0 or -inf) are replaced by logp, so no ratio or KL
  # term overflows there and leaks NaN into the gradient through the masking.
  clean = lambda x: None if x is None else jnp.where(mask > 0, x, sg(logp))
  old = clean(_opt(batch, "old_logp"))
  old = sg(logp) if old is None else old
  b = {"logp": logp, "old_logp": old, "loss_mask": mask, "segment_ids": seg,
       "advantages": _float(batch["advantages"])}

  loss, aux = POLICY_LOSSES[name](b, cfg)
  m = {"tokens": jnp.sum(mask), "seqs": agg.sequence_count(mask, seg)}

  rollout = clean(_opt(batch, "rollout_logp"))
  correction = _cfg(cfg, "is_correction")
  if correction != "none":
    if rollout is None:
      raise ConfigError(f"is_correction={correction!r} needs batch['rollout_logp'] (the "
                        "sampler's recorded logprobs); pass them or set is_correction='none'.")
    w, raw, hit = mismatch_weights(old, rollout, mask, seg, cfg)
    loss = loss * w
    m["is_weight_sum"] = mt.masked_sum(w, mask)
    m["is_weight_max"] = mt.masked_max(w, mask)
    m["is_raw_weight_max"] = mt.masked_max(raw, mask)
    frac_key = "is_truncated_frac_sum" if correction == "tis" else "is_masked_frac_sum"
    m[frac_key] = mt.masked_sum(hit.astype(jnp.float32), mask)
  if rollout is not None:
    delta = jnp.abs(sg(old) - rollout)
    m["rollout_abs_dlogp_sum"] = mt.masked_sum(delta, mask)
    m["rollout_abs_dlogp_p99"] = mt.masked_quantile(delta, mask, 0.99)
    m["rollout_abs_dlogp_max"] = mt.masked_max(delta, mask)

  kl_coef = _cfg(cfg, "kl_coef")
  ref = clean(_opt(batch, "ref_logp"))
  if kl_coef:
    if ref is None:
      raise ConfigError("kl_coef > 0 needs batch['ref_logp'] from the reference policy.")
    kl = kl_penalty(logp, ref, _cfg(cfg, "kl_estimator"))
    loss = loss + kl_coef * kl
    m["kl_ref_sum"] = mt.masked_sum(sg(kl), mask)
  entropy = batch.get("entropy")
  ent_coef = _cfg(cfg, "entropy_coef")
  if ent_coef:
    if entropy is None:
      raise ConfigError("entropy_coef > 0 needs batch['entropy'] (token_logprobs returns it).")
    loss = loss - ent_coef * entropy
  if entropy is not None:
    m["entropy_sum"] = mt.masked_sum(sg(_float(entropy)), mask)

  ratio = sg(aux["ratio"])
  log_r = sg(logp - old)
  m["ratio_sum"] = mt.masked_sum(ratio, mask)
  m["ratio_max"] = mt.masked_max(ratio, mask)
  m["approx_kl_k1_sum"] = mt.masked_sum(-log_r, mask)
  m["approx_kl_k3_sum"] = mt.masked_sum(jnp.exp(log_r) - 1.0 - log_r, mask)
  for k in ("clip_low", "clip_high", "dual_clip"):
    if k in aux:
      m[f"{k}_frac_sum"] = mt.masked_sum(aux[k].astype(jnp.float32), mask)

  loss_sum, denom = agg.aggregate(loss, mask, seg, mode=_cfg(cfg, "aggregation"),
                                  max_len=_cfg(cfg, "max_len"))
  m["pg_loss_sum"] = mt.masked_sum(sg(loss), mask)
  return loss_sum, denom, m


def demo_replay_nll(logp: Array, demo_mask: Array) -> Tuple[Array, Array]:
  """Negative log-likelihood of replayed demonstration tokens (``loss.demo_replay_weight``).

  RL on bugs without demonstrations can erode what SFT taught on the others; mixing a few
  demonstration sequences into each update with a small weight w pulls the policy back towards
  them. The learner adds ``w * nll_sum / tokens`` (token mean over the update's demonstration
  tokens, every micro-batch and, with ``trainer.accumulate``, every batch of the step) to the
  policy objective; those tokens carry no policy-gradient term.

  Args:
    logp: [B, T] log-prob of each target token under the current parameters.
    demo_mask: [B, T] 1 on demonstration tokens trained on, 0 elsewhere.
  Returns:
    (nll_sum scalar = sum over demo_mask of -logp, tokens scalar = sum of demo_mask).
  """
  m = jnp.asarray(demo_mask, logp.dtype)
  return -jnp.sum(jnp.where(m > 0, logp, 0.0) * m), jnp.sum(m)


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array,
               segment_ids: Optional[Array] = None, *, clip_eps: Optional[float] = None,
               aggregation: str = "token-mean", max_len: Optional[float] = None
               ) -> Tuple[Array, Array, Dict[str, Array]]:
  """Clipped value loss 0.5 * max((v - R)^2, (clip(v, v_old +- eps) - R)^2).

  Args:
    values, old_values, returns, mask: [B, T]; segment_ids: [B, T] int or None.
    clip_eps: value clip range; None = unclipped.
  Returns:
    (loss_sum, denom, metrics with ``vf_clip_frac_sum`` and ``tokens``).
  """
  mask = agg.token_mask(mask, segment_ids)
  err = jnp.square(values - returns)
  if clip_eps is None:
    loss, clipped = 0.5 * err, jnp.zeros_like(err, bool)
  else:
    v_clip = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    err_clip = jnp.square(v_clip - returns)
    loss, clipped = 0.5 * jnp.maximum(err, err_clip), err_clip > err
  s, d = agg.aggregate(loss, mask, segment_ids, mode=aggregation, max_len=max_len)
  m = {"tokens": jnp.sum(mask),
       "vf_clip_frac_sum": mt.masked_sum(clipped.astype(jnp.float32), mask)}
  return s, d, m
