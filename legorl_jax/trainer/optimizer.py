"""Optimizer and learning-rate schedules (optax), built from the ``optim`` config section."""

from __future__ import annotations

import optax

from legorl_jax import errors

SCHEDULES = ("constant", "warmup", "cosine")


def make_schedule(cfg) -> optax.Schedule:
  """``cfg``: ``learning_rate``, ``schedule`` in SCHEDULES, ``warmup_steps``, ``total_steps``,
  ``end_lr_ratio`` (cosine floor as a fraction of the peak)."""
  lr = float(cfg.learning_rate)
  warmup = int(cfg.get("warmup_steps", 0))
  kind = cfg.get("schedule", "constant")
  if kind not in SCHEDULES:
    raise errors.ConfigError(f"optim.schedule={kind!r} is not one of {SCHEDULES}.")
  if kind == "constant":
    return optax.constant_schedule(lr)
  if kind == "warmup":
    return optax.linear_schedule(0.0, lr, max(warmup, 1)) if warmup else optax.constant_schedule(lr)
  total = int(cfg.get("total_steps", 0))
  if total <= warmup:
    raise errors.ConfigError(
        f"optim.total_steps={total} must exceed optim.warmup_steps={warmup} for the cosine schedule.")
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=lr, warmup_steps=warmup, decay_steps=total,
      end_value=lr * float(cfg.get("end_lr_ratio", 0.0)))


def make_optimizer(cfg) -> optax.GradientTransformation:
  """AdamW with global-norm clipping; ``cfg.max_grad_norm <= 0`` disables clipping."""
  parts = []
  clip = float(cfg.get("max_grad_norm", 1.0))
  if clip > 0:
    parts.append(optax.clip_by_global_norm(clip))
  parts.append(optax.adamw(
      make_schedule(cfg), b1=float(cfg.get("b1", 0.9)), b2=float(cfg.get("b2", 0.999)),
      eps=float(cfg.get("eps", 1e-8)), weight_decay=float(cfg.get("weight_decay", 0.0))))
  return optax.chain(*parts)
