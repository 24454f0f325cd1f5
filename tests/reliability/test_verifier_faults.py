"""Verifier faults: the test runner crashing, and hanging past the verifier's limit."""

import pytest

from tests.reliability import faultkit

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def _ok(o):
  assert o.ok, f"{o.fault}/{o.backend}: {o.detail} (attempts {o.attempts})"


@pytest.mark.parametrize("backend", BACKENDS)
def test_verifier_crash(fault_env, backend, request):
  if backend == "docker":
    request.getfixturevalue("docker_engine")
  _ok(faultkit.verifier_crash(fault_env, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_verifier_hang(fault_env, backend, request):
  if backend == "docker":
    request.getfixturevalue("docker_engine")
  _ok(faultkit.verifier_hang(fault_env, backend))
