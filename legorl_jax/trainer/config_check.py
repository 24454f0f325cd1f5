"""Fail at start, with the key named, on a config that cannot work."""

from __future__ import annotations

import math
import numbers

from legorl_jax import errors
from legorl_jax.rl.advantages import ADVANTAGE_ESTIMATORS
from legorl_jax.rl.losses import POLICY_LOSSES
from legorl_jax.rollout.filters import OVERLONG_MODES
from legorl_jax.trainer import compile_options
from legorl_jax.trainer import trainable as trainable_lib

_CHOICES = {
    "trainer.mode": ("sync", "async"),
    "sandbox.backend": ("local", "docker"),
    "rollout.overlong": OVERLONG_MODES,
    "loss.is_correction": ("none", "tis", "mis"),
    "loss.aggregation": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                         "seq-mean-token-sum-norm"),
    "trainer.logprob_impl": ("xla", "pallas", "reference", None),
}
_POSITIVE = ("rollout.tasks_per_step", "rollout.samples_per_task", "rollout.concurrency",
             "trainer.rows_per_batch", "trainer.micro_batches", "engine.max_batch",
             "engine.max_len", "sampling.max_tokens", "harness.max_turns", "eval.samples")
# Checked where present (configs written before these knobs existed lack them).
_POSITIVE_IF_SET = ("rollout.max_draw_rounds", "rollout.difficulty_window")
_NON_NEGATIVE_IF_SET = ("rollout.draw_tasks", "rollout.difficulty_max_skips",
                        "tasks.rl_bugs_percent")
_NON_NEGATIVE = ("trainer.steps", "sft.steps", "rollout.max_retries", "optim.learning_rate",
                 "sampling.temperature", "checkpoint.every", "eval.every")


def advantage_kwargs(cfg) -> dict:
  """``advantage.kwargs`` as a dict. Group masking is the rollout filters' decision
  (``rollout.mask_broken_groups``), so the estimator must not be asked to make it again."""
  kwargs = dict(cfg.advantage.get("kwargs", {}))
  if "mask_broken_groups" in kwargs:
    raise errors.ConfigError("config advantage.kwargs.mask_broken_groups is decided by the rollout "
                             "filters; set rollout.mask_broken_groups instead.")
  return kwargs


def _get(cfg, dotted):
  node = cfg
  for part in dotted.split("."):
    if part not in node:
      raise errors.ConfigError(f"config key {dotted!r} is missing; start from a file in "
                               "experiments/configs/ and override with --config.KEY=VALUE.")
    node = node[part]
  return node


def _number(cfg, key):
  """The value at ``key`` as a finite real number (not a bool, None or string)."""
  v = _get(cfg, key)
  if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
    raise errors.ConfigError(f"config {key}={v!r} must be a finite number; set it with "
                             f"--config.{key}=VALUE.")
  return v


def validate(cfg) -> None:
  for key, choices in _CHOICES.items():
    v = _get(cfg, key)
    if v not in choices:
      raise errors.ConfigError(f"config {key}={v!r} is invalid; choose one of {list(choices)}.")
  for key in _POSITIVE:
    if not _number(cfg, key) > 0:
      raise errors.ConfigError(f"config {key}={_get(cfg, key)!r} must be > 0.")
  mu = cfg.trainer.get("updates_per_batch", 1)
  if isinstance(mu, bool) or not isinstance(mu, int) or mu < 1:
    raise errors.ConfigError(f"config trainer.updates_per_batch={mu!r} must be an integer >= 1.")
  for key in _NON_NEGATIVE:
    if not _number(cfg, key) >= 0:
      raise errors.ConfigError(f"config {key}={_get(cfg, key)!r} must be >= 0.")
  for keys, ok, words in ((_POSITIVE_IF_SET, lambda v: v > 0, "> 0"),
                          (_NON_NEGATIVE_IF_SET, lambda v: v >= 0, ">= 0")):
    for key in keys:
      section, name = key.split(".")
      if section in cfg and name in cfg[section] and not ok(_number(cfg, key)):
        raise errors.ConfigError(f"config {key}={_get(cfg, key)!r} must be {words}.")
  for key in ("loss.temperature", "sampling.temperature"):
    _number(cfg, key)
  compile_options.cpu_library_fusion(cfg.trainer)
  trainable_lib.parse(cfg.trainer)  # the form of trainer.trainable; K against the model at start
  if cfg.loss.name not in POLICY_LOSSES:
    raise errors.ConfigError(f"config loss.name={cfg.loss.name!r} is invalid; choose one of "
                             f"{sorted(POLICY_LOSSES)}.")
  if cfg.advantage.name not in ADVANTAGE_ESTIMATORS:
    raise errors.ConfigError(f"config advantage.name={cfg.advantage.name!r} is invalid; choose "
                             f"one of {sorted(ADVANTAGE_ESTIMATORS)}.")
  advantage_kwargs(cfg)
  if abs(float(cfg.loss.temperature) - float(cfg.sampling.temperature)) > 1e-9 and \
      float(cfg.sampling.temperature) > 0:
    raise errors.ConfigError(
        f"config loss.temperature={cfg.loss.temperature} differs from sampling.temperature="
        f"{cfg.sampling.temperature}: the learner must score tokens at the temperature they were "
        "sampled with; set both to the same value.")
  if int(cfg.rollout.samples_per_task) < 2 and cfg.advantage.name in ("grpo", "rloo", "dr_grpo"):
    raise errors.ConfigError(f"config rollout.samples_per_task={cfg.rollout.samples_per_task} "
                             f"must be >= 2 for the group baseline of advantage.name={cfg.advantage.name!r}.")
  if int(cfg.engine.max_len) < int(cfg.sampling.max_tokens) + 64:
    raise errors.ConfigError(f"config engine.max_len={cfg.engine.max_len} leaves no room for "
                             f"prompts with sampling.max_tokens={cfg.sampling.max_tokens}.")
  if cfg.trainer.mode == "async" and cfg.trainer.get("max_staleness") is None:
    raise errors.ConfigError("config trainer.max_staleness must be set in async mode.")
  if int(cfg.trainer.rows_per_batch) % int(cfg.trainer.micro_batches):
    raise errors.ConfigError(f"config trainer.micro_batches={cfg.trainer.micro_batches} must divide "
                             f"trainer.rows_per_batch={cfg.trainer.rows_per_batch}.")
  for key in ("trainer.share_prompt", "sft.share_prompt"):
    section, name = key.split(".")
    if section in cfg and name in cfg[section]:
      layout = share_prompt_layout(cfg[section][name], key)
      micro = int(cfg[section].get("micro_batches", 1))
      if layout is not None and layout[3] % micro:
        raise errors.ConfigError(f"config {section}.micro_batches={micro} must divide the rows per "
                                 f"batch of {key}={tuple(layout)!r} (its fourth number).")
  _check_issue44_options(cfg)
  sft_micro = int(cfg.sft.get("micro_batches", 1)) if "sft" in cfg else 1
  if "sft" in cfg and (sft_micro < 1 or int(cfg.sft.rows_per_batch) % sft_micro):
    raise errors.ConfigError(f"config sft.micro_batches={sft_micro} must be >= 1 and divide "
                             f"sft.rows_per_batch={cfg.sft.rows_per_batch}.")


def _check_issue44_options(cfg) -> None:
  """The pass-rate sampler, demonstration replay, KL guard and SFT checkpoints: checked where
  present (older configs lack them), so a bad value fails at start, not after SFT."""
  from legorl_jax.trainer import kl_guard, screen  # pylint: disable=import-outside-toplevel
  sampler = cfg.rollout.get("sampler", "loader")
  if sampler not in ("loader", "pass_rate"):
    raise errors.ConfigError(f"config rollout.sampler={sampler!r} is invalid; choose 'loader' or "
                             "'pass_rate'.")
  if sampler == "pass_rate" and cfg.rollout.get("difficulty_filter", False):
    raise errors.ConfigError("config rollout.sampler='pass_rate' replaces the difficulty filter; "
                             "set rollout.difficulty_filter=False.")
  weight = _number(cfg, "loss.demo_replay_weight") if "demo_replay_weight" in cfg.loss else 0.0
  if weight < 0:
    raise errors.ConfigError(f"config loss.demo_replay_weight={weight} must be >= 0 (0: off).")
  if weight > 0 and "sft" in cfg and int(cfg.sft.steps) == 0 and not cfg.sft.get("demos", ""):
    raise errors.ConfigError("config loss.demo_replay_weight > 0 replays SFT demonstrations, but "
                             "this run has no SFT phase (sft.steps=0) and no sft.demos; set "
                             "sft.demos to the SFT run's demos.jsonl or the weight to 0.")
  kl_guard.max_kl(cfg)
  if "sft" in cfg:
    screen.save_at_steps(cfg)


def share_prompt_layout(value, key: str = "trainer.share_prompt") -> tuple[int, int, int, int] | None:
  """``(prefix_len, branch_len, branches, rows_per_batch)`` from a ``share_prompt`` config value
  (``()`` or None: off); a malformed one is a ConfigError naming ``key``."""
  if value is None or len(value) == 0:
    return None
  ok = (len(value) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and value[0] >= 1 and value[1] >= 2 and value[2] >= 2 and value[3] >= 1)
  if not ok:
    raise errors.ConfigError(
        f"config {key}={tuple(value)!r} must be () or four integers (prefix_len >= 1, "
        f"branch_len >= 2, branches >= 2, rows_per_batch >= 1), e.g. --config.{key}='(448, 192, 8, 4)'.")
  return tuple(int(v) for v in value)
