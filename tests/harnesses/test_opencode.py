"""OpenCode end to end: the scripted policy through its read/edit tools, the tiny policy."""

import json

import pytest

from legorl_jax.harnesses.base import Endpoint
from legorl_jax.harnesses.opencode import DISABLE_ENV, OpenCodeAdapter
from legorl_jax.rewards import status as st
from tests.harnesses.conftest import (check_accounted, check_policy_trials, check_scripted_trajectory,
                                      describe)

# One engine for the three npm harnesses (their prompts are 8-17k tokens).
NPM_TINY_MAX_LEN = 20480


def test_launch_spec():
  spec = OpenCodeAdapter(context_tokens=8192).launch(
      "Fix `a.py`.", Endpoint("http://127.0.0.1:8080/sess/s1", "tok", "policy"),
      home="/home/agent", workdir="/workspace", max_turns=5)
  assert spec.argv[0] == "/opt/harness/opencode/node_modules/opencode-ai/bin/opencode.exe"
  assert spec.argv[1] == "run" and spec.argv[-1] == "Fix `a.py`." and spec.cwd == "/workspace"
  for k, v in DISABLE_ENV.items():
    assert spec.env[k] == v
  cfg = json.loads(spec.files["/home/agent/.config/opencode/opencode.json"])
  assert spec.env["OPENCODE_CONFIG"] == "/home/agent/.config/opencode/opencode.json"
  prov = cfg["provider"]["legorl"]
  assert prov["npm"] == "@ai-sdk/openai-compatible"
  assert prov["options"] == {"baseURL": "http://127.0.0.1:8080/sess/s1/v1", "apiKey": "tok"}
  assert cfg["model"] == "legorl/policy" and cfg["small_model"] == "legorl/policy-small"
  small = prov["models"]["policy-small"]
  assert small["id"] == "policy" and small["headers"] == {"x-legorl-stream": "title"}
  assert prov["models"]["policy"]["limit"]["context"] == 8192
  assert cfg["permission"]["edit"] == cfg["permission"]["bash"] == "allow"
  assert cfg["agent"]["build"]["steps"] == 5 and cfg["autoupdate"] is False


def test_harness_status():
  a = OpenCodeAdapter()
  assert a.harness_status(0, False, "", "") == "ok"
  assert a.harness_status(1, False, "", "Error: boom") == "harness_error"
  too_long = "Error: prompt is too long: 9616 tokens > 4095 maximum"
  assert a.harness_status(1, False, "", too_long) == "overlong"
  assert a.harness_status(-9, True, "", too_long) == "overlong"  # compaction retry loop
  assert a.harness_status(-9, True, "", "working") == "timeout"


@pytest.mark.slow
def test_scripted_local(run_harness_trials, scripted_proxy, easy_tasks, tokenizer):
  tasks = easy_tasks[:1]  # one OpenCode start costs ~30 s of CPU here
  proxy = scripted_proxy(tasks, workdir_prefix="/workspace")
  results = run_harness_trials(OpenCodeAdapter(), proxy, tasks)
  check_accounted(results, tasks)
  res = results[0]
  traj = check_scripted_trajectory(res, proxy, tokenizer, expected_train_segments=1)
  assert res.turns == 3, describe(res)  # read, edit, final answer
  calls = traj.calls
  assert [c.stream for c in calls].count("title") == 1
  (title,) = traj.side_segments
  assert title.stream == "title" and not title.train
  assert all(c.api == "chat" for c in calls)
  assert '"name": "edit"' in "".join(proxy.replies)


@pytest.mark.slow
def test_tiny_policy(run_harness_trials, make_tiny_engine_proxy, easy_tasks):
  tiny = make_tiny_engine_proxy(NPM_TINY_MAX_LEN)
  tasks = easy_tasks[:1]
  results = run_harness_trials(OpenCodeAdapter(context_tokens=tiny.max_len, max_output_tokens=48),
                               tiny.proxy, tasks, max_turns=1, timeout_s=400)
  check_policy_trials(tiny.model, results, tasks)


@pytest.mark.slow
def test_context_overflow_is_overlong(run_harness_trials, scripted_proxy, easy_tasks):
  """Its ~9.6k-token first prompt cannot fit a 4k context: the proxy answers 400, OpenCode
  (compaction off) exits 1 naming the overflow, and the trial is ``overlong``."""
  tasks = easy_tasks[:1]
  proxy = scripted_proxy(tasks, max_len=4096)
  adapter = OpenCodeAdapter(context_tokens=4096, auto_compact=False)
  results = run_harness_trials(adapter, proxy, tasks, timeout_s=120)
  check_accounted(results, tasks)
  assert results[0].status == st.OVERLONG, describe(results[0])
  assert not results[0].trajectory.segments  # nothing of the main loop was sampled
