"""Renamed variants of a template: fresh package, module and local-variable names.

A small policy trained on a few templates memorises their file paths and buggy lines
instead of reading them from the instruction, and then fails on every held-out template.
Variants make memorising useless: each one ships the same logic under new names (the package
directory, the module file, and the parameters and locals of the function that will carry the
bug), so the only way to fix a variant is to copy names from the prompt. Function names stay
(the examples call them) and so do the examples' results, which ``rename_function`` checks.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import keyword
import random
import tokenize

from legorl_jax.taskgen.synthetic.template import Module, Template

# Names variants draw from: plain words a Python programmer would use, each one token of the
# bundled tokenizer where it appears (a variable after a space, a package word alone and after
# "_", a module after "/"), so a path or a quoted line is copied token by token from the
# prompt rather than in word fragments (tests/taskgen/test_synthetic_rename.py checks this).
WORDS = (
    "active", "actual", "amount", "average", "base", "batch", "block", "bottom", "bound",
    "bucket", "chunk", "col", "cost", "count", "current", "data", "delta", "depth", "diff",
    "done", "empty", "entry", "extra", "field", "final", "first", "flag", "fresh", "full",
    "group", "head", "index", "inner", "item", "items", "key", "label", "last", "left", "level",
    "limit", "line", "load", "low", "lower", "name", "node", "num", "offset", "outer", "pair",
    "prev", "price", "rank", "rate", "ratio", "rest", "right", "row", "run", "scale", "score",
    "seed", "shape", "size", "slot", "span", "stack", "start", "state", "step", "stop", "tag",
    "target", "tax", "team", "text", "title", "top", "total", "tree", "turn", "unit", "upper",
    "user", "val", "value", "weight", "width", "word",
)
PACKAGES = (
    "account", "archive", "author", "balance", "board", "book", "branch", "budget", "card",
    "cart", "channel", "chapter", "client", "clock", "color", "course", "customer", "deck",
    "device", "discount", "folder", "game", "grade", "graph", "image", "inventory", "invoice",
    "kernel", "ledger", "matrix", "movie", "packet", "payment", "pixel", "player", "plugin",
    "product", "rating", "review", "room", "sensor", "student",
)
MODULES = ("core", "ops", "lib", "model", "table", "units", "steps", "report", "schema", "handler",
           "parser", "reader", "layer", "metric", "session", "summary", "record", "worker",
           "writer", "stream")


def _function_node(source: str, func: str) -> ast.FunctionDef:
  for node in ast.parse(source).body:
    if isinstance(node, ast.FunctionDef) and node.name == func:
      return node
  raise KeyError(func)


def _locals(fn: ast.FunctionDef) -> set[str]:
  names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
  names |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
  return names - {"_"}


def rename_function(source: str, func: str, mapping: dict[str, str]) -> str:
  """``source`` with the parameters and locals of ``func`` renamed by ``mapping``.

  Works on tokens inside the function's line span: attribute names (after ``.``) and keyword
  arguments in calls are left alone, as are strings, so only the variables change. Names in
  a one-line docstring written as ````name```` follow the rename so the documentation stays true.
  """
  fn = _function_node(source, func)
  first, last = fn.lineno, fn.end_lineno
  lines = source.splitlines(keepends=True)
  toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
  edits = []  # (row, col, old, new)
  depth, prev = 0, None
  for i, tok in enumerate(toks):
    if tok.type == tokenize.OP:
      depth += tok.string in "([{"
      depth -= tok.string in ")]}"
    in_span = first <= tok.start[0] <= last
    if in_span and tok.type == tokenize.NAME and tok.string in mapping:
      after = toks[i + 1] if i + 1 < len(toks) else None
      is_attr = prev is not None and prev.type == tokenize.OP and prev.string == "."
      is_kwarg = (depth > 0 and after is not None and after.type == tokenize.OP and after.string == "="
                  and not (fn.lineno == tok.start[0] and depth == 1))  # parameter defaults stay names
      if not is_attr and not is_kwarg:
        edits.append((tok.start[0], tok.start[1], tok.string, mapping[tok.string]))
    elif in_span and tok.type == tokenize.STRING and tok.start[0] == tok.end[0]:
      text = tok.string  # a one-line docstring: its ``name`` references follow the rename
      for a, b in mapping.items():
        text = text.replace(f"``{a}``", f"``{b}``")
      if text != tok.string:
        edits.append((tok.start[0], tok.start[1], tok.string, text))
    if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
      prev = tok
  for row, col, old, new in sorted(edits, reverse=True):
    line = lines[row - 1]
    lines[row - 1] = line[:col] + new + line[col + len(old):]
  return "".join(lines)


def variant(t: Template, module: Module, func: str, index: int) -> tuple[Template, Module] | None:
  """Variant ``index`` of (template, module, func); index 0 is the original.

  None when the renamed code could not be made to behave identically (a name clash).
  """
  if index == 0:
    return t, module
  rng = random.Random(f"{t.name}|{module.name}|{func}|{index}")
  source = module.source
  fn = _function_node(source, func)
  taken = {tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.NAME}
  free = [w for w in WORDS if w not in taken and not keyword.iskeyword(w)]
  olds = sorted(_locals(fn))
  if len(free) < len(olds):
    return None
  mapping = dict(zip(olds, rng.sample(free, len(olds))))
  new_source = rename_function(source, func, mapping)
  try:
    ast.parse(new_source)
  except SyntaxError:
    return None
  new_module = dataclasses.replace(module, name=rng.choice(MODULES), source=new_source)
  if any(m.name == new_module.name for m in t.modules if m is not module):
    new_module = dataclasses.replace(new_module, name=f"{new_module.name}_{index}")
  modules = tuple(new_module if m is module else m for m in t.modules)
  package = f"{rng.choice(PACKAGES)}_{rng.choice(PACKAGES)}"
  return dataclasses.replace(t, package=package, modules=modules), new_module
