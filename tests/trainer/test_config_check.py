"""A bad config key or value fails at start with the key named."""

import os
import subprocess
import sys

import pytest

from experiments.configs import common, demo
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
                      "--config=experiments/configs/demo.py", "--config.trainer.stepz=3"],
                     cwd=root, capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "stepz" in r.stderr
