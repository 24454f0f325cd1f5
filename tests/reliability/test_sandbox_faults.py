"""Sandbox faults in real trials: out of memory, a limit too small to start anything, the
Docker daemon restarted mid-trial, the container removed from outside."""

import pytest

from tests.reliability import faultkit

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def _ok(o):
  assert o.ok, f"{o.fault}/{o.backend}: {o.detail} (attempts {o.attempts})"


def _engine(backend, request):
  if backend == "docker":
    request.getfixturevalue("docker_engine")


@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_command_out_of_memory(fault_env, backend, request):
  _engine(backend, request)
  _ok(faultkit.sandbox_oom(fault_env, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_limit_too_small_to_start(fault_env, backend, request):
  _engine(backend, request)
  _ok(faultkit.sandbox_tiny_memory(fault_env, backend))


@pytest.mark.docker
@pytest.mark.slow
def test_docker_daemon_restarted_mid_trial(fault_env, docker_engine):
  o = faultkit.docker_restart(fault_env)
  assert faultkit.docker_ok(), "dockerd did not come back"
  _ok(o)


@pytest.mark.docker
def test_container_removed_from_outside(fault_env, docker_engine):
  _ok(faultkit.container_removed(fault_env))
