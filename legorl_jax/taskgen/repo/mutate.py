"""The functions of a project and the procedural mutations of each.

The line mutators of the synthetic tasks (``taskgen/synthetic/mutations.py``: operator and
comparison flips, off-by-one and wrong constants, swapped arguments, a dropped guard, a wrong
return) are applied to every function and method of the project's non-test sources; three
more families suit real code: ``removed_statement`` (one simple statement dropped),
``inverted_return`` (a boolean return negated) and ``removed_condition`` (one operand of an
``and``/``or`` in an ``if``/``while`` dropped). A mutation is kept only when the file still
parses and its AST differs from the original (a changed comment is no bug), and never
touches a line inside a multi-line string.
"""

from __future__ import annotations

import ast
import dataclasses
import os

from legorl_jax.taskgen.repo.env_spec import is_test_file
from legorl_jax.taskgen.synthetic.mutations import Mutation, mutations_in_lines

EXTRA_FAMILIES = ("removed_statement", "inverted_return", "removed_condition")
_SKIP_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "benchmark", "scripts", "tools"}
_SKIP_FILES = {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "_version.py", "version.py"}
_BOOL_CALLS = {"isinstance", "issubclass", "hasattr", "callable", "any", "all", "startswith",
               "endswith", "isdigit", "isalpha", "isidentifier", "match", "fullmatch"}


@dataclasses.dataclass(frozen=True)
class FunctionSite:
  """One function or method: ``path`` repo-relative, ``qualname`` like ``Class.method``,
  ``first``..``last`` the 1-based lines of its body without the docstring."""
  path: str
  qualname: str
  first: int
  last: int


def source_files(root: str) -> list[str]:
  """Repo-relative .py files that are project code (not tests, docs, examples, set-up)."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root)
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS
                         and not d.endswith(".egg-info"))
    for f in sorted(filenames):
      rel = os.path.normpath(os.path.join(rel_dir, f))
      if f.endswith(".py") and f not in _SKIP_FILES and not is_test_file(rel):
        out.append(rel)
  return out


def functions_of(source: str, path: str) -> list[FunctionSite]:
  """Every function with a body beyond its docstring (and beyond ``pass`` / ``...``)."""
  try:
    tree = ast.parse(source)
  except SyntaxError:
    return []
  out = []

  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        qual = f"{prefix}{child.name}"
        body = child.body
        if body and _is_docstring(body[0]):
          body = body[1:]
        if body and not all(isinstance(s, ast.Pass) or _is_ellipsis(s) for s in body):
          out.append(FunctionSite(path, qual, body[0].lineno, child.end_lineno))
        visit(child, qual + ".")
      elif isinstance(child, ast.ClassDef):
        visit(child, f"{prefix}{child.name}.")
      else:
        visit(child, prefix)

  visit(tree, "")
  return out


def _is_docstring(stmt) -> bool:
  return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_ellipsis(stmt) -> bool:
  return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis


def _string_lines(tree) -> set[int]:
  """Lines inside multi-line string literals (and f-strings), where no mutation may go."""
  out = set()
  for n in ast.walk(tree):
    if isinstance(n, (ast.Constant, ast.JoinedStr)) and getattr(n, "end_lineno", None) \
        and n.end_lineno > n.lineno and (isinstance(n, ast.JoinedStr) or isinstance(n.value, (str, bytes))):
      out.update(range(n.lineno, n.end_lineno + 1))
  return out


def _node_at(tree, site: FunctionSite):
  for n in ast.walk(tree):
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno == site.last:
      body = n.body[1:] if n.body and _is_docstring(n.body[0]) else n.body
      if body and body[0].lineno == site.first:
        return n
  raise KeyError(site.qualname)


def mutations_of(source: str, site: FunctionSite) -> list[Mutation]:
  """Every kept mutation of ``site`` in ``source`` (see the module docstring), in line order."""
  tree = ast.parse(source)
  fn = _node_at(tree, site)
  lines = source.split("\n")
  cands = mutations_in_lines(source, site.first, site.last, fn) + _extra(lines, fn, site)
  banned = _string_lines(tree)
  ref = ast.dump(tree)
  out, seen = [], set()
  for m in cands:
    span = range(m.lineno, m.lineno + m.old.count("\n") + 1)
    key = (m.lineno, m.old, m.new)
    if key in seen or any(ln in banned for ln in span):
      continue
    seen.add(key)
    try:
      mutated = ast.parse(m.apply(source))
    except (SyntaxError, AssertionError, ValueError):
      continue
    if ast.dump(mutated) != ref:
      out.append(m)
  return sorted(out, key=lambda m: (m.lineno, m.family, m.new))


def _extra(lines: list[str], fn, site: FunctionSite) -> list[Mutation]:
  out = []
  for node in ast.walk(fn):
    for field in ("body", "orelse", "finalbody"):
      block = getattr(node, field, None)
      if isinstance(block, list) and len(block) > 1:
        for stmt in block:
          if (isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or
              (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call))) \
              and stmt.lineno == stmt.end_lineno and site.first <= stmt.lineno <= site.last:
            line = lines[stmt.lineno - 1]
            if ";" not in line:
              out.append(Mutation("removed_statement", stmt.lineno, line, ""))
    if isinstance(node, ast.Return) and node.value is not None and node.lineno == node.end_lineno:
      m = _inverted_return(lines, node)
      if m:
        out.append(m)
    if isinstance(node, (ast.If, ast.While)) and isinstance(node.test, ast.BoolOp) \
        and node.test.lineno == node.test.end_lineno == node.lineno:
      out += _removed_conditions(lines, node)
  return [m for m in out if site.first <= m.lineno <= site.last]


def _segment(line: str, node) -> str:
  """Source text of ``node`` on ``line`` (AST offsets count UTF-8 bytes: ASCII lines only)."""
  return line[node.col_offset:node.end_col_offset] if line.isascii() else "\0"


def _inverted_return(lines, node) -> Mutation | None:
  v = node.value
  line = lines[node.lineno - 1]
  indent = line[:len(line) - len(line.lstrip())]
  expr = _segment(line, v)
  if line.strip() != f"return {expr}":
    return None
  if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not):
    new = _segment(line, v.operand)
  elif isinstance(v, (ast.Compare, ast.BoolOp)) or (
      isinstance(v, ast.Call) and (getattr(v.func, "id", None) or getattr(v.func, "attr", None)) in _BOOL_CALLS):
    new = f"not ({expr})" if isinstance(v, ast.BoolOp) else f"not {expr}"
  else:
    return None
  return Mutation("inverted_return", node.lineno, line, f"{indent}return {new}")


def _removed_conditions(lines, node) -> list[Mutation]:
  line = lines[node.lineno - 1]
  test = node.test
  whole = _segment(line, test)
  head = line[:test.col_offset]
  tail = line[test.end_col_offset:]
  if not head.rstrip().endswith(("if", "elif", "while")) or tail.strip() != ":":
    return []
  op = " and " if isinstance(test.op, ast.And) else " or "
  parts = [_segment(line, v) for v in test.values]
  if op.join(parts) != whole:
    return []
  return [Mutation("removed_condition", node.lineno, line, head + op.join(parts[:i] + parts[i + 1:]) + tail)
          for i in range(len(parts))]
