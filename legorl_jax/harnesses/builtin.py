"""Adapter for the built-in agent (``builtin_agent.py``): OpenAI chat with bash/edit/submit."""

from __future__ import annotations

import pathlib

from legorl_jax.harnesses import base

AGENT_SCRIPT = pathlib.Path(__file__).with_name("builtin_agent.py")
EXIT_SUBMITTED, EXIT_USAGE, EXIT_API, EXIT_TURNS, EXIT_CONTEXT = 0, 1, 2, 3, 4


class BuiltinAdapter(base.HarnessAdapter):
  """Copies the stdlib-only agent script into the sandbox HOME and runs it with python3."""

  name = "builtin"
  wire_api = base.WIRE_CHAT

  def __init__(self, max_tokens: int = 256, bash_timeout_s: float = 20.0):
    self.max_tokens = max_tokens
    self.bash_timeout_s = bash_timeout_s

  def executable(self) -> str | None:
    return str(AGENT_SCRIPT) if AGENT_SCRIPT.is_file() else None

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    script, task_file, log = f"{home}/builtin_agent.py", f"{home}/task.md", f"{home}/agent_log.jsonl"
    argv = ["python3", script, "--base-url", endpoint.openai_base, "--model", endpoint.model,
            "--task-file", task_file, "--max-turns", str(max_turns),
            "--max-tokens", str(self.max_tokens), "--bash-timeout", str(self.bash_timeout_s),
            "--log", log]
    if temperature is not None:
      argv += ["--temperature", str(temperature)]
    return base.LaunchSpec(
        argv=argv, env={"OPENAI_API_KEY": endpoint.token}, cwd=workdir,
        files={script: AGENT_SCRIPT.read_bytes(), task_file: instruction}, log_files=[log])

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    if timed_out:
      return base.HARNESS_TIMEOUT
    if exit_code in (EXIT_SUBMITTED, EXIT_TURNS):
      return base.HARNESS_OK
    if exit_code == EXIT_CONTEXT:
      return base.HARNESS_OVERLONG
    return base.HARNESS_ERROR
