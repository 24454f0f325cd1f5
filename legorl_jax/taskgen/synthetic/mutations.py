"""Bug injection: every single-site mutation of one function, by bug family.

Mutations are textual, on one line of the function body (``missing_edge_case`` removes a
two-line guard), so the fix is one exact-string edit and the gold patch a one-hunk diff.
Code inside string literals and docstrings is never touched. Whether a mutation is a real
bug (changes some example's result) is decided later, by running the examples.
"""

from __future__ import annotations

import ast
import dataclasses
import re

FAMILIES = ("wrong_operator", "off_by_one", "wrong_constant", "swapped_arguments", "missing_edge_case",
            "wrong_return")

_OPERATOR_SWAPS = [(" <= ", " < "), (" >= ", " > "), (" < ", " <= "), (" > ", " >= "), (" == ", " != "),
                   (" != ", " == "), (" + ", " - "), (" - ", " + "), (" * ", " + "), (" // ", " / "),
                   (" % ", " // "), (" and ", " or "), (" or ", " and "), (" += ", " -= "), (" -= ", " += ")]
_STRING = re.compile(r"""f?(\"[^\"\\]*(?:\\.[^\"\\]*)*\"|'[^'\\]*(?:\\.[^'\\]*)*')""")
_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+|\d+)(?![\w.])")
_CALL2 = re.compile(r"\b([A-Za-z_][\w.]*)\(([^(),\[\]]+), ([^(),\[\]=]+)\)")
_RANGE1 = re.compile(r"\brange\(([^(),]+(?:\([^()]*\))?)\)")


@dataclasses.dataclass(frozen=True)
class Mutation:
  family: str
  lineno: int          # 1-based first line replaced
  old: str             # exact original text (one or two lines, no trailing newline)
  new: str             # replacement ("" removes the lines)

  def apply(self, source: str) -> str:
    lines = source.split("\n")
    n_old = self.old.count("\n") + 1
    assert "\n".join(lines[self.lineno - 1:self.lineno - 1 + n_old]) == self.old
    new_lines = [] if self.new == "" else self.new.split("\n")
    return "\n".join(lines[:self.lineno - 1] + new_lines + lines[self.lineno - 1 + n_old:])


def _string_spans(line):
  return [m.span() for m in _STRING.finditer(line)]


def _free(span, spans):
  return not any(a < span[1] and span[0] < b for a, b in spans)


def _subst_all(line, old, new):
  """Every variant of ``line`` with one occurrence of ``old`` (outside strings) replaced."""
  spans, out, start = _string_spans(line), [], 0
  while True:
    i = line.find(old, start)
    if i < 0:
      return out
    if _free((i, i + len(old)), spans):
      out.append(line[:i] + new + line[i + len(old):])
    start = i + 1


def _body_lines(source, func):
  """(first, last) 1-based line numbers of ``func``'s body, docstring excluded."""
  tree = ast.parse(source)
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == func:
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
          and isinstance(body[0].value.value, str):
        body = body[1:]
      return body[0].lineno, node.end_lineno, node
  raise KeyError(func)


def _local_names(fn):
  names = {a.arg for a in fn.args.args}
  for n in ast.walk(fn):
    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
      names.add(n.id)
  return sorted(names - {"_"})


def candidate_mutations(source: str, func: str) -> list[Mutation]:
  """All syntactically valid mutations of ``func`` in ``source``, deduplicated, in order."""
  first, last, fn = _body_lines(source, func)
  return mutations_in_lines(source, first, last, fn)


def mutations_in_lines(source: str, first: int, last: int, fn: ast.AST) -> list[Mutation]:
  """Every single-site mutation of lines ``first..last`` (1-based) of ``source``, the body of
  function node ``fn`` (any depth: methods, nested functions); deduplicated, parse-checked."""
  lines = source.split("\n")
  locals_ = _local_names(fn)
  out = []
  for ln in range(first, last + 1):
    line = lines[ln - 1]
    code = line.strip()
    if not code or code.startswith("#"):
      continue
    variants = []
    for a, b in _OPERATOR_SWAPS:
      variants += [("wrong_operator", v) for v in _subst_all(line, a, b)]
    for pat in (" + 1", " - 1"):
      variants += [("off_by_one", v) for v in _subst_all(line, pat, "")]
    variants += [("off_by_one", line[:m.start()] + f"range({m.group(1)} - 1)" + line[m.end():])
                 for m in _RANGE1.finditer(line) if _free(m.span(), _string_spans(line))]
    for m in _NUMBER.finditer(line):
      if not _free(m.span(), _string_spans(line)):
        continue
      tok = m.group(1)
      if "." in tok:
        new = "1.0" if float(tok) == 0 else repr(float(tok) * 2)
      else:
        v = int(tok)
        new = str(v + 1) if v < 10 else str(v // 10)
      variants.append(("wrong_constant", line[:m.start()] + new + line[m.end():]))
    for m in _CALL2.finditer(line):
      a, b = m.group(2).strip(), m.group(3).strip()
      if a != b and _free(m.span(), _string_spans(line)):
        variants.append(("swapped_arguments", line[:m.start(2)] + b + ", " + a + line[m.end(3):]))
    if code.startswith("return "):
      expr = code[len("return "):]
      indent = line[:len(line) - len(line.lstrip())]
      if expr in ("True", "False"):
        variants.append(("wrong_return", f"{indent}return {'False' if expr == 'True' else 'True'}"))
      elif re.fullmatch(r"[A-Za-z_]\w*", expr):
        variants += [("wrong_return", f"{indent}return {n}") for n in locals_ if n != expr][:2]
      elif expr.startswith("round(") and expr.endswith(", 2)"):
        variants.append(("wrong_return", f"{indent}return {expr[6:-4]}"))
    for family, new in variants:
      if new != line:
        out.append(Mutation(family, ln, line, new))
    # missing_edge_case: drop an `if ...:` guard whose body is one return/raise line.
    if code.startswith("if ") and code.endswith(":") and ln < last:
      nxt = lines[ln]
      if nxt.strip().startswith(("return", "raise")) and (ln + 1 >= len(lines) or not lines[ln + 1].strip().startswith(("else", "elif"))):
        out.append(Mutation("missing_edge_case", ln, line + "\n" + nxt, ""))
  seen, uniq = set(), []
  for m in out:
    key = (m.lineno, m.old, m.new)
    if key in seen:
      continue
    try:
      ast.parse(m.apply(source))
    except SyntaxError:
      continue
    seen.add(key)
    uniq.append(m)
  return uniq
