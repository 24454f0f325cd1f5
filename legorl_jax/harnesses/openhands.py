"""Adapter for the OpenHands SDK (PyPI ``openhands-sdk`` + ``openhands-tools``, Python >= 3.12):
OpenAI chat through litellm, the SDK's default agent (terminal, file editor, task tracker,
finish).

The SDK is a library, so the harness is ``openhands_runner.py``: copied into the sandbox's
HOME and run by the SDK virtualenv's interpreter, it builds ``LLM(model="openai/<model>",
base_url=<session>/v1, api_key=<token>)``, ``get_default_agent(llm, cli_mode=True)`` (no
browser) and one ``Conversation`` in the work dir, capped at ``max_turns`` iterations. The
terminal tool drives tmux, which must be installed on the host (``apt-get install tmux``).
"""

from __future__ import annotations

import pathlib
import shutil

from legorl_jax.harnesses import base, install

NAME = "openhands"
RUNNER = pathlib.Path(__file__).with_name("openhands_runner.py")
EXIT_FINISHED, EXIT_USAGE, EXIT_ERROR, EXIT_BUDGET, EXIT_CONTEXT = 0, 1, 2, 3, 4
_HOST_TOOLS = ("tmux",)


class OpenHandsAdapter(base.HarnessAdapter):
  """Runs ``openhands_runner.py`` with the SDK's virtualenv (mounted read-only)."""

  name = NAME
  wire_api = base.WIRE_CHAT

  def __init__(self, max_output_tokens: int | None = None, retries: int = 1):
    self.max_output_tokens = max_output_tokens
    self.retries = retries

  def executable(self) -> str | None:
    if not install.is_installed(NAME) or any(shutil.which(t) is None for t in _HOST_TOOLS):
      return None
    return str(install.executable_path(NAME))

  def install_hint(self) -> str:
    return f"python -m legorl_jax.harnesses.install {NAME} (and apt-get install -y tmux)"

  def ro_mounts(self):
    return install.sandbox_python_cli(NAME)[0]

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    runner, task_file = f"{home}/openhands_runner.py", f"{home}/task.md"
    _, cli, cli_env = install.sandbox_python_cli(NAME, script=runner)
    argv = [*cli, "--base-url", endpoint.openai_base, "--model", f"openai/{endpoint.model}",
            "--task-file", task_file, "--max-iterations", str(int(max_turns)),
            "--retries", str(self.retries)]
    if temperature is not None:
      argv += ["--temperature", str(float(temperature))]
    if self.max_output_tokens is not None:
      argv += ["--max-output-tokens", str(int(self.max_output_tokens))]
    env = {"LLM_API_KEY": endpoint.token, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_TELEMETRY": "False", "OPENHANDS_SUPPRESS_BANNER": "1",
           "TMUX_TMPDIR": "/tmp", "TERM": "xterm", "NO_COLOR": "1", "LOG_JSON": "0", **cli_env}
    return base.LaunchSpec(argv=argv, env=env, cwd=workdir,
                           files={runner: RUNNER.read_bytes(), task_file: instruction})

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    if timed_out:
      return base.HARNESS_TIMEOUT
    if exit_code in (EXIT_FINISHED, EXIT_BUDGET):
      return base.HARNESS_OK
    if exit_code == EXIT_CONTEXT or "context_length_exceeded" in stdout_tail + stderr_tail:
      return base.HARNESS_OVERLONG
    return base.HARNESS_ERROR
