"""Advantage estimators: group baselines (GRPO, Dr. GRPO, RLOO) and GAE.

Group estimators take one scalar reward per trial arranged by group, ``rewards [G, n]``
(G prompts/tasks, n trials each) and a trial-level ``valid [G, n]`` mask. Statistics use only
valid trials. A broken trial (harness or sandbox error) must never be scored as a failure,
so with ``mask_broken_groups=True`` (the default) any group holding an invalid trial is
dropped whole: advantage 0 and group mask 0 for all its trials. With ``False`` only the
invalid trials are dropped and the baseline is computed from the valid rest.

Every group estimator returns ``(advantages [G, n] float32, mask [G, n] float32)`` where
``mask`` says which trials enter the loss; advantages are 0 where ``mask`` is 0.
"""

from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp

from legorl_jax.errors import ConfigError

Array = jax.Array


def _prepare(rewards: Array, valid: Optional[Array], mask_broken_groups: bool):
  """Returns float rewards [G, n], trial mask [G, n] float, valid count [G, 1]."""
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 2:
    raise ConfigError(f"rewards must have shape [groups, trials], got {rewards.shape}; "
                      "reshape the flat reward vector by group first.")
  if valid is None:
    valid = jnp.ones(rewards.shape, bool)
  valid = jnp.asarray(valid, bool)
  if valid.shape != rewards.shape:
    raise ConfigError(f"valid has shape {valid.shape} but rewards has {rewards.shape}.")
  if mask_broken_groups:
    mask = jnp.broadcast_to(jnp.all(valid, axis=1, keepdims=True), valid.shape)
  else:
    mask = valid
  mask = mask.astype(jnp.float32)
  rewards = jnp.where(mask > 0, rewards, 0.0)  # Broken trials may carry NaN/garbage.
  count = jnp.sum(mask, axis=1, keepdims=True)
  return rewards, mask, count


def _masked_mean(x: Array, mask: Array, count: Array) -> Array:
  return jnp.sum(x * mask, axis=1, keepdims=True) / jnp.maximum(count, 1.0)


def grpo_advantages(rewards: Array, valid: Optional[Array] = None, *, eps: float = 1e-6,
                    std_ddof: int = 0, mask_broken_groups: bool = True) -> Tuple[Array, Array]:
  """GRPO: ``(r - mean_group) / (std_group + eps)``.

  Args:
    rewards: [G, n] per-trial rewards.
    valid: [G, n] bool, False for broken trials (None = all valid).
    eps: added to the group std; a group with identical rewards gets advantage 0.
    std_ddof: 0 = population std (default), 1 = unbiased std.
    mask_broken_groups: drop a group whole when it holds an invalid trial.
  Returns:
    (advantages [G, n] f32, mask [G, n] f32).
  """
  r, mask, count = _prepare(rewards, valid, mask_broken_groups)
  mean = _masked_mean(r, mask, count)
  var = jnp.sum(jnp.square(r - mean) * mask, axis=1, keepdims=True)
  var = var / jnp.maximum(count - std_ddof, 1.0)
  adv = (r - mean) / (jnp.sqrt(var) + eps)
  return adv * mask, mask


def dr_grpo_advantages(rewards: Array, valid: Optional[Array] = None, *,
                       mask_broken_groups: bool = True) -> Tuple[Array, Array]:
  """Dr. GRPO: ``r - mean_group`` (no std normalisation, which biases toward easy groups).

  Shapes as in ``grpo_advantages``.
  """
  r, mask, count = _prepare(rewards, valid, mask_broken_groups)
  adv = r - _masked_mean(r, mask, count)
  return adv * mask, mask


def rloo_advantages(rewards: Array, valid: Optional[Array] = None, *,
                    mask_broken_groups: bool = True) -> Tuple[Array, Array]:
  """RLOO: ``r_i - mean_{j != i} r_j`` over the valid trials of the group.

  A group with fewer than two valid trials has no baseline: advantage 0, mask 0.
  Shapes as in ``grpo_advantages``.
  """
  r, mask, count = _prepare(rewards, valid, mask_broken_groups)
  mask = mask * (count >= 2).astype(jnp.float32)
  total = jnp.sum(r * mask, axis=1, keepdims=True)
  baseline = (total - r) / jnp.maximum(count - 1.0, 1.0)
  adv = r - baseline
  return adv * mask, mask


ADVANTAGE_ESTIMATORS: dict = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}


def compute_advantages(name: str, rewards: Array, valid: Optional[Array] = None,
                       **kw) -> Tuple[Array, Array]:
  """Looks ``name`` up in ``ADVANTAGE_ESTIMATORS``; returns (advantages [G, n], mask [G, n])."""
  try:
    fn: Callable = ADVANTAGE_ESTIMATORS[name]
  except KeyError:
    raise ConfigError(f"unknown advantage estimator {name!r}; choose one of "
                      f"{sorted(ADVANTAGE_ESTIMATORS)}.") from None
  return fn(rewards, valid, **kw)


def gae(rewards: Array, values: Array, dones: Array, *, gamma: float = 1.0, lam: float = 1.0,
        last_value: Optional[Array] = None, mask: Optional[Array] = None) -> Tuple[Array, Array]:
  """Generalised advantage estimation over tokens, as a reverse ``lax.scan`` over time.

  ``dones[b, t]`` marks that the episode ends after step t (no bootstrap from t + 1).
  Steps with ``mask == 0`` (prompt, tool-output or padding tokens: not actions of the
  policy) are skipped: the recursion passes through them undiscounted (an episode end on one
  still cuts it) and their advantage and return are 0. Put rewards on action tokens (usually
  the last one).

  Args:
    rewards, values: [B, T] float.
    dones: [B, T] bool/float.
    gamma, lam: discount and GAE lambda.
    last_value: [B] value after the last step (default 0).
    mask: [B, T] action mask (default all ones).
  Returns:
    (advantages [B, T] f32, returns [B, T] f32) with returns = advantages + values.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  values = jnp.asarray(values, jnp.float32)
  dones = jnp.asarray(dones, jnp.float32)
  mask = jnp.ones_like(rewards) if mask is None else jnp.asarray(mask, jnp.float32)
  if last_value is None:
    last_value = jnp.zeros(rewards.shape[:1], jnp.float32)

  def step(carry, xs):
    next_value, next_adv = carry
    r, v, d, m = xs
    not_done = 1.0 - d
    delta = r + gamma * next_value * not_done - v
    adv = delta + gamma * lam * not_done * next_adv
    live = m > 0
    # A skipped step passes the recursion through, unless an episode ends there: then the
    # action before it bootstraps from nothing.
    skip_value, skip_adv = next_value * not_done, next_adv * not_done
    carry = (jnp.where(live, v, skip_value), jnp.where(live, adv, skip_adv))
    return carry, jnp.where(live, adv, 0.0)

  xs = tuple(jnp.swapaxes(x, 0, 1) for x in (rewards, values, dones, mask))
  init = (jnp.asarray(last_value, jnp.float32), jnp.zeros_like(last_value, jnp.float32))
  _, adv = jax.lax.scan(step, init, xs, reverse=True)
  adv = jnp.swapaxes(adv, 0, 1)
  return adv, (adv + values) * mask


def whiten(x: Array, mask: Optional[Array] = None, *, shift_mean: bool = True,
           eps: float = 1e-8) -> Array:
  """Masked whitening ``(x - mean) / std`` over all unmasked entries; masked entries -> 0.

  Args:
    x: any shape float; mask: same shape (default all ones).
    shift_mean: if False only divide by the std (keeps the sign of every entry).
  Returns:
    array of x's shape, f32.
  """
  x = jnp.asarray(x, jnp.float32)
  mask = jnp.ones_like(x) if mask is None else jnp.asarray(mask, jnp.float32)
  n = jnp.maximum(jnp.sum(mask), 1.0)
  mean = jnp.sum(x * mask) / n
  var = jnp.sum(jnp.square(x - mean) * mask) / n
  out = (x - mean) if shift_mean else x
  return out * jax.lax.rsqrt(var + eps) * mask
