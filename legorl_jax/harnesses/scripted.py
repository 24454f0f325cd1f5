"""A scripted policy: solves a task with a known gold patch in whatever harness asks.

It sits behind the proxy like any policy (``proxy.backend.ScriptedBackend``), so its answers
go through the tokenizer and the recorder: runs with it test the harness plumbing end to end,
and their recordings are supervised demonstrations in each harness's native format.

Plan per request, from the conversation so far (the harness resends it every turn):
  1. apply the fix: with an exact-replace edit tool (``edit``, ``str_replace_based_edit_tool``,
     ``Edit``...) one call per changed block (whole lines, or with ``minimal_edits`` the fewest
     whole tokens around the change that occur once in the file); otherwise write and ``git apply`` the patch with
     the shell tool; without tools, answer in the text protocol: SEARCH/REPLACE blocks when the
     system prompt asks for them (aider's ``diff`` format), else a fenced diff;
  2. optionally run the tests with the shell tool;
  3. finish: the ``submit`` / ``finish`` tool, the harness's finish command, or plain text.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Sequence

from legorl_jax.proxy.types import RenderedRequest
from legorl_jax.sandbox.diff import snapshot_tar

_SHELL_TOOLS = ("bash", "shell", "exec_command", "execute_bash", "terminal", "Bash", "run_shell_command")
_FINISH_TOOLS = ("submit", "finish", "task_complete", "attempt_completion")
# Finish commands harnesses announce in their prompts (used when ``finish_command`` is unset).
KNOWN_FINISH_COMMANDS = ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",)


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


_TOKEN = re.compile(r"\w+|\s+|[^\w\s]+")


def minimal_edit(edit: Edit, text: str) -> Edit:
  """The shortest equivalent edit: the changed tokens plus the fewest neighbouring tokens that
  make ``old`` occur exactly once in ``text`` (the file the edit applies to).

  Agents write short exact-replace edits; a demonstration that quotes whole lines makes a
  policy learn to copy long spans, most of which it could leave alone. Tokens are words,
  whitespace runs and punctuation runs, so the edit never splits a name or a number, and it
  starts and ends on a non-blank token. Returns ``edit`` unchanged when its ``old`` is not
  exactly once in ``text`` (nothing shorter could be exact then).
  """
  if not edit.old or text.count(edit.old) != 1:
    return edit
  a, b = _TOKEN.findall(edit.old), _TOKEN.findall(edit.new)
  p = 0
  while p < min(len(a), len(b)) and a[p] == b[p]:
    p += 1
  s = 0
  while s < min(len(a), len(b)) - p and a[-1 - s] == b[-1 - s]:
    s += 1
  # Windows a[i:j] cover the changed old tokens a[p:len(a)-s]; the new side is b[i:j+len(b)-len(a)].
  best = (len(edit.old), 0, len(a))
  for i in range(p + 1):
    for j in range(len(a) - s, len(a) + 1):
      if j <= i or (i, j) == (0, len(a)) or a[i].isspace() or a[j - 1].isspace():
        continue
      old = "".join(a[i:j])
      if len(old) < best[0] and text.count(old) == 1:
        best = (len(old), i, j)
  _, i, j = best
  return Edit(edit.path, "".join(a[i:j]), "".join(b[i:j + len(b) - len(a)]))


def search_replace_blocks(patch: str) -> str:
  """aider's ``diff`` edit format for a unified diff: one SEARCH/REPLACE block per hunk,
  the hunk's context and removed lines replaced by its context and added lines."""
  blocks, path, lang = [], None, ""
  lines = patch.splitlines()
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.startswith("+++ "):
      target = line[4:].strip()
      path = target[2:] if target.startswith("b/") else target
      lang = "python" if path.endswith(".py") else ""
    elif line.startswith("@@"):
      old, new = [], []
      i += 1
      while i < len(lines) and not lines[i].startswith(("@@", "diff ", "--- ")):
        h = lines[i]
        if h.startswith("-"):
          old.append(h[1:])
        elif h.startswith("+"):
          new.append(h[1:])
        elif not h.startswith("\\"):
          old.append(h[1:])
          new.append(h[1:])
        i += 1
      while old and new and old[-1] == new[-1] == "":  # trailing blank context adds nothing
        old.pop()
        new.pop()
      blocks.append("\n".join([path, f"```{lang}", "<<<<<<< SEARCH", *old, "=======", *new,
                               ">>>>>>> REPLACE", "```"]))
      continue
    i += 1
  return "\n\n".join(blocks)


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


def _schema_of(request: RenderedRequest, name: str) -> dict:
  for t in request.tools or []:
    fn = t.get("function", t)
    if fn.get("name") == name:
      return fn.get("parameters") or {}
  return {}


def _wants_absolute(request: RenderedRequest, name: str, arg: str) -> bool:
  """True when the tool's schema says its path argument must be absolute (OpenHands)."""
  prop = _schema_of(request, name).get("properties", {}).get(arg) or {}
  return "absolute" in str(prop.get("description", "")).lower()


def _finish_args(request: RenderedRequest, name: str) -> dict[str, Any]:
  """Required string arguments of the finish tool (e.g. OpenHands' ``message``) filled in."""
  schema = _schema_of(request, name)
  props = schema.get("properties", {})
  return {k: "The fix is applied." for k in schema.get("required", [])
          if (props.get(k) or {}).get("type", "string") == "string"}


def _edit_tool(request: RenderedRequest):
  """(tool name, argument names for path/old/new) of an exact-replace edit tool, if any."""
  for name in _tool_names(request):
    props = _params_of(request, name)
    path = next((p for p in ("path", "file_path", "filePath", "filename") if p in props), None)
    old = next((p for p in ("old", "old_str", "old_string", "oldString") if p in props), None)
    new = next((p for p in ("new", "new_str", "new_string", "newString") if p in props), None)
    if path and old and new:
      extra = {"command": "str_replace"} if "command" in props else {}
      # Claude Code sends its Edit calls back with the schema default filled in; stating it
      # keeps the echoed call identical to the sampled one (so the proxy splices it).
      extra.update({p: False for p in ("replace_all",) if p in props})
      return name, path, old, new, extra
  return None


def _read_tool(request: RenderedRequest):
  """(tool name, path argument) of a file-read tool named ``Read``/``read`` (Claude Code's
  and OpenCode's), if any: Claude Code's ``Edit`` refuses a file not read first."""
  names = _tool_names(request)
  for name in ("Read", "read"):
    if name in names:
      props = _params_of(request, name)
      path = next((p for p in ("file_path", "filePath", "path") if p in props), None)
      if path:
        return name, path
  return None


def _turns_taken(request: RenderedRequest, start: int = 0) -> int:
  return sum(1 for m in request.messages[start:] if m.role == "assistant")


@dataclasses.dataclass
class ScriptedPolicy:
  """``reply(request) -> str`` for ``ScriptedBackend``; ``patch_for(request)`` finds the gold
  patch (e.g. by the task instruction in the first user message)."""

  patch_for: Callable[[RenderedRequest], str | None]
  run_tests: str | None = None       # shell command to run after fixing, e.g. the test runner
  finish_command: str | None = None  # e.g. mini-swe-agent's "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
  workdir_prefix: str = ""           # prepended to relative paths for tools that want absolute ones
  minimal_edits: bool = False        # shrink edit-tool calls with ``minimal_edit`` (needs file texts)

  def plan(self, request: RenderedRequest) -> list[str]:
    patch = self.patch_for(request) or ""
    names = _tool_names(request)
    shell = next((n for n in names if n in _SHELL_TOOLS), None)
    finish = next((n for n in names if n in _FINISH_TOOLS), None)
    edit = _edit_tool(request)
    steps: list[str] = []
    if edit is not None and patch:
      name, p_arg, o_arg, n_arg, extra = edit
      read = _read_tool(request)
      seen = set()
      prefix = self.workdir_prefix
      if not prefix and _wants_absolute(request, name, p_arg):
        workdir_of = getattr(self.patch_for, "workdir", None)  # else the sandbox default
        prefix = (workdir_of(request) if workdir_of is not None else None) or "/workspace"
      for e in self._edits(request, patch):
        path = (prefix.rstrip("/") + "/" + e.path) if prefix else e.path
        if read is not None and path not in seen:  # read each file before its first edit
          seen.add(path)
          steps.append(tool_call_text(read[0], {read[1]: path}))
        steps.append(tool_call_text(name, {**extra, p_arg: path, o_arg: e.old, n_arg: e.new}))
    elif shell is not None and patch:
      # Not rstrip(): a hunk's trailing context lines may be blank (" ") and must stay.
      body = patch if patch.endswith("\n") else patch + "\n"
      cmd = f"cat > /tmp/fix.diff <<'LEGORL_EOF'\n{body}LEGORL_EOF\ngit apply /tmp/fix.diff"
      steps.append(tool_call_text(shell, _shell_args(request, shell, cmd)))
    elif patch and "SEARCH/REPLACE" in request.system_text():
      steps.append("Here are the *SEARCH/REPLACE* blocks:\n\n" + search_replace_blocks(patch))
    elif patch:
      steps.append(f"Here is the fix:\n\n```diff\n{patch.rstrip()}\n```")
    if self.run_tests and shell is not None:
      steps.append(tool_call_text(shell, _shell_args(request, shell, self.run_tests)))
    finish_command = self.finish_command or _announced_finish_command(request)
    if finish_command and shell is not None:
      steps.append(tool_call_text(shell, _shell_args(request, shell, finish_command)))
    elif finish is not None:
      steps.append(tool_call_text(finish, _finish_args(request, finish)))
    else:
      steps.append("The fix is applied.")
    return steps

  def _edits(self, request: RenderedRequest, patch: str) -> list[Edit]:
    edits = edits_from_patch(patch)
    file_text = getattr(self.patch_for, "file_text", None)
    if not self.minimal_edits or file_text is None:
      return edits
    texts: dict[str, str | None] = {}
    out = []
    for e in edits:  # in order: each edit is shrunk against the file as the earlier ones left it
      if e.path not in texts:
        texts[e.path] = file_text(request, e.path)
      text = texts[e.path]
      if text is None:
        out.append(e)
        continue
      e = minimal_edit(e, text)
      texts[e.path] = text.replace(e.old, e.new, 1)
      out.append(e)
    return out

  def reply(self, request: RenderedRequest) -> str:
    steps = self.plan(request)
    # Turns count from the task's message: harnesses may put example exchanges before it.
    locate = getattr(self.patch_for, "locate", None)
    start = locate(request)[1] if locate is not None else 0
    return steps[min(_turns_taken(request, max(start, 0)), len(steps) - 1)]


def _announced_finish_command(request: RenderedRequest) -> str | None:
  text = "\n".join(m.content for m in request.messages[:3] if m.role in ("system", "user"))
  return next((c for c in KNOWN_FINISH_COMMANDS if c in text), None)


def _shell_args(request: RenderedRequest, name: str, cmd: str) -> dict[str, Any]:
  props = _params_of(request, name)
  key = next((p for p in ("command", "cmd") if p in props), "command")
  args: dict[str, Any] = {key: cmd if key != "cmd" or "cmd" not in props else cmd}
  if "description" in props:
    args["description"] = "apply the fix"
  return args


def patches_by_instruction(tasks: Sequence) -> Callable[[RenderedRequest], str | None]:
  """Finds a task's gold patch by its instruction appearing in the conversation."""
  return PatchTable([(t.instruction.strip(), t.gold_patch) for t in tasks if t.gold_patch],
                    {t.instruction.strip(): t.workdir for t in tasks},
                    {t.instruction.strip(): t.repo for t in tasks})


@dataclasses.dataclass
class PatchTable:
  """``(instruction, gold patch)`` pairs; calling it finds the request's patch."""

  entries: list[tuple[str, str]]
  workdirs: dict[str, str] = dataclasses.field(default_factory=dict)
  repos: dict[str, Any] = dataclasses.field(default_factory=dict)  # instruction -> RepoSource
  _files: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict, repr=False)
  _patches: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

  def __post_init__(self):
    for instruction, patch in self.entries:  # the first patch of an instruction wins
      self._patches.setdefault(instruction, patch)

  def file_text(self, request: RenderedRequest, path: str) -> str | None:
    """The text of ``path`` in the request's task repository before any edit, when the task
    ships its repository as archive bytes (synthetic tasks do); else None."""
    instruction, _ = _find_instruction(request, self.repos)
    if instruction is None:
      return None
    if instruction not in self._files:
      self._files[instruction] = _archive_texts(self.repos[instruction])
    return self._files[instruction].get(path)

  def workdir(self, request: RenderedRequest) -> str | None:
    """The work dir of the request's task (for tools that want absolute paths)."""
    instruction, _ = _find_instruction(request, self.workdirs)
    return None if instruction is None else self.workdirs[instruction]

  def locate(self, request: RenderedRequest) -> tuple[str | None, int]:
    """(patch, index of the first user/system message holding the instruction) or (None, -1)."""
    instruction, k = _find_instruction(request, self._patches)
    return (None, -1) if instruction is None else (self._patches[instruction], k)

  def __call__(self, request: RenderedRequest) -> str | None:
    return self.locate(request)[0]


def _find_instruction(request: RenderedRequest, instructions) -> tuple[str | None, int]:
  """(the first of ``instructions`` found in a user/system message, that message's index),
  scanning messages in order, or (None, -1)."""
  for k, m in enumerate(request.messages):
    if m.role not in ("user", "system") or not m.content:
      continue
    for instruction in instructions:
      if instruction and instruction in m.content:
        return instruction, k
  return None, -1


def _archive_texts(repo) -> dict[str, str]:
  """{path: text} of a repository given as in-memory archive bytes ({} for other kinds)."""
  if repo is None or getattr(repo, "kind", None) != "archive" or not getattr(repo, "data", None):
    return {}
  out = {}
  for path, data in snapshot_tar(repo.data).items():
    try:
      out[path] = data.decode()
    except UnicodeDecodeError:
      continue
  return out
