"""Adapter for aider (PyPI ``aider-chat``): OpenAI chat, no tools, a text edit format.

aider edits only files "added to the chat", and a non-interactive run has nobody to ask for
them, so the adapter adds the files the task names: every path-like word of the instruction
(``pkg/mod.py``) that exists in the repository when the harness starts (checked by a small
``/bin/sh`` wrapper inside the sandbox, so a missing path is never created). With the
``diff`` edit format the policy answers with SEARCH/REPLACE blocks:

  pkg/mod.py
  ```python
  <<<<<<< SEARCH
  old lines
  =======
  new lines
  >>>>>>> REPLACE
  ```

One run is one ``--message`` plus aider's own reflections (edit failures, lint errors; at most
3), so ``max_turns`` does not apply. Histories and the model metadata live in the private
HOME, never in the repository; no commits, no .gitignore edits, no update checks, analytics
off, no repo map by default (``map_tokens``).
"""

from __future__ import annotations

import json
import re
import shlex

from legorl_jax.harnesses import base, install

NAME = "aider"
_PATH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.[A-Za-z0-9]+")
OVERLONG_MARKERS = ("context_length_exceeded", "has hit a token limit",
                    "ContextWindowExceededError")


def instruction_files(instruction: str) -> list[str]:
  """Relative path-like words of ``instruction`` (``a/b.py``, ``setup.cfg``), in order."""
  out = []
  for m in _PATH_RE.finditer(instruction):
    p = m.group(0).lstrip("./")
    word_start = max(instruction.rfind(c, 0, m.start()) for c in " \n\t`'\"(") + 1
    if "://" in instruction[word_start:m.end()] or p in out or ".." in p:
      continue
    if re.fullmatch(r"[0-9.]+", p):  # numbers such as 3.5
      continue
    out.append(p)
  return out


class AiderAdapter(base.HarnessAdapter):
  """``aider --model openai/<model> --edit-format diff --message-file TASK FILES...``."""

  name = NAME
  wire_api = base.WIRE_CHAT

  def __init__(self, edit_format: str = "diff", map_tokens: int = 0, context_tokens: int = 32768,
               max_output_tokens: int = 4096, stream: bool = True, auto_lint: bool = True):
    self.edit_format = edit_format
    self.map_tokens = map_tokens
    self.context_tokens = context_tokens
    self.max_output_tokens = max_output_tokens
    self.stream = stream
    self.auto_lint = auto_lint

  def executable(self) -> str | None:
    return str(install.executable_path(NAME)) if install.is_installed(NAME) else None

  def ro_mounts(self):
    return install.sandbox_python_cli(NAME)[0]

  def launch(self, instruction, endpoint, *, home, workdir, max_turns, temperature=None):
    model = f"openai/{endpoint.model}"
    task_file, meta_file = f"{home}/task.md", f"{home}/.aider.model.metadata.json"
    settings_file = f"{home}/.aider.model.settings.yml"
    chat_log, llm_log = f"{home}/aider.chat.history.md", f"{home}/aider.llm.history.txt"
    metadata = {model: {"max_input_tokens": self.context_tokens,
                        "max_output_tokens": self.max_output_tokens,
                        "max_tokens": self.max_output_tokens, "input_cost_per_token": 0.0,
                        "output_cost_per_token": 0.0, "litellm_provider": "openai",
                        "mode": "chat"}}
    # Model settings: the weak model (summaries) is the policy too; a temperature only when set.
    settings = [f"- name: {model}", f"  edit_format: {self.edit_format}",
                f"  weak_model_name: {model}", "  use_repo_map: false"]
    settings.append(f"  use_temperature: {temperature if temperature is not None else 'false'}")
    _, cli, cli_env = install.sandbox_python_cli(NAME)
    argv = [*cli,
            "--model", model, "--weak-model", model, "--edit-format", self.edit_format,
            # ``=`` form: a session token may start with "-", which argparse would take for a flag
            f"--openai-api-base={endpoint.openai_base}", f"--openai-api-key={endpoint.token}",
            "--model-metadata-file", meta_file, "--model-settings-file", settings_file,
            "--map-tokens", str(self.map_tokens),
            "--message-file", task_file,
            "--yes-always", "--no-auto-commits", "--no-dirty-commits", "--no-gitignore",
            "--no-check-update", "--no-show-release-notes", "--analytics-disable",
            "--no-show-model-warnings", "--no-check-model-accepts-settings",
            "--no-detect-urls", "--no-suggest-shell-commands", "--no-fancy-input",
            "--no-pretty", "--disable-playwright", "--no-restore-chat-history",
            "--chat-history-file", chat_log, "--input-history-file", f"{home}/.aider.input.history",
            "--llm-history-file", llm_log, "--encoding", "utf-8",
            "--stream" if self.stream else "--no-stream",
            "--auto-lint" if self.auto_lint else "--no-auto-lint"]
    files = " ".join(shlex.quote(p) for p in instruction_files(instruction))
    script = (f'files=; for f in {files}; do if [ -f "$f" ]; then files="$files --file $f"; fi; '
              f'done; exec {shlex.join(argv)} $files')
    env = {"OPENAI_API_KEY": endpoint.token, "OPENAI_API_BASE": endpoint.openai_base,
           "AIDER_ANALYTICS": "false", "AIDER_CHECK_UPDATE": "false",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TERM": "dumb", **cli_env}
    return base.LaunchSpec(
        argv=["/bin/sh", "-c", script], env=env, cwd=workdir,
        files={task_file: instruction, meta_file: json.dumps(metadata, indent=1),
               settings_file: "\n".join(settings) + "\n"},
        log_files=[chat_log, llm_log])

  def harness_status(self, exit_code, timed_out, stdout_tail, stderr_tail):
    if timed_out:
      return base.HARNESS_TIMEOUT
    out = stdout_tail + stderr_tail
    if any(m in out for m in OVERLONG_MARKERS):
      return base.HARNESS_OVERLONG
    return base.HARNESS_OK if exit_code == 0 else base.HARNESS_ERROR
