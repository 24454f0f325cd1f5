"""Adapter for Claude Code (npm ``@anthropic-ai/claude-code``): Anthropic Messages, streamed.

Configured through the environment, as a user would: ``ANTHROPIC_BASE_URL`` = the session
root, the session token as ``ANTHROPIC_API_KEY`` (sent as ``x-api-key``), every model variable
(main, small/fast, haiku/sonnet/opus aliases, sub-agents) set to the served model, and
telemetry, error reporting, autoupdate and other non-essential traffic off.
``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` matters for training: the attribution block otherwise
changes the system prompt on every call, which would split every call into its own segment.

``claude -p "$TASK" --output-format stream-json --verbose --dangerously-skip-permissions``
runs one task; the sandbox runs it as an unprivileged uid (Claude Code refuses to skip
permissions as root; ``IS_SANDBOX=1`` states that the process is sandboxed, for images that
run as root). The pinned package ships a native (Bun-compiled) executable: no Node.js needed.
"""

from __future__ import annotations

import re

from legorl_jax.harnesses import base, node

QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "IS_SANDBOX": "1", "NO_COLOR": "1",
}
_MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
               "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
               "CLAUDE_CODE_SUBAGENT_MODEL")


class ClaudeCodeAdapter(node.NpmCliAdapter):
  """``claude -p`` (print mode, stream-json) against the session.

  ``max_output_tokens``: ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (the per-call ``max_tokens`` it asks
  for; the proxy clamps it to the context anyway).
  """

  name = "claude-code"
  wire_api = base.WIRE_MESSAGES
  pin = "claude-code"
  entry = "node_modules/@anthropic-ai/claude-code/bin/claude.exe"

  def __init__(self, max_output_tokens: int = 8192):
    self.max_output_tokens = int(max_output_tokens)

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    env = {**QUIET_ENV, "ANTHROPIC_BASE_URL": endpoint.root, "ANTHROPIC_API_KEY": endpoint.token,
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.max_output_tokens),
           "CLAUDE_CONFIG_DIR": f"{home}/.claude"}
    env.update({v: endpoint.model for v in _MODEL_VARS})
    argv = [*self.entry_argv(), "-p", instruction, "--output-format", "stream-json", "--verbose",
            "--dangerously-skip-permissions", "--max-turns", str(int(max_turns)),
            "--model", endpoint.model]
    return base.LaunchSpec(argv=argv, env=env, cwd=workdir)

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    # Print mode exits 1 when it stops at --max-turns, or when replies keep hitting the output
    # token limit (after its own "resume" retries): the policy's outcomes, graded as usual.
    if not timed_out and exit_code != 0 and (
        '"subtype":"error_max_turns"' in stdout_tail
        or re.search(r"response exceeded the \d+ output token maximum", stdout_tail)):
      return base.HARNESS_OK
    return super().harness_status(exit_code, timed_out, stdout_tail, stderr_tail)
