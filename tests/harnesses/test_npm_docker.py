"""npm harnesses on the Docker sandbox (Debian minbase image, no Node.js in it): the CLIs'
install dirs are mounted read-only at /opt/harness/<name>, and their native executables run
as the container's unprivileged user against the relayed proxy socket."""

import pytest

from legorl_jax.harnesses.claude_code import ClaudeCodeAdapter
from legorl_jax.harnesses.codex import CodexAdapter
from legorl_jax.harnesses.opencode import OpenCodeAdapter
from tests.harnesses.conftest import check_accounted, check_scripted_trajectory, describe


def test_mounts_are_install_dirs():
  for adapter in (OpenCodeAdapter(), CodexAdapter(), ClaudeCodeAdapter()):
    (mount,) = adapter.ro_mounts()  # native entry points: no node runtime mounted
    host, inside = mount
    assert host.endswith(adapter.pin) and inside == f"/opt/harness/{adapter.pin}"


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("adapter,turns", [(CodexAdapter(), 2), (ClaudeCodeAdapter(), 3)],
                         ids=["codex", "claude-code"])
def test_scripted_docker(run_harness_trials, scripted_proxy, easy_tasks, tokenizer, adapter,
                         turns):
  tasks = easy_tasks[1:2]
  proxy = scripted_proxy(tasks, workdir_prefix="/workspace")
  results = run_harness_trials(adapter, proxy, tasks, backend="docker")
  check_accounted(results, tasks)
  res = results[0]
  check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
  assert res.turns == turns, describe(res)
