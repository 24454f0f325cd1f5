"""The scripted policy: each answer format it produces really applies the gold patch.

The reference is ``git apply`` of the gold patch on the task's repository; each format
(exact-replace edits, the shell heredoc + git apply, aider's SEARCH/REPLACE blocks) is
applied independently and must give the same files.
"""

import json
import re
import subprocess

import pytest

from legorl_jax.harnesses.scripted import (ScriptedPolicy, edits_from_patch,
                                           patches_by_instruction, search_replace_blocks)
from legorl_jax.proxy.types import Message, RenderedRequest
from legorl_jax.tasks.repo import materialize_repo
from legorl_jax.taskgen.synthetic import generate_tasks

EDIT_TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "edit", "parameters": {
        "type": "object", "properties": {"path": {}, "old": {}, "new": {}}}}},
    {"type": "function", "function": {"name": "submit", "parameters": {"type": "object"}}},
]
BASH_ONLY = EDIT_TOOLS[:1]


@pytest.fixture(scope="module")
def tasks():
  return generate_tasks(4, seed=3, difficulty="easy")


def _repo(task, path):
  materialize_repo(task.repo, str(path))
  subprocess.run(["git", "init", "-q"], cwd=path, check=True)
  return path


def _files(path, rel):
  return (path / rel).read_text()


def _changed(patch):
  return sorted(set(re.findall(r"^\+\+\+ b/(\S+)", patch, re.M)))


def _reference(task, tmp_path):
  ref = _repo(task, tmp_path / "ref")
  subprocess.run(["git", "apply", "-"], input=task.gold_patch, text=True, cwd=ref, check=True)
  return ref


def _req(messages, tools=(), system=None):
  msgs = ([Message("system", system)] if system else []) + [Message(r, c) for r, c in messages]
  return RenderedRequest(api="chat", model="policy", messages=msgs, tools=list(tools))


def _call(text):
  m = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", text, re.S)
  assert m, text
  return json.loads(m.group(1))


def test_edits_reproduce_gold_patch(tasks, tmp_path):
  for k, task in enumerate(tasks):
    ref = _reference(task, tmp_path / str(k))
    work = _repo(task, tmp_path / str(k) / "edits")
    for e in edits_from_patch(task.gold_patch):
      text = (work / e.path).read_text()
      assert text.count(e.old) == 1, (task.id, e)
      (work / e.path).write_text(text.replace(e.old, e.new, 1))
    for rel in _changed(task.gold_patch):
      assert _files(work, rel) == _files(ref, rel)


def test_search_replace_blocks_reproduce_gold_patch(tasks, tmp_path):
  block_re = re.compile(r"^(\S+)\n```\w*\n<<<<<<< SEARCH\n(.*?)\n?=======\n(.*?)\n?>>>>>>> REPLACE\n```",
                        re.S | re.M)
  for k, task in enumerate(tasks):
    ref = _reference(task, tmp_path / str(k))
    work = _repo(task, tmp_path / str(k) / "blocks")
    blocks = block_re.findall(search_replace_blocks(task.gold_patch))
    assert blocks
    for path, old, new in blocks:
      text = (work / path).read_text()
      assert text.count(old) == 1
      (work / path).write_text(text.replace(old, new, 1))
    for rel in _changed(task.gold_patch):
      assert _files(work, rel) == _files(ref, rel)


def test_edit_tool_plan(tasks):
  task = tasks[0]
  policy = ScriptedPolicy(patches_by_instruction(tasks))
  history = [("user", task.instruction)]
  n_edits = len(edits_from_patch(task.gold_patch))
  for turn in range(n_edits + 1):
    call = _call(policy.reply(_req(history, EDIT_TOOLS, system="You fix bugs.")))
    assert call["name"] == ("edit" if turn < n_edits else "submit")
    history += [("assistant", "x"), ("user", "result")]  # assistant turns are what count


def test_shell_plan_applies_patch_and_reads_finish_command(tasks, tmp_path):
  task = tasks[1]
  ref = _reference(task, tmp_path)
  policy = ScriptedPolicy(patches_by_instruction(tasks))
  prompt = f"Please solve this issue: {task.instruction}\nFinish with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."
  first = _call(policy.reply(_req([("user", prompt)], BASH_ONLY)))
  work = _repo(task, tmp_path / "shell")
  r = subprocess.run(["bash", "-c", first["arguments"]["command"]], cwd=work, capture_output=True,
                     text=True)
  assert r.returncode == 0, r.stderr
  for rel in _changed(task.gold_patch):
    assert _files(work, rel) == _files(ref, rel)
  second = _call(policy.reply(_req([("user", prompt), ("assistant", "a"), ("tool", "ok")],
                                   BASH_ONLY)))
  assert second["arguments"]["command"] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_text_protocol_counts_turns_from_the_task_message(tasks):
  task = tasks[2]
  policy = ScriptedPolicy(patches_by_instruction(tasks))
  system = "Describe each change with a *SEARCH/REPLACE block*."
  examples = [("user", "Change get_factorial()"), ("assistant", "example answer"),
              ("user", "I added these files"), ("assistant", "Ok.")]
  first = policy.reply(_req(examples + [("user", task.instruction)], system=system))
  assert "<<<<<<< SEARCH" in first and first.endswith("```")
  later = policy.reply(_req(examples + [("user", task.instruction), ("assistant", first),
                                        ("user", "lint ok?")], system=system))
  assert "SEARCH" not in later
  # without the aider prompt the text protocol is a fenced unified diff
  plain = policy.reply(_req([("user", task.instruction)]))
  assert plain.startswith("Here is the fix:") and "```diff" in plain


def test_unknown_task_gets_no_patch(tasks):
  policy = ScriptedPolicy(patches_by_instruction(tasks))
  call = _call(policy.reply(_req([("user", "something else entirely")], EDIT_TOOLS)))
  assert call["name"] == "submit"


def _shortest_unique_replacement(old, new, text, gold_text):
  """Reference for ``minimal_edit``, by characters: the shortest substring ``o`` of ``old``,
  starting and ending on a non-blank word or punctuation boundary of both ``old`` and ``new``,
  with its counterpart ``n`` in ``new`` (same untouched text on both sides), such that ``o`` occurs once in ``text`` and
  replacing it gives ``gold_text``."""
  def boundary(s, x):  # a token boundary of the word/space/punctuation tokenisation
    kind = lambda ch: "w" if (ch.isalnum() or ch == "_") else "s" if ch.isspace() else "p"  # noqa: E731
    return x in (0, len(s)) or kind(s[x - 1]) != kind(s[x])
  delta, best = len(new) - len(old), None
  for x in range(len(old)):
    for y in range(x + 1, len(old) + 1):
      o = old[x:y]
      whole = (x, y) == (0, len(old))
      if not whole and (o[0].isspace() or o[-1].isspace() or not boundary(old, x) or not boundary(old, y)):
        continue
      if old[:x] != new[:x] or old[y:] != new[y + delta:] or y + delta < x:
        continue
      if not boundary(new, x) or not boundary(new, y + delta):  # cuts between tokens on both sides
        continue
      n = new[x:y + delta]
      if text.count(o) == 1 and text.replace(o, n) == gold_text and (best is None or len(o) < len(best[0])):
        best = (o, n)
  return best


def test_minimal_edit_is_the_shortest_unique_replacement():
  from legorl_jax.harnesses.scripted import _archive_texts, minimal_edit
  tasks = generate_tasks(60, seed=5, difficulty="hinted", variants=3)
  shrunk = 0
  for task in tasks:
    files = _archive_texts(task.repo)
    for e in edits_from_patch(task.gold_patch):
      text = files[e.path]
      gold_text = text.replace(e.old, e.new)
      m = minimal_edit(e, text)
      assert m.path == e.path and text.count(m.old) == 1, (task.id, m)
      assert text.replace(m.old, m.new) == gold_text, (task.id, m)
      ref = _shortest_unique_replacement(e.old, e.new, text, gold_text)
      assert len(m.old) == len(ref[0]), (task.id, m, ref)
      shrunk += len(m.old) < len(e.old)
  assert shrunk == len(tasks)  # every one-line synthetic fix quotes less than its whole line


def test_minimal_edit_keeps_an_edit_it_cannot_make_exact():
  from legorl_jax.harnesses.scripted import Edit, minimal_edit
  e = Edit("m.py", "x = 1", "x = 2")
  assert minimal_edit(e, "x = 1\nx = 1\n") == e   # old is not unique: nothing shorter is exact
  assert minimal_edit(e, "y = 0\n") == e          # old is absent
  assert minimal_edit(e, "x = 1\ny = 1\n") == Edit("m.py", "x = 1", "x = 2")  # "1", "= 1" repeat
  assert minimal_edit(e, "x = 1\ny = 0\n") == Edit("m.py", "1", "2")


def test_minimal_edits_plan_applies_the_gold_patch(tmp_path):
  """Two hunks in one file: each shrunk edit must be unique in the file as the earlier edit
  left it, and the plan's edits applied in order give the gold file."""
  from legorl_jax.tasks.repo import files_to_archive
  from legorl_jax.tasks.schema import RepoSource
  from legorl_jax.sandbox.diff import compute_diff
  before = "def f(a):\n    return a + 1\n\n\ndef g(a):\n    return 3 * a + 1\n"
  after = "def f(a):\n    return a + 2\n\n\ndef g(a):\n    return 3 * a - 1\n"
  patch = compute_diff({"m.py": before.encode()}, {"m.py": after.encode()}).patch

  class _Task:
    instruction, gold_patch, workdir = "Fix f and g in m.py.", patch, None
    repo = RepoSource(kind="archive", data=files_to_archive({"m.py": before}))

  policy = ScriptedPolicy(patches_by_instruction([_Task]), minimal_edits=True)
  history, text, olds = [("user", _Task.instruction)], before, []
  n_edits = len(edits_from_patch(patch))
  for _ in range(n_edits):
    call = _call(policy.reply(_req(history, EDIT_TOOLS)))
    args = call["arguments"]
    assert call["name"] == "edit" and text.count(args["old"]) == 1, args
    text = text.replace(args["old"], args["new"])
    olds.append(args["old"])
    history += [("assistant", "x"), ("user", "edited")]
  assert text == after
  # "+ 1" and "a + 1" occur twice before the first edit, "+ 1" once after it.
  assert olds == ["return a + 1", "+ 1"], olds
  assert _call(policy.reply(_req(history, EDIT_TOOLS)))["name"] == "submit"
