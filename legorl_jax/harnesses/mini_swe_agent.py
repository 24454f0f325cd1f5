"""Adapter for mini-swe-agent (PyPI ``mini-swe-agent``): OpenAI chat through litellm, one
``bash`` tool (version 2.x calls tools; 1.x parsed markdown blocks).

  MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors LITELLM_LOCAL_MODEL_COST_MAP=True \\
  OPENAI_API_BASE=<session>/v1 OPENAI_API_KEY=<token> \\
  mini -t "$TASK" -m openai/<model> --yolo --exit-immediately -o $HOME/traj.json \\
       -c mini.yaml -c agent.step_limit=<max_turns>

The agent stops when a command prints ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` as its first
line (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), or at the step limit. Model retries
are capped (mini's default is 10 with minute-long waits) so a failing endpoint ends the trial.
"""

from __future__ import annotations

from legorl_jax.harnesses import base, install

NAME = "mini-swe-agent"
FINISH_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
OVERLONG_MARKERS = ("context_length_exceeded", "ContextWindowExceededError")


class MiniSweAgentAdapter(base.HarnessAdapter):
  """Runs the ``mini`` CLI from its own virtualenv (mounted read-only in the sandbox, see
  ``install.sandbox_python_cli``)."""

  name = NAME
  wire_api = base.WIRE_CHAT

  def __init__(self, config: str = "mini.yaml", model_retries: int = 2,
               max_tokens: int | None = None):
    self.config = config
    self.model_retries = model_retries
    self.max_tokens = max_tokens

  def executable(self) -> str | None:
    return str(install.executable_path(NAME)) if install.is_installed(NAME) else None

  def ro_mounts(self):
    return install.sandbox_python_cli(NAME)[0]

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    traj = f"{home}/mini.traj.json"
    _, cli, cli_env = install.sandbox_python_cli(NAME)
    argv = [*cli, "-t", instruction,
            "-m", f"openai/{endpoint.model}", "--yolo", "--exit-immediately", "-o", traj,
            "-c", self.config, "-c", f"agent.step_limit={int(max_turns)}",
            "-c", "agent.cost_limit=0"]
    if temperature is not None:
      argv += ["-c", f"model.model_kwargs.temperature={float(temperature)}"]
    if self.max_tokens is not None:
      argv += ["-c", f"model.model_kwargs.max_tokens={int(self.max_tokens)}"]
    env = {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
           "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(self.model_retries),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "OPENAI_API_BASE": endpoint.openai_base, "OPENAI_API_KEY": endpoint.token,
           "NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat", **cli_env}
    return base.LaunchSpec(argv=argv, env=env, cwd=workdir, log_files=[traj])

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    if timed_out:
      return base.HARNESS_TIMEOUT
    if any(m in stdout_tail + stderr_tail for m in OVERLONG_MARKERS):
      return base.HARNESS_OVERLONG
    return base.HARNESS_OK if exit_code == 0 else base.HARNESS_ERROR
