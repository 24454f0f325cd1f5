"""What trains: every parameter, the top K blocks, or LoRA adapters (``trainer.trainable``).

The learner's state holds only the *trainable* parameters; the rest (the *frozen* base) is
rebuilt from the base model, which is deterministic, and never enters the optimizer, the
gradient or a checkpoint. One pure function, ``Plan.merge(frozen, trainable)``, gives the full
flat params dict the Decoder runs on, inside the jitted step: autodiff then differentiates
only what depends on the trainable leaves, so with ``top:K`` the backward pass stops at the
lowest trained block (the blocks below it only run forward). The step itself runs on
``Plan.forward_params``, the same policy with LoRA kernels applied as ``x @ W + s (x @ A) @ B``
(no weight gradient of a frozen kernel is formed); the sampler, the weight sync and the export
get merged kernels.

Config (the ``trainer`` section):
  trainable:    "all" (default) | "top:K" | "lora"
  lora_rank:    r (LoRA only)
  lora_alpha:   alpha; the adapter is scaled by alpha / r
  lora_targets: projections that get adapters, of q, k, v, o, gate, up, down

``top:K``: blocks ``L-K .. L-1`` and the final norm train; the embedding (and with tied
embeddings, the lm head) and an untied lm head stay frozen. ``lora``: adapters on the targeted
projections of every block; every base parameter is frozen.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

import jax

from legorl_jax import errors
from legorl_jax.models import lora as lora_lib

Params = dict[str, jax.Array]
_LAYER = re.compile(r"^layers\.(\d+)\.")
DEFAULT_LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class Spec:
  """A validated ``trainer.trainable`` setting (model-independent)."""

  kind: str  # "all" | "top" | "lora"
  top_k: int = 0
  lora_rank: int = 0
  lora_alpha: float = 0.0
  lora_targets: tuple[str, ...] = ()


def parse(trainer_cfg) -> Spec:
  """The ``Spec`` of a ``trainer`` config section; a malformed value is a ConfigError naming
  the key and the accepted forms."""
  get = trainer_cfg.get if hasattr(trainer_cfg, "get") else (lambda k, d=None: d)
  value = get("trainable", "all")
  if value in (None, "", "all"):
    return Spec("all")
  if isinstance(value, str) and value.startswith("top:"):
    k = value[4:]
    if not k.isdigit() or int(k) < 1:
      raise errors.ConfigError(f"config trainer.trainable={value!r}: K in 'top:K' must be an "
                               "integer >= 1 (the number of top blocks that train), e.g. 'top:4'.")
    return Spec("top", top_k=int(k))
  if value == "lora":
    rank, alpha = get("lora_rank", 8), get("lora_alpha", 16.0)
    targets = tuple(get("lora_targets", DEFAULT_LORA_TARGETS) or ())
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
      raise errors.ConfigError(f"config trainer.lora_rank={rank!r} must be an integer >= 1.")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
      raise errors.ConfigError(f"config trainer.lora_alpha={alpha!r} must be a number > 0.")
    lora_lib.target_kernels([], targets)  # names checked here, kernels per model later
    if len(set(targets)) != len(targets):
      raise errors.ConfigError(f"config trainer.lora_targets={targets!r} names a projection twice.")
    return Spec("lora", lora_rank=rank, lora_alpha=float(alpha), lora_targets=targets)
  raise errors.ConfigError(f"config trainer.trainable={value!r} is invalid; choose 'all', "
                           "'top:K' (K top blocks and the final norm) or 'lora' (with "
                           "trainer.lora_rank, lora_alpha, lora_targets).")


def num_layers(param_names) -> int:
  ids = [int(m.group(1)) for n in param_names if (m := _LAYER.match(n))]
  return max(ids) + 1 if ids else 0


@dataclasses.dataclass(frozen=True)
class Plan:
  """A ``Spec`` resolved against one model's parameter names.

  ``trainable_names``: base parameters that train as they are (all, or the top blocks);
  ``lora_kernels``: kernels that get adapters (LoRA), each trained through
  ``<name>.lora_a`` / ``.lora_b``.
  """

  spec: Spec
  trainable_names: tuple[str, ...]
  lora_kernels: tuple[str, ...] = ()

  @property
  def kind(self) -> str:
    return self.spec.kind

  @property
  def lora_scale(self) -> float:
    return self.spec.lora_alpha / self.spec.lora_rank if self.spec.lora_rank else 0.0

  def lowest_trained_layer(self, names) -> int:
    """Index of the lowest block any trainable parameter lives in (0 for all and LoRA)."""
    if self.kind != "top":
      return 0
    return num_layers(names) - self.spec.top_k

  # -- splitting and merging ----------------------------------------------------------------------
  def split(self, params: Mapping[str, jax.Array], seed: int = 0) -> tuple[Params, Params]:
    """Full base params -> ``(frozen, trainable)``; LoRA adapters start fresh (``B = 0``)."""
    if self.kind == "lora":
      shapes = {k: tuple(params[k].shape) for k in self.lora_kernels}
      return dict(params), lora_lib.init_adapters(shapes, self.spec.lora_rank, seed)
    train = set(self.trainable_names)
    return ({k: v for k, v in params.items() if k not in train},
            {k: params[k] for k in self.trainable_names})

  def merge(self, frozen: Mapping[str, jax.Array], trainable: Mapping[str, jax.Array]) -> Params:
    """The full flat params the Decoder runs on (pure; works on tracers under jit).

    ``all``: ``trainable`` itself (the frozen dict is empty), so today's step is unchanged.
    """
    if self.kind == "all":
      return dict(trainable)
    if self.kind == "top":
      return {**frozen, **trainable}
    return {**frozen, **self.changed(frozen, trainable)}

  def forward_params(self, frozen: Mapping[str, jax.Array], trainable: Mapping[str, jax.Array]):
    """What the learner's forward (and backward) runs on: ``merge``, except that LoRA kernels
    stay unmerged (``lora.LowRankKernel``), so no frozen kernel's weight gradient is formed."""
    if self.kind != "lora":
      return self.merge(frozen, trainable)
    return {**frozen, **lora_lib.low_rank_kernels(frozen, trainable, self.lora_kernels,
                                                  self.lora_scale)}

  def changed(self, frozen: Mapping[str, jax.Array], trainable: Mapping[str, jax.Array]) -> Params:
    """The parameters an update can change, as the sampler needs them: the trainable base
    params themselves, or (LoRA) the merged targeted kernels."""
    if self.kind == "lora":
      return lora_lib.merged_kernels(frozen, trainable, self.lora_kernels, self.lora_scale)
    return dict(trainable)

  def base(self, frozen: Mapping[str, jax.Array], trainable: Mapping[str, jax.Array]) -> Params:
    """Full params whose ``split`` gives back ``frozen`` (and, except for fresh LoRA
    adapters, ``trainable``): for a learner started from another learner's trainables."""
    return dict(frozen) if self.kind == "lora" else {**frozen, **trainable}


def make_plan(spec: Spec, param_names) -> Plan:
  """Resolves ``spec`` against a model's flat parameter names (ConfigError when K exceeds the
  number of blocks or no kernel matches the LoRA targets)."""
  names = list(param_names)
  if spec.kind == "all":
    return Plan(spec, tuple(names))
  if spec.kind == "top":
    n = num_layers(names)
    if spec.top_k > n:
      raise errors.ConfigError(f"config trainer.trainable='top:{spec.top_k}' asks for more blocks "
                               f"than the model has ({n}); use K <= {n}, or 'all'.")
    lo = n - spec.top_k
    train = [k for k in names if ((m := _LAYER.match(k)) and int(m.group(1)) >= lo)
             or k.startswith("final_norm.")]
    return Plan(spec, tuple(train))
  kernels = lora_lib.target_kernels(names, spec.lora_targets)
  if not kernels:
    raise errors.ConfigError(f"config trainer.lora_targets={spec.lora_targets!r} matched no "
                             "projection kernel of this model.")
  return Plan(spec, (), tuple(kernels))


def plan_for(trainer_cfg, param_names) -> Plan:
  return make_plan(parse(trainer_cfg), param_names)
