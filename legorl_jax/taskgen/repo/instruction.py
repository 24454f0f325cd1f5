"""Issue-style instructions: the symptom (failing tests and their assertion output), never
the fix.

The text names up to three failing tests (their names, without the test file's path) and
the message each failed with: pytest's assertion explanation or the exception text, never
the traceback. Lines that would give the fix away are left out: any line naming the mutated
function (as a whole identifier) or its file, and any line that quotes the test source.
Memory addresses are blanked so the text is the same on every run.
"""

from __future__ import annotations

import re

MAX_TESTS = 3
MAX_LINES = 12
MAX_CHARS = 700
MIN_QUOTE_CHARS = 12  # test-source lines at least this long must not appear in the text
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")


def _ident(name: str) -> re.Pattern:
  return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")


def leak_patterns(path: str, qualname: str, project: str = "") -> list[re.Pattern]:
  """What must not appear: the function's name as an identifier, the file's path (with or
  without ``.py``) and, below the top package, its dotted module name. A name that is the
  project's own (a one-module project ``parse`` whose main function is ``parse``) is exempt:
  the instruction has to say which project it is about."""
  func = qualname.split(".")[-1]
  stem = path.removesuffix(".py")
  names = [func, stem]
  mod = stem.removesuffix("/__init__").replace("/", ".")
  for prefix in ("src.", "lib."):
    mod = mod.removeprefix(prefix)
  if "." in mod:
    names.append(mod)
  own = {project.lower(), project.lower().replace("-", "_")}
  return [re.compile(re.escape(path))] + [_ident(n) for n in dict.fromkeys(names) if n.lower() not in own]


def source_lines(test_sources: dict[str, str]) -> set[str]:
  """The stripped lines of the test files that are long enough to count as a quote."""
  return {l.strip() for text in test_sources.values() for l in text.splitlines()
          if len(l.strip()) >= MIN_QUOTE_CHARS}


def quotes_source(text: str, lines: set[str]) -> bool:
  return any(l in text for l in lines)


def _message_lines(message: str, leaks, quoted) -> list[str]:
  out = []
  for line in _ADDR.sub("0x...", message).replace("\r", "").splitlines():
    if not line.strip() or any(p.search(line) for p in leaks) or quotes_source(line, quoted):
      continue
    out.append(line.rstrip()[:200])
    if len(out) >= MAX_LINES:
      break
  text = "\n".join(out)
  return text[:MAX_CHARS].splitlines()


def test_name(test_id: str) -> str:
  """``tests/test_x.py::TestA::test_b[1]`` -> ``TestA::test_b[1]``."""
  parts = test_id.split("::")
  return "::".join(parts[1:]) if len(parts) > 1 and parts[0].endswith(".py") else test_id


def make_instruction(project: str, failing: list[tuple[str, str]], *, path: str, qualname: str,
                     test_sources: dict[str, str]) -> str | None:
  """The instruction for a task whose ``failing`` [(test id, message)] tests fail, or None
  when no failing test can be named without giving away where the bug is."""
  leaks = leak_patterns(path, qualname, project)
  quoted = source_lines(test_sources)
  shown = []
  for tid, msg in failing:
    name = test_name(tid)
    if any(p.search(name) for p in leaks) or quotes_source(name, quoted):
      continue
    shown.append((name, _message_lines(msg, leaks, quoted)))
    if len(shown) >= MAX_TESTS:
      break
  if not shown:
    return None
  n = len(failing)
  head = (f"{project}: {n} test{'s' if n != 1 else ''} started failing\n\n"
          f"After a recent change, {'these tests' if len(shown) > 1 else 'this test'} of {project} "
          f"fail{'' if len(shown) > 1 else 's'}" + (f" ({n - len(shown)} more fail{'s' if n - len(shown) == 1 else ''} as well)"
             if n > len(shown) else "")
          + ":\n")
  body = []
  for name, lines in shown:
    body.append(f"\n- `{name}`")
    if lines:
      body.append("\n" + "\n".join("      " + l for l in lines))
  tail = ("\n\nThe failing tests are kept by the maintainers and are not in your checkout. The "
          "tests are right; change the library code so that they pass again without breaking "
          "any other behaviour.")
  text = head + "".join(body) + tail
  if any(p.search(text) for p in leaks) or quotes_source(text, quoted):
    return None
  return text
