"""Codex end to end: config.toml parsed by a real TOML parser, the scripted policy through
``exec_command`` (Responses API), the tiny policy, and context overflow -> ``overlong``."""

import tomllib

import pytest

from legorl_jax.harnesses.base import Endpoint
from legorl_jax.harnesses.codex import TOKEN_ENV, CodexAdapter
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_policy_trials, check_scripted_trajectory,
                                      describe)

NPM_TINY_MAX_LEN = 20480  # shared with the OpenCode / Claude Code tests (one engine)


def test_launch_spec_and_config():
  spec = CodexAdapter(context_tokens=8192).launch(
      'Fix "a.py" \\ now.', Endpoint("http://127.0.0.1:8080/sess/s1", "secret-token-1", "policy"),
      home="/home/agent", workdir="/workspace", max_turns=5)
  assert spec.argv[0].startswith("/opt/harness/codex/node_modules/@openai/codex-linux-")
  assert spec.argv[1:4] == ["exec", "--json", "--dangerously-bypass-approvals-and-sandbox"]
  assert spec.argv[-1] == 'Fix "a.py" \\ now.'
  assert spec.env["CODEX_HOME"] == "/home/agent/.codex" and spec.env[TOKEN_ENV] == "secret-token-1"
  cfg = tomllib.loads(spec.files["/home/agent/.codex/config.toml"])
  assert cfg["model"] == "policy" and cfg["model_provider"] == "legorl"
  assert cfg["approval_policy"] == "never" and cfg["sandbox_mode"] == "danger-full-access"
  assert cfg["check_for_update_on_startup"] is False and cfg["web_search"] == "disabled"
  assert cfg["model_context_window"] == 8192
  prov = cfg["model_providers"]["legorl"]
  assert prov["base_url"] == "http://127.0.0.1:8080/sess/s1/v1" and prov["env_key"] == TOKEN_ENV
  assert prov["wire_api"] == "responses" and prov["request_max_retries"] == 0
  assert cfg["features"]["plugins"] is False and cfg["analytics"]["enabled"] is False
  assert cfg["otel"]["exporter"] == "none"
  assert "secret-token-1" not in spec.files["/home/agent/.codex/config.toml"]  # token only in the env


def test_harness_status():
  a = CodexAdapter()
  assert a.harness_status(0, False, '{"type":"turn.completed"}', "") == "ok"
  cut = ('{"type":"turn.failed","error":{"message":"Incomplete response returned, reason: '
         'max_output_tokens"}}')
  assert a.harness_status(1, False, cut, "") == "ok"
  full = ('{"type":"turn.failed","error":{"message":"Codex ran out of room in the model\'s '
          'context window. Start a new thread"}}')
  assert a.harness_status(1, False, full, "") == "overlong"
  assert a.harness_status(1, False, '{"type":"error","message":"stream error"}', "") == "harness_error"


@pytest.mark.slow
def test_scripted_local(run_harness_trials, scripted_proxy, easy_tasks, tokenizer):
  tasks = easy_tasks[:2]
  proxy = scripted_proxy(tasks, workdir_prefix="/workspace")
  results = run_harness_trials(CodexAdapter(), proxy, tasks)
  check_accounted(results, tasks)
  for res in results:
    traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
    assert res.turns == 2, describe(res)  # exec_command (write + git apply), final answer
    assert not traj.side_segments
    assert all(c.api == "responses" for c in traj.calls)
  assert any('"name": "exec_command"' in r and "git apply" in r for r in proxy.replies)


@pytest.mark.slow
def test_tiny_policy(run_harness_trials, make_tiny_engine_proxy, easy_tasks):
  tiny = make_tiny_engine_proxy(NPM_TINY_MAX_LEN)
  tasks = easy_tasks[:1]
  results = run_harness_trials(CodexAdapter(context_tokens=tiny.max_len), tiny.proxy, tasks,
                               max_turns=1, timeout_s=400)
  check_policy_trials(tiny.model, results, tasks)


@pytest.mark.slow
def test_context_overflow_is_overlong(run_harness_trials, scripted_proxy, easy_tasks):
  """Its ~8.3k-token first prompt cannot fit a 4k context: the proxy answers 400, Codex
  reports it ran out of context window and exits 1, the trial is ``overlong``."""
  tasks = easy_tasks[:1]
  proxy = scripted_proxy(tasks, max_len=4096)
  results = run_harness_trials(CodexAdapter(context_tokens=4096), proxy, tasks, timeout_s=120)
  check_accounted(results, tasks)
  assert results[0].status == st.OVERLONG, describe(results[0])
  assert not results[0].trajectory.calls
