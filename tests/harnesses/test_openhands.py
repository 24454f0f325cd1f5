"""OpenHands SDK end to end: scripted policy (file_editor + finish) and the tiny policy.

The SDK's default agent sends about 11k tokens of system prompt and tool schemas: with the
8k tiny engine the first call overflows (an ``overlong`` trial); the 16k variant samples and
re-scores (minutes on CPU, opt-in).
"""

import os

import pytest

from legorl_jax.harnesses.base import Endpoint
from legorl_jax.harnesses.openhands import OpenHandsAdapter
from legorl_jax.harnesses.scripted import edits_from_patch
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_policy_trials, check_scripted_trajectory,
                                      describe)

TINY_CONTEXT = 16384


def test_launch_spec():
  spec = OpenHandsAdapter().launch("Fix it.", Endpoint("http://127.0.0.1:8080/sess/x", "tok"),
                                   home="/home/agent", workdir="/workspace", max_turns=7)
  assert "/home/agent/openhands_runner.py" in spec.argv and "--max-iterations" in spec.argv
  assert spec.argv[spec.argv.index("--model") + 1] == "openai/policy"
  assert spec.argv[spec.argv.index("--base-url") + 1] == "http://127.0.0.1:8080/sess/x/v1"
  assert spec.env["LLM_API_KEY"] == "tok" and spec.files["/home/agent/task.md"] == "Fix it."


@pytest.fixture(scope="module")
def proxy(scripted_proxy, easy_tasks):
  return scripted_proxy(easy_tasks)


@pytest.mark.slow
def test_scripted_local(run_harness_trials, proxy, easy_tasks, tokenizer):
  tasks = easy_tasks[:2]
  results = run_harness_trials(OpenHandsAdapter(), proxy, tasks)
  check_accounted(results, tasks)
  for res, task in zip(results, tasks):
    traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
    # one file_editor str_replace per changed block (absolute paths), then finish
    assert res.turns == len(edits_from_patch(task.gold_patch)) + 1, describe(res)
    assert not traj.side_segments
  assert any('"path": "/workspace/' in r for r in proxy.replies)


@pytest.mark.slow
def test_tiny_policy_overflows_8k_context(run_harness_trials, tiny_engine_proxy, easy_tasks):
  """The default agent's prompt (~11k tokens) exceeds the 8k tiny engine: the proxy answers
  400 context_length_exceeded, the SDK stops, and the trial is an accounted ``overlong``."""
  tasks = easy_tasks[:1]
  results = run_harness_trials(OpenHandsAdapter(), tiny_engine_proxy.proxy, tasks, max_turns=1)
  check_accounted(results, tasks)
  assert [r.status for r in results] == [st.OVERLONG], describe(results[0])
  assert results[0].trajectory.calls == [] and results[0].reward == 0.0


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LEGORL_LONG_HARNESS_TESTS"),
                    reason="re-scoring an 11k-token segment takes minutes on 2 CPU cores; "
                           "set LEGORL_LONG_HARNESS_TESTS=1 to run it")
def test_tiny_policy_16k(run_harness_trials, make_tiny_engine_proxy, easy_tasks):
  tiny = make_tiny_engine_proxy(TINY_CONTEXT)
  tasks = easy_tasks[:1]
  results = run_harness_trials(OpenHandsAdapter(), tiny.proxy, tasks, max_turns=1)
  check_policy_trials(tiny.model, results, tasks)
