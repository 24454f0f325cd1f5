"""A bad config key or value fails at start with the key named."""

import os
import subprocess
import sys

import pytest

from experiments.configs import common, demo, demo_tiny
from legorl_jax import errors
from legorl_jax.trainer import config_check


def test_demo_config_is_valid():
  config_check.validate(demo.get_config())


@pytest.mark.parametrize("key,value,match", [
    ("trainer.mode", "sometimes", "trainer.mode"),
    ("loss.name", "magic", "loss.name"),
    ("rollout.samples_per_task", 1, "rollout.samples_per_task"),
    ("sampling.temperature", 0.7, "loss.temperature"),
    ("trainer.micro_batches", 3, "trainer.micro_batches"),
    ("sandbox.backend", "vm", "sandbox.backend"),
    ("advantage.kwargs", {"mask_broken_groups": True}, "rollout.mask_broken_groups"),
    ("trainer.trainable", "top:0", "trainer.trainable"),
    ("trainer.trainable", "half", "trainer.trainable"),
])
def test_bad_values_name_the_key(key, value, match):
  cfg = common.base_config()
  section, field = key.split(".")
  cfg[section][field] = value
  with pytest.raises(errors.ConfigError, match=match):
    config_check.validate(cfg)


def test_unknown_override_key_fails_at_start(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  r = subprocess.run([sys.executable, "-m", "experiments.train", "--workdir", str(tmp_path),
                      "--config=experiments/configs/demo_tiny.py", "--config.trainer.stepz=3"],
                     cwd=root, capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "stepz" in r.stderr


def _leaves(cfg, prefix=""):
  for key in cfg.keys():
    value = cfg[key]
    if hasattr(value, "keys"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield cfg, key, f"{prefix}{key}"


CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.dirname(common.__file__))
                 if f.endswith(".py") and f not in ("__init__.py", "common.py"))


@pytest.mark.parametrize("name", CONFIGS)
def test_every_key_can_be_overridden_from_the_command_line(name):
  # absl's --config.KEY=VALUE needs a typed field; a bare None default cannot be overridden.
  import importlib
  cfg = importlib.import_module(f"experiments.configs.{name}").get_config()
  untyped = [dotted for node, key, dotted in _leaves(cfg) if node.get_type(key) is type(None)]
  assert not untyped, f"fields without a type (use ml_collections.config_dict.placeholder): {untyped}"
