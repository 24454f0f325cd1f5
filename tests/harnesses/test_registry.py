"""Harness registry and per-trial harness choice."""

import types

import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.harnesses import base, registry


@pytest.mark.parametrize("name", registry.names())
def test_every_adapter_loads(name):
  adapter = registry.get_adapter(name)
  assert isinstance(adapter, base.HarnessAdapter)
  assert adapter.name == name and adapter.wire_api in base.WIRE_APIS
  assert name in adapter.install_hint() or name == "builtin"


def test_aliases_and_unknown_names():
  assert registry.canonical(" Mini ") == "mini-swe-agent"
  assert registry.canonical("claude") == "claude-code"
  with pytest.raises(errors.HarnessError, match="Unknown harness 'vim'.*builtin"):
    registry.get_adapter("vim")


def test_parse_weights():
  assert registry.parse_weights("builtin") == {"builtin": 1.0}
  assert registry.parse_weights("builtin:3, mini:1") == {"builtin": 0.75, "mini-swe-agent": 0.25}
  assert registry.parse_weights({"aider": 2, "builtin": 0}) == {"aider": 1.0}
  for bad in ("", "builtin:-1", "builtin:x", "builtin:0"):
    with pytest.raises((errors.ConfigError, errors.HarnessError)):
      registry.parse_weights(bad)


def _task(i, harness=None):
  return types.SimpleNamespace(id=f"t{i}", metadata={"harness": harness} if harness else {})


def test_choice_follows_weights_metadata_and_pins_validation():
  chooser = registry.HarnessChooser.from_spec("builtin:1,mini-swe-agent:3,aider:0",
                                              validation="builtin")
  rng = np.random.default_rng(0)
  n = 4000
  picks = [chooser.choose(_task(i), rng) for i in range(n)]
  frac = picks.count("mini-swe-agent") / n
  assert abs(frac - 0.75) < 3 * np.sqrt(0.75 * 0.25 / n)  # binomial, 3 sigma
  assert set(picks) == {"builtin", "mini-swe-agent"}
  assert all(chooser.choose(_task(i), rng, validation=True) == "builtin" for i in range(50))
  assert chooser.choose(_task(0, "mini"), rng) == "mini-swe-agent"  # task metadata wins
  assert chooser.choose(_task(0, "mini"), rng, validation=True) == "builtin"
  with pytest.raises(errors.ConfigError, match="not in this run's harnesses"):
    chooser.choose(_task(0, "codex"), rng)
  loose = registry.HarnessChooser.from_spec("builtin", allow_metadata_outside=True)
  assert loose.choose(_task(0, "codex"), rng) == "codex"


def test_default_validation_is_the_heaviest_harness():
  assert registry.HarnessChooser.from_spec("aider:1,builtin:2").validation == "builtin"
  assert registry.HarnessChooser.from_spec("aider:1,builtin:2").harnesses == ["aider", "builtin"]


def test_same_seed_same_choices():
  chooser = registry.HarnessChooser.from_spec("builtin:1,aider:1")
  a = [chooser.choose(_task(i), np.random.default_rng(7)) for i in range(20)]
  b = [chooser.choose(_task(i), np.random.default_rng(7)) for i in range(20)]
  assert a == b
