"""Harness faults in real trials: killed mid-trial, hanging past its limit, flooding output.
Every trial is accounted for with a status and nothing is left behind."""

import pytest

from legorl_jax.harnesses.codex import CodexAdapter
from tests.harnesses.conftest import require_installed
from tests.reliability import faultkit


def _ok(o):
  assert o.ok, f"{o.fault}/{o.backend}: {o.detail} (attempts {o.attempts})"


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_sigkill_mid_trial(fault_env, backend, request):
  if backend == "docker":
    request.getfixturevalue("docker_engine")
  _ok(faultkit.harness_sigkill(fault_env, backend))


@pytest.mark.slow
def test_sigkill_npm_harness(fault_env):
  adapter = CodexAdapter()
  require_installed(adapter)
  _ok(faultkit.harness_sigkill(fault_env, "local", adapter, match=faultkit.is_codex,
                               workdir_prefix="/workspace", timeout_s=240.0))


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_hang_past_limit(fault_env, backend, request):
  if backend == "docker":
    request.getfixturevalue("docker_engine")
  _ok(faultkit.harness_hang(fault_env, backend))


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_output_flood_is_capped(fault_env, backend, request):
  if backend == "docker":
    request.getfixturevalue("docker_engine")
  _ok(faultkit.harness_flood(fault_env, backend))
