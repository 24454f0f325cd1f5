"""The built-in agent end to end: scripted policy (local + Docker) and the tiny policy."""

import pytest

from legorl_jax.harnesses.builtin import BuiltinAdapter
from legorl_jax.harnesses.scripted import edits_from_patch
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_scripted_trajectory,
                                      check_token_faithful)


@pytest.fixture(scope="module")
def proxy(scripted_proxy, easy_tasks):
  return scripted_proxy(easy_tasks)


def _check_solved(results, proxy, tokenizer, tasks):
  check_accounted(results, tasks)
  for res, task in zip(results, tasks):
    traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
    # one edit call per changed block, then submit; all in one segment
    assert res.turns == len(edits_from_patch(task.gold_patch)) + 1
    assert [c.new_segment for c in traj.calls][0] == "first_call"


def test_scripted_local(run_harness_trials, proxy, easy_tasks, tokenizer):
  results = run_harness_trials(BuiltinAdapter(), proxy, easy_tasks[:2])
  _check_solved(results, proxy, tokenizer, easy_tasks[:2])


@pytest.mark.docker
@pytest.mark.slow
def test_scripted_docker(run_harness_trials, proxy, easy_tasks, tokenizer):
  results = run_harness_trials(BuiltinAdapter(), proxy, easy_tasks[:2], backend="docker")
  _check_solved(results, proxy, tokenizer, easy_tasks[:2])


@pytest.mark.slow
def test_tiny_policy(run_harness_trials, tiny_engine_proxy, easy_tasks):
  results = run_harness_trials(BuiltinAdapter(max_tokens=48), tiny_engine_proxy.proxy,
                               easy_tasks[:2], max_turns=3)
  check_accounted(results, easy_tasks[:2])
  checked = 0
  for r in results:
    assert r.status != st.SANDBOX_ERROR, r.error
    assert r.trajectory.calls, r.error
    checked += check_token_faithful(tiny_engine_proxy.model, r.trajectory)
  assert checked > 0
