"""XLA compile options for the learner's jitted functions.

On CPU, XLA hands some fusions to the YNNPACK library. By default that includes elementwise
fusions and reductions, and in the train step those run slower than XLA's own loop fusions
(the RMSNorm weight gradients, for instance, take milliseconds each). Restricting YNNPACK to
matmuls made the same program 9-16% faster per step on preset ``small`` and 4% on ``tiny``,
with the same results (``experiments/benchmarks/cpu_library_fusion.py``; BENCHMARKS.md). The
option is passed per ``jax.jit`` (``compiler_options``), so it applies to the learner only and
never to code the user jits, and nothing is set on accelerators.
"""

from __future__ import annotations

import jax

from legorl_jax import errors

# ``trainer.cpu_library_fusion`` -> value of XLA's ``xla_cpu_experimental_ynn_fusion_type``
# (None: leave XLA's default).
CPU_LIBRARY_FUSIONS = {"dot": "LIBRARY_FUSION_TYPE_DOT", "xla_default": None}
DEFAULT_CPU_LIBRARY_FUSION = "dot"


def cpu_library_fusion(trainer_cfg=None) -> str:
  """``trainer.cpu_library_fusion`` (default ``"dot"``); a bad value is named as a ConfigError."""
  choice = DEFAULT_CPU_LIBRARY_FUSION
  if trainer_cfg is not None:
    choice = trainer_cfg.get("cpu_library_fusion", DEFAULT_CPU_LIBRARY_FUSION)
  if choice not in CPU_LIBRARY_FUSIONS:
    raise errors.ConfigError(
        f"config trainer.cpu_library_fusion={choice!r} is invalid; choose one of "
        f"{list(CPU_LIBRARY_FUSIONS)} ('dot': only matmuls go to XLA:CPU's YNNPACK library, "
        "'xla_default': XLA's own choice).")
  return choice


def learner_compiler_options(trainer_cfg=None, backend: str | None = None) -> dict | None:
  """``compiler_options`` for ``jax.jit`` of a learner function, or None for XLA's defaults.

  Args:
    trainer_cfg: the ``trainer`` config node (or None); reads ``cpu_library_fusion``.
    backend: the platform the function compiles for (default: ``jax.default_backend()``).
  """
  value = CPU_LIBRARY_FUSIONS[cpu_library_fusion(trainer_cfg)]
  if value is None or (backend or jax.default_backend()) != "cpu":
    return None
  return {"xla_cpu_experimental_ynn_fusion_type": value}
