"""Harness names -> adapters, and per-trial harness choice for mixed-harness runs.

Adapters are imported lazily by module path, so naming one harness never imports the others.

  adapter = get_adapter("mini-swe-agent")
  chooser = HarnessChooser.from_spec("builtin:1,mini-swe-agent:1", validation="builtin")
  chooser.choose(task, rng)                    # metadata["harness"] first, else by weight
  chooser.choose(task, rng, validation=True)   # always "builtin": comparable numbers
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Mapping

import numpy as np

from legorl_jax import errors
from legorl_jax.harnesses.base import HarnessAdapter

ADAPTERS: dict[str, str] = {
    "builtin": "legorl_jax.harnesses.builtin:BuiltinAdapter",
    "mini-swe-agent": "legorl_jax.harnesses.mini_swe_agent:MiniSweAgentAdapter",
    "aider": "legorl_jax.harnesses.aider:AiderAdapter",
    "openhands": "legorl_jax.harnesses.openhands:OpenHandsAdapter",
    "opencode": "legorl_jax.harnesses.opencode:OpenCodeAdapter",
    "codex": "legorl_jax.harnesses.codex:CodexAdapter",
    "claude-code": "legorl_jax.harnesses.claude_code:ClaudeCodeAdapter",
}
ALIASES = {"mini": "mini-swe-agent", "claude": "claude-code", "openhands-sdk": "openhands",
           "built-in": "builtin"}
METADATA_KEY = "harness"


def names() -> list[str]:
  return list(ADAPTERS)


def canonical(name: str) -> str:
  key = ALIASES.get(name.strip().lower(), name.strip().lower())
  if key not in ADAPTERS:
    raise errors.HarnessError(f"Unknown harness {name!r}; known harnesses: {names()}.")
  return key


def adapter_class(name: str) -> type[HarnessAdapter]:
  module, _, cls = ADAPTERS[canonical(name)].partition(":")
  try:
    return getattr(importlib.import_module(module), cls)
  except (ImportError, AttributeError) as e:
    raise errors.HarnessError(f"Harness {name!r}: cannot load {module}:{cls} ({e}).") from e


def get_adapter(name: str, **kwargs) -> HarnessAdapter:
  """A fresh adapter for ``name`` (keyword arguments go to its constructor)."""
  return adapter_class(name)(**kwargs)


def parse_weights(spec: str | Mapping[str, float]) -> dict[str, float]:
  """``"builtin"`` / ``"builtin:2,aider:1"`` / ``{"builtin": 2}`` -> normalised weights."""
  if isinstance(spec, str):
    items = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
      name, _, w = part.partition(":")
      try:
        items[canonical(name)] = float(w) if w else 1.0
      except ValueError:
        raise errors.ConfigError(f"Harness weight {part!r} is not NAME or NAME:WEIGHT.") from None
  else:
    items = {canonical(k): float(v) for k, v in spec.items()}
  if not items or any(w < 0 for w in items.values()) or sum(items.values()) <= 0:
    raise errors.ConfigError(
        f"Harness spec {spec!r} needs at least one harness with a positive weight, e.g. "
        "'builtin' or 'builtin:1,mini-swe-agent:1'.")
  total = sum(items.values())
  return {k: w / total for k, w in items.items() if w > 0}


@dataclasses.dataclass(frozen=True)
class HarnessChooser:
  """Which harness runs a trial.

  Training trials use the task's ``metadata["harness"]`` when set (it must be one of the
  weighted harnesses unless ``allow_metadata_outside``), else a draw from ``weights``.
  Validation trials always use ``validation`` so that their numbers stay comparable.
  """

  weights: Mapping[str, float]
  validation: str
  allow_metadata_outside: bool = False

  def __post_init__(self):
    object.__setattr__(self, "weights", parse_weights(dict(self.weights)))
    object.__setattr__(self, "validation", canonical(self.validation))

  @classmethod
  def from_spec(cls, spec: str | Mapping[str, float], validation: str | None = None,
                **kw) -> "HarnessChooser":
    weights = parse_weights(spec)
    if validation is None:  # the heaviest harness (first on ties)
      validation = max(weights, key=lambda k: weights[k])
    return cls(weights, validation, **kw)

  @property
  def harnesses(self) -> list[str]:
    names_ = list(self.weights)
    return names_ + ([self.validation] if self.validation not in names_ else [])

  def choose(self, task, rng: np.random.Generator, *, validation: bool = False) -> str:
    if validation:
      return self.validation
    meta = getattr(task, "metadata", None)
    extra = meta if isinstance(meta, Mapping) else (getattr(meta, "extra", None) or {})
    wanted = extra.get(METADATA_KEY)
    if wanted:
      name = canonical(str(wanted))
      if name not in self.weights and not self.allow_metadata_outside:
        raise errors.ConfigError(
            f"Task {task.id} asks for harness {name!r}, which is not in this run's harnesses "
            f"{list(self.weights)}; add it to the harness spec or set allow_metadata_outside.")
      return name
    keys = list(self.weights)
    return keys[int(rng.choice(len(keys), p=np.asarray([self.weights[k] for k in keys])))]
