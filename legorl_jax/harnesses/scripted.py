"""A scripted policy: solves a task with a known gold patch in whatever harness asks.

It sits behind the proxy like any policy (``proxy.backend.ScriptedBackend``), so its answers
go through the tokenizer and the recorder: runs with it test the harness plumbing end to end,
and their recordings are supervised demonstrations in each harness's native format.

Plan per request, from the conversation so far (the harness resends it every turn):
  1. apply the fix: with an exact-replace edit tool (``edit``, ``str_replace_based_edit_tool``,
     ``Edit``...) one call per changed block; otherwise write and ``git apply`` the patch with
     the shell tool; without tools, answer in the text protocol (a fenced diff);
  2. optionally run the tests with the shell tool;
  3. finish: the ``submit`` / ``finish`` tool, the harness's finish command, or plain text.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Sequence

from legorl_jax.proxy.types import RenderedRequest

_SHELL_TOOLS = ("bash", "shell", "exec_command", "execute_bash", "terminal", "Bash", "run_shell_command")
_FINISH_TOOLS = ("submit", "finish", "task_complete", "attempt_completion")


@dataclasses.dataclass(frozen=True)
class Edit:
  path: str
  old: str
  new: str


def edits_from_patch(patch: str) -> list[Edit]:
  """Exact-string edits equivalent to a unified diff: each run of -/+ lines in a hunk becomes
  one replacement of the removed lines by the added ones (pure insertions keep one line of
  leading context so the old text is non-empty)."""
  edits, path = [], None
  lines = patch.splitlines()
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.startswith("+++ "):
      target = line[4:].strip()
      path = target[2:] if target.startswith("b/") else target
      i += 1
      continue
    if line.startswith("@@"):
      i += 1
      prev_context = None
      while i < len(lines) and not lines[i].startswith(("@@", "diff ", "--- ")):
        if lines[i].startswith(("-", "+")):
          old, new = [], []
          while i < len(lines) and lines[i].startswith(("-", "+")) and not lines[i].startswith(("--- ", "+++ ")):
            (old if lines[i][0] == "-" else new).append(lines[i][1:])
            i += 1
          if not old and prev_context is not None:
            old, new = [prev_context], [prev_context] + new
          edits.append(Edit(path, "\n".join(old), "\n".join(new)))
          continue
        prev_context = lines[i][1:] if lines[i].startswith(" ") else prev_context
        i += 1
      continue
    i += 1
  return edits


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
  """An assistant turn holding one tool call, in the chat template's format."""
  return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _tool_names(request: RenderedRequest) -> list[str]:
  names = []
  for t in request.tools or []:
    fn = t.get("function", t)
    if fn.get("name"):
      names.append(fn["name"])
  return names


def _params_of(request: RenderedRequest, name: str) -> set[str]:
  for t in request.tools or []:
    fn = t.get("function", t)
    if fn.get("name") == name:
      return set((fn.get("parameters") or {}).get("properties", {}))
  return set()


def _edit_tool(request: RenderedRequest):
  """(tool name, argument names for path/old/new) of an exact-replace edit tool, if any."""
  for name in _tool_names(request):
    props = _params_of(request, name)
    path = next((p for p in ("path", "file_path", "filePath", "filename") if p in props), None)
    old = next((p for p in ("old", "old_str", "old_string", "oldString") if p in props), None)
    new = next((p for p in ("new", "new_str", "new_string", "newString") if p in props), None)
    if path and old and new:
      extra = {"command": "str_replace"} if "command" in props else {}
      return name, path, old, new, extra
  return None


def _turns_taken(request: RenderedRequest) -> int:
  return sum(1 for m in request.messages if m.role == "assistant")


@dataclasses.dataclass
class ScriptedPolicy:
  """``reply(request) -> str`` for ``ScriptedBackend``; ``patch_for(request)`` finds the gold
  patch (e.g. by the task instruction in the first user message)."""

  patch_for: Callable[[RenderedRequest], str | None]
  run_tests: str | None = None       # shell command to run after fixing, e.g. the test runner
  finish_command: str | None = None  # e.g. mini-swe-agent's "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
  workdir_prefix: str = ""           # prepended to relative paths for tools that want absolute ones

  def plan(self, request: RenderedRequest) -> list[str]:
    patch = self.patch_for(request) or ""
    names = _tool_names(request)
    shell = next((n for n in names if n in _SHELL_TOOLS), None)
    finish = next((n for n in names if n in _FINISH_TOOLS), None)
    edit = _edit_tool(request)
    steps: list[str] = []
    if edit is not None and patch:
      name, p_arg, o_arg, n_arg, extra = edit
      for e in edits_from_patch(patch):
        path = (self.workdir_prefix.rstrip("/") + "/" + e.path) if self.workdir_prefix else e.path
        steps.append(tool_call_text(name, {**extra, p_arg: path, o_arg: e.old, n_arg: e.new}))
    elif shell is not None and patch:
      cmd = f"cat > /tmp/fix.diff <<'LEGORL_EOF'\n{patch.rstrip()}\nLEGORL_EOF\ngit apply /tmp/fix.diff"
      steps.append(tool_call_text(shell, _shell_args(request, shell, cmd)))
    elif patch:
      steps.append(f"Here is the fix:\n\n```diff\n{patch.rstrip()}\n```")
    if self.run_tests and shell is not None:
      steps.append(tool_call_text(shell, _shell_args(request, shell, self.run_tests)))
    if self.finish_command and shell is not None:
      steps.append(tool_call_text(shell, _shell_args(request, shell, self.finish_command)))
    elif finish is not None:
      steps.append(tool_call_text(finish, {}))
    else:
      steps.append("The fix is applied.")
    return steps

  def reply(self, request: RenderedRequest) -> str:
    steps = self.plan(request)
    return steps[min(_turns_taken(request), len(steps) - 1)]


def _shell_args(request: RenderedRequest, name: str, cmd: str) -> dict[str, Any]:
  props = _params_of(request, name)
  key = next((p for p in ("command", "cmd") if p in props), "command")
  args: dict[str, Any] = {key: cmd if key != "cmd" or "cmd" not in props else cmd}
  if "description" in props:
    args["description"] = "apply the fix"
  return args


def patches_by_instruction(tasks: Sequence) -> Callable[[RenderedRequest], str | None]:
  """Finds a task's gold patch by its instruction appearing in the conversation."""
  table = [(t.instruction.strip(), t.gold_patch) for t in tasks if t.gold_patch]

  def find(request: RenderedRequest) -> str | None:
    text = "\n".join(m.content for m in request.messages if m.role in ("user", "system"))
    for instruction, patch in table:
      if instruction and instruction in text:
        return patch
    return None

  return find
