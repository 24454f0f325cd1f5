"""Adapter for Codex (npm ``@openai/codex``): OpenAI Responses API only, streamed.

The launch is what a user would configure: a private ``CODEX_HOME/config.toml`` declares a
custom ``[model_providers.legorl]`` (``base_url`` = the session, ``env_key`` naming the
variable that holds the session token, ``wire_api = "responses"``, no retries), approvals
``never`` with ``danger-full-access`` (the sandbox is the isolation), and update checks, web
search, plugins/apps, analytics and telemetry off; ``codex exec --json
--dangerously-bypass-approvals-and-sandbox "$TASK"`` runs one task and prints JSONL events.

The npm package's ``codex.js`` only ``execve``s the static musl binary it ships, so the adapter
runs that binary directly (with the variables the wrapper sets): no Node.js in the sandbox.
With a model name Codex has no metadata for, its tools are ``exec_command`` / ``write_stdin``
(unified exec; no ``apply_patch`` tool), plan/goal tools and the multi-agent group unless
disabled below.
"""

from __future__ import annotations

import json
import platform

from legorl_jax.harnesses import base, node

TOKEN_ENV = "LEGORL_SESSION_TOKEN"
_PROVIDER = "legorl"
_TARGETS = {"x86_64": ("x64", "x86_64-unknown-linux-musl"),
            "aarch64": ("arm64", "aarch64-unknown-linux-musl")}
# Features that would reach beyond the proxy or add tools a plain coding run does not need.
DISABLED_FEATURES = ("plugins", "remote_plugin", "plugin_sharing", "apps", "image_generation",
                     "goals", "tool_suggest", "skill_search", "memories",
                     "skill_mcp_dependency_install", "in_app_updates", "browser_use",
                     "computer_use")


def _native_entry() -> str:
  arch, triple = _TARGETS.get(platform.machine(), _TARGETS["x86_64"])
  return f"node_modules/@openai/codex-linux-{arch}/vendor/{triple}/bin/codex"


def _toml(value) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (int, float)):
    return repr(value)
  return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _table(name: str | None, items: dict) -> str:
  head = [f"[{name}]"] if name else []
  return "\n".join(head + [f"{k} = {_toml(v)}" for k, v in items.items()])


class CodexAdapter(node.NpmCliAdapter):
  """``codex exec --json`` against the session through a custom Responses provider.

  ``context_tokens``: the context window Codex is told (it compacts near it); set it to the
  proxy's context length.
  """

  name = "codex"
  wire_api = base.WIRE_RESPONSES
  pin = "codex"
  entry = _native_entry()
  min_memory_mb = 0  # a native Rust binary: the task's own limit is enough

  def __init__(self, context_tokens: int = 32768):
    self.context_tokens = int(context_tokens)

  def config_toml(self, endpoint: base.Endpoint) -> str:
    top = {"model": endpoint.model, "model_provider": _PROVIDER,
           "approval_policy": "never", "sandbox_mode": "danger-full-access",
           "check_for_update_on_startup": False, "web_search": "disabled",
           "model_context_window": self.context_tokens,
           "model_auto_compact_token_limit": int(self.context_tokens * 0.9)}
    provider = {"name": "legorl", "base_url": endpoint.openai_base, "env_key": TOKEN_ENV,
                "wire_api": "responses", "request_max_retries": 0, "stream_max_retries": 0,
                "stream_idle_timeout_ms": 600_000}
    return "\n\n".join([
        _table(None, top),
        _table(f"model_providers.{_PROVIDER}", provider),
        _table("features", {f: False for f in DISABLED_FEATURES}),
        _table("agents", {"enabled": False}),
        _table("analytics", {"enabled": False}),
        _table("otel", {"exporter": "none", "log_user_prompt": False}),
        _table("history", {"persistence": "none"}),
    ]) + "\n"

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    codex_home = f"{home}/.codex"
    pkg_root = f"{self.inside_root}/node_modules/@openai/codex"
    env = {"CODEX_HOME": codex_home, TOKEN_ENV: endpoint.token,
           "CODEX_MANAGED_BY_NPM": "1", "CODEX_MANAGED_PACKAGE_ROOT": pkg_root,
           "NO_COLOR": "1"}
    argv = [*self.entry_argv(), "exec", "--json", "--dangerously-bypass-approvals-and-sandbox",
            "--skip-git-repo-check", "--color", "never", "-C", workdir, instruction]
    return base.LaunchSpec(argv=argv, env=env, cwd=workdir,
                           files={f"{codex_home}/config.toml": self.config_toml(endpoint)})

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    # A reply cut at its token limit fails Codex's turn (exit 1, "Incomplete response returned,
    # reason: max_output_tokens"): the policy's outcome, graded like any other ending.
    if not timed_out and exit_code != 0 and "reason: max_output_tokens" in stdout_tail[-2000:]:
      return base.HARNESS_OK
    return super().harness_status(exit_code, timed_out, stdout_tail, stderr_tail)
