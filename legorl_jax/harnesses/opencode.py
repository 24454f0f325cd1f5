"""Adapter for OpenCode (npm ``opencode-ai``): streamed OpenAI chat completions, ~10 tools.

The launch is what a user would configure: ``$HOME/.config/opencode/opencode.json`` declares a
custom provider (``@ai-sdk/openai-compatible``, bundled in the pinned binary, so nothing is
fetched at run time) whose base URL is the session, ``model`` and ``small_model`` point at it,
edit/bash are allowed, formatters / LSP / sharing / autoupdate are off, and
``opencode run "$TASK"`` runs one task non-interactively with stdin closed.

Side calls: OpenCode asks its ``small_model`` for a conversation title before the agent's
first turn. Its system prompt (~2.1k characters) is longer than the proxy's generic title
heuristic allows, so the small model is configured with the header ``x-legorl-stream: title``:
the proxy records those calls in the "title" stream whatever their prompt looks like.
"""

from __future__ import annotations

import json

from legorl_jax.harnesses import base, node

TITLE_STREAM = "title"
DISABLE_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1",
}
_PROVIDER = "legorl"


class OpenCodeAdapter(node.NpmCliAdapter):
  """``opencode run`` against the session through a custom OpenAI-compatible provider.

  ``context_tokens`` / ``max_output_tokens``: the model limits OpenCode is told (it compacts
  and sizes ``max_tokens`` from them); set ``context_tokens`` to the proxy's context length.
  ``auto_compact``: OpenCode's automatic compaction (on by default, as deployed). When a
  request overflows anyway, OpenCode compacts and retries, and when even the compaction
  request does not fit it loops until the wall-clock limit; ``harness_status`` then reports
  ``overlong``. With ``auto_compact=False`` it exits 1 on the first overflow instead.
  """

  name = "opencode"
  wire_api = base.WIRE_CHAT
  pin = "opencode"
  entry = "node_modules/opencode-ai/bin/opencode.exe"

  def __init__(self, context_tokens: int = 32768, max_output_tokens: int = 4096,
               title_output_tokens: int | None = None, auto_compact: bool = True,
               log_level: str = "WARN"):
    self.context_tokens = int(context_tokens)
    self.max_output_tokens = int(max_output_tokens)
    self.title_output_tokens = int(title_output_tokens or max_output_tokens)
    self.auto_compact = bool(auto_compact)
    self.log_level = log_level

  def config(self, endpoint: base.Endpoint, max_turns: int,
             temperature: float | None = None) -> dict:
    """The ``opencode.json`` contents for one session."""
    limit = {"context": self.context_tokens,
             "output": min(self.max_output_tokens, max(1, self.context_tokens // 2))}
    agent = {"steps": int(max_turns)}
    if temperature is not None:
      agent["temperature"] = float(temperature)
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {_PROVIDER: {
            "npm": "@ai-sdk/openai-compatible",
            "name": "legorl",
            "options": {"baseURL": endpoint.openai_base, "apiKey": endpoint.token},
            "models": {
                endpoint.model: {"name": endpoint.model, "limit": limit,
                                 "tool_call": True},
                f"{endpoint.model}-small": {
                    "id": endpoint.model, "name": f"{endpoint.model}-small",
                    "headers": {"x-legorl-stream": TITLE_STREAM},
                    "limit": {"context": self.context_tokens,
                              "output": min(self.title_output_tokens, limit["output"])}},
            },
        }},
        "model": f"{_PROVIDER}/{endpoint.model}",
        "small_model": f"{_PROVIDER}/{endpoint.model}-small",
        "agent": {"build": agent},
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny",
                       "external_directory": "allow", "doom_loop": "allow"},
        "autoupdate": False,
        "share": "disabled",
        "compaction": {"auto": self.auto_compact},
        "formatter": False,
        "lsp": False,
    }

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    cfg_path = f"{home}/.config/opencode/opencode.json"
    env = {**DISABLE_ENV, "OPENCODE_CONFIG": cfg_path,
           "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
           "XDG_CACHE_HOME": f"{home}/.cache", "XDG_STATE_HOME": f"{home}/.local/state"}
    return base.LaunchSpec(
        argv=[*self.entry_argv(), "run", "--print-logs", "--log-level", self.log_level,
              instruction], env=env, cwd=workdir,
        files={cfg_path: json.dumps(self.config(endpoint, max_turns, temperature), indent=1)},
    )

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    # A run that timed out while failing on context overflow (compaction retry loop) is
    # overlong, not a timeout of the policy's own making.
    if timed_out and node.mentions_context_overflow(stderr_tail[-1500:]):
      return base.HARNESS_OVERLONG
    return super().harness_status(exit_code, timed_out, stdout_tail, stderr_tail)
