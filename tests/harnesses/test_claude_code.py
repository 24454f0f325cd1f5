"""Claude Code end to end: the scripted policy through Read/Edit (Anthropic Messages), the tiny
policy, and context overflow -> ``overlong``."""

import pytest

from legorl_jax.harnesses.base import Endpoint
from legorl_jax.harnesses.claude_code import QUIET_ENV, ClaudeCodeAdapter
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_policy_trials, check_scripted_trajectory,
                                      describe)

NPM_TINY_MAX_LEN = 20480  # shared with the OpenCode / Codex tests (one engine)


def test_launch_spec():
  spec = ClaudeCodeAdapter().launch(
      "Fix `a.py`.", Endpoint("http://127.0.0.1:8080/sess/s1", "tok", "policy"),
      home="/home/agent", workdir="/workspace", max_turns=7)
  argv = spec.argv
  assert argv[0] == "/opt/harness/claude-code/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
  assert argv[1:3] == ["-p", "Fix `a.py`."]
  assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv
  assert argv[argv.index("--max-turns") + 1] == "7"
  assert "--dangerously-skip-permissions" in argv
  env = spec.env
  assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080/sess/s1"
  assert env["ANTHROPIC_API_KEY"] == "tok"
  assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "policy"
  assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
  for k, v in QUIET_ENV.items():
    assert env[k] == v


def test_harness_status():
  a = ClaudeCodeAdapter()
  assert a.harness_status(0, False, '{"type":"result","subtype":"success"}', "") == "ok"
  assert a.harness_status(1, False, '{"type":"result","subtype":"error_max_turns"}', "") == "ok"
  cut = ('"is_error":true,"result":"API Error: Claude\'s response exceeded the 48 output token '
         'maximum. To configure this behavior, set CLAUDE_CODE_MAX_OUTPUT_TOKENS"')
  assert a.harness_status(1, False, cut, "") == "ok"
  assert a.harness_status(1, False, '"result":"Prompt is too long"', "") == "overlong"
  assert a.harness_status(1, False, "", "ECONNREFUSED") == "harness_error"
  assert a.harness_status(-9, True, "", "") == "timeout"


@pytest.mark.slow
def test_scripted_local(run_harness_trials, scripted_proxy, easy_tasks, tokenizer):
  tasks = easy_tasks[:2]
  proxy = scripted_proxy(tasks, workdir_prefix="/workspace")
  results = run_harness_trials(ClaudeCodeAdapter(), proxy, tasks)
  check_accounted(results, tasks)
  for res in results:
    # Read, Edit (echoed back unchanged, so spliced: one segment), final answer.
    traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
    assert res.turns == 3, describe(res)
    assert not traj.side_segments
    assert all(c.api == "messages" for c in traj.calls)
    assert [c.spliced_messages for c in traj.calls] == [0, 1, 2]
  assert any('"name": "Edit"' in r for r in proxy.replies)


@pytest.mark.slow
def test_tiny_policy(run_harness_trials, make_tiny_engine_proxy, easy_tasks):
  tiny = make_tiny_engine_proxy(NPM_TINY_MAX_LEN)
  tasks = easy_tasks[:1]
  results = run_harness_trials(ClaudeCodeAdapter(max_output_tokens=48), tiny.proxy, tasks,
                               max_turns=1, timeout_s=400)
  check_policy_trials(tiny.model, results, tasks)


@pytest.mark.slow
def test_context_overflow_is_overlong(run_harness_trials, scripted_proxy, easy_tasks):
  """Its ~17k-token first prompt cannot fit a 4k context: the proxy answers 400, Claude Code
  exits 1 with the proxy's "prompt is too long", and the trial is ``overlong``."""
  tasks = easy_tasks[:1]
  proxy = scripted_proxy(tasks, max_len=4096)
  results = run_harness_trials(ClaudeCodeAdapter(), proxy, tasks, timeout_s=120)
  check_accounted(results, tasks)
  assert results[0].status == st.OVERLONG, describe(results[0])
  assert not results[0].trajectory.calls
