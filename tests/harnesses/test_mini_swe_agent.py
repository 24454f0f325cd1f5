"""mini-swe-agent end to end: scripted policy (local + Docker) and the tiny policy."""

import pytest

from legorl_jax.harnesses.base import Endpoint
from legorl_jax.harnesses.mini_swe_agent import FINISH_COMMAND, MiniSweAgentAdapter
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_scripted_trajectory,
                                      check_token_faithful, describe)


def test_launch_spec():
  spec = MiniSweAgentAdapter().launch(
      "Fix it.", Endpoint("http://127.0.0.1:8080/sess/a", "tok", "policy"), home="/home/agent",
      workdir="/workspace", max_turns=5, temperature=0.5)
  i = spec.argv.index("-t")
  assert spec.argv[i - 1].endswith("/bin/mini") and spec.argv[i + 1] == "Fix it."
  assert "--yolo" in spec.argv and "--exit-immediately" in spec.argv
  assert "agent.step_limit=5" in spec.argv and "model.model_kwargs.temperature=0.5" in spec.argv
  assert spec.env["OPENAI_API_BASE"] == "http://127.0.0.1:8080/sess/a/v1"
  assert spec.env["MSWEA_CONFIGURED"] == "true" and spec.cwd == "/workspace"


@pytest.fixture(scope="module")
def proxy(scripted_proxy, easy_tasks):
  return scripted_proxy(easy_tasks)  # the finish command is read from mini's prompt


def _check_solved(results, proxy, tokenizer, tasks):
  check_accounted(results, tasks)
  for res in results:
    traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
    # git apply through the bash tool, then the finish command
    assert res.turns == 2, describe(res)
    assert not traj.side_segments
  assert any(FINISH_COMMAND in r for r in proxy.replies)


@pytest.mark.slow
def test_scripted_local(run_harness_trials, proxy, easy_tasks, tokenizer):
  _check_solved(run_harness_trials(MiniSweAgentAdapter(), proxy, easy_tasks[:2]), proxy,
                tokenizer, easy_tasks[:2])


@pytest.mark.docker
@pytest.mark.slow
def test_scripted_docker(run_harness_trials, proxy, easy_tasks, tokenizer):
  results = run_harness_trials(MiniSweAgentAdapter(), proxy, easy_tasks[:2], backend="docker")
  _check_solved(results, proxy, tokenizer, easy_tasks[:2])


@pytest.mark.slow
def test_tiny_policy(run_harness_trials, tiny_engine_proxy, easy_tasks):
  tasks = easy_tasks[:2]
  results = run_harness_trials(MiniSweAgentAdapter(), tiny_engine_proxy.proxy, tasks,
                               max_turns=3)
  check_accounted(results, tasks)
  checked = 0
  for r in results:
    assert r.status in (st.FAILED, st.OVERLONG, st.SOLVED, st.TIMEOUT), describe(r)
    checked += check_token_faithful(tiny_engine_proxy.model, r.trajectory)
  assert checked > 0
