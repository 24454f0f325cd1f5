"""HF tensor names of the qwen3_moe expert kernels, and their stacking on read and write.

HF checkpoints (transformers 4.x and 5.x on disk alike) keep one tensor per expert:
``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`` ``[out, in]``. The decoder
keeps each projection stacked ``[E, in, out]`` (``models.moe``), so one parameter reads from E
tensors and writes E tensors. The router ``mlp.gate.weight`` ``[E, D]`` is an ordinary
transposed tensor (``hf_io._LAYER_NAMES``).
"""

from __future__ import annotations

import numpy as np

from legorl_jax.models.config import ModelConfig

_PROJ = {"gate_kernel": "gate_proj", "up_kernel": "up_proj", "down_kernel": "down_proj"}


def expert_names(path: tuple, config: ModelConfig, prefix: str = "model.") -> list[str] | None:
  """The E HF names (expert order) of a stacked expert kernel, or None for any other param."""
  if (len(path) == 4 and path[0] == "layers" and path[2] == "mlp" and path[3] in _PROJ
      and config.is_moe_layer(int(path[1]))):
    return [f"{prefix}layers.{path[1]}.mlp.experts.{e}.{_PROJ[path[3]]}.weight"
            for e in range(config.num_experts)]
  return None


def stacked_reader(handles: list, names: list[str], dtype):
  """Callback for ``make_array_from_callback``: the slice ``[e, in, out]`` of a stacked kernel
  read from per-expert ``[out, in]`` tensors (``handles[e]`` is the safetensors handle of
  ``names[e]``). Each device reads only its experts and its slice of each."""
  tensors = [h.get_slice(n) for h, n in zip(handles, names)]

  def read(index):
    e, i, o = tuple(index)
    blocks = [np.asarray(tensors[j][o, i]).astype(dtype, copy=False).T
              for j in range(len(names))[e]]
    return np.ascontiguousarray(np.stack(blocks))

  return read


def split_stacked(arr: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
  """A stacked ``[E, in, out]`` kernel -> ``{name_e: [out, in]}`` for writing."""
  return {n: np.ascontiguousarray(arr[e].T) for e, n in enumerate(names)}
