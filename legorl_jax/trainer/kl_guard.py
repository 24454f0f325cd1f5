"""The KL guard: stop an RL run whose policy has moved too far from where it started.

A run that drifts (issue 44: lr 3e-4 reached KL 0.1 to the start and lost 13 points on the
bugs SFT had taught) is better stopped early with a message than finished and discarded. The
figure checked each step is ``kl_to_start_k3`` (``rl_loop.KLProbe``: KL(start || now) on a
fixed probe batch), or, where the probe does not run (a learner on a mesh), ``kl_ref`` (the
loss's KL to the reference policy, which is the start policy; needs ``loss.kl_coef`` > 0).
"""

from __future__ import annotations

import math

from legorl_jax import errors

KL_KEYS = ("kl_to_start_k3", "kl_ref")


def max_kl(cfg) -> float | None:
  """``trainer.max_kl`` checked: None (off) or a positive number."""
  bound = cfg.trainer.get("max_kl", None)
  if bound is None:
    return None
  bound = float(bound)
  if not bound > 0 or not math.isfinite(bound):
    raise errors.ConfigError(f"config trainer.max_kl={bound} must be a positive number (or unset: "
                             "no bound).")
  return bound


def check_available(cfg, probe_runs: bool) -> None:
  """At the start of RL: with a bound set, some KL figure must be measured every step."""
  if max_kl(cfg) is not None and not probe_runs and not float(cfg.loss.get("kl_coef", 0.0) or 0.0) > 0:
    raise errors.ConfigError(
        "config trainer.max_kl is set but no KL is measured on this run: the KL probe runs on a "
        "single-device learner only, and kl_ref needs loss.kl_coef > 0; set loss.kl_coef (e.g. "
        "0.001) or unset trainer.max_kl.")


def check(step: int, metrics: dict, cfg) -> None:
  """Raises ``KLBoundError`` when step ``step``'s KL passes ``trainer.max_kl``."""
  bound = max_kl(cfg)
  if bound is None:
    return
  key = next((k for k in KL_KEYS if k in metrics), None)
  if key is None:
    return
  kl = float(metrics[key])
  if kl > bound or math.isnan(kl):
    raise errors.KLBoundError(
        f"RL step {step}: {key} = {kl:.4g} passed trainer.max_kl = {bound:g}; the policy has moved "
        "too far from its start. Lower optim.learning_rate or raise loss.kl_coef, or raise "
        "--config.trainer.max_kl to let it go on (metrics.jsonl has the step's figures; rerunning "
        "with the same workdir resumes from the last checkpoint).")
