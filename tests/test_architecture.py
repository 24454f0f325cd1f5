"""The import graph of ``legorl_jax`` follows ``docs/architecture.md``.

The graph is read with ``ast`` (nothing is imported, so the test is fast and sees imports
inside functions too): an import from a package in a higher layer than the importer fails, and
so does any cycle, between modules or between packages. The layering itself is parsed from the
doc's table, so the doc stays the authority and cannot drift from what is enforced.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "legorl_jax"
DOC = ROOT / "docs" / "architecture.md"


def read_layers(doc: pathlib.Path = DOC) -> dict[str, int]:
  """{package: layer} from the doc's table rows ``| N | `a`, `b` | job |``."""
  layers = {}
  for line in doc.read_text().splitlines():
    m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
    if m:
      for name in re.findall(r"`([\w.]+)`", m.group(2)):
        layers[name] = int(m.group(1))
  return layers


def module_files(src_root: pathlib.Path, package: str = PACKAGE) -> dict[str, pathlib.Path]:
  """{dotted module name: file} for every .py file of ``package`` under ``src_root``."""
  out = {}
  for path in sorted((src_root / package).rglob("*.py")):
    parts = list(path.relative_to(src_root).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    out[".".join(parts)] = path
  return out


def imports_of(name: str, path: pathlib.Path, modules: dict) -> set[str]:
  """The package's own modules that ``name`` imports, anywhere in the file.

  ``from a.b import c`` names the module ``a.b.c`` when that is a module, else ``a.b``.
  """
  tree = ast.parse(path.read_text(), filename=str(path))
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name in modules)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([base] if base else []))
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
          out.add(sub)
        elif base in modules:
          out.add(base)
  out.discard(name)
  return out


def import_graph(src_root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
  modules = module_files(src_root, package)
  return {name: imports_of(name, path, modules) for name, path in modules.items()}


def package_of(module: str) -> str | None:
  """``legorl_jax.sandbox.local`` -> ``sandbox``; the root package itself -> None."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan, iterative)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
      v, children = work[-1]
      w = next(children, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w)
          on_stack.add(w)
          work.append((w, iter(sorted(graph.get(w, ())))))
        elif w in on_stack:
          low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        comp = []
        while True:
          w = stack.pop()
          on_stack.discard(w)
          comp.append(w)
          if w == v:
            break
        if len(comp) > 1:
          found.append(sorted(comp))
  return found


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
  bad = []
  for module, targets in sorted(graph.items()):
    src = package_of(module)
    for target in sorted(targets):
      dst = package_of(target)
      if src is None or dst is None or src == dst:
        continue
      if layers[dst] > layers[src]:
        bad.append(f"{module} (layer {layers[src]}) imports {target} (layer {layers[dst]})")
  return bad


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  out: dict[str, set[str]] = {}
  for module, targets in graph.items():
    src = package_of(module)
    if src is not None:
      out.setdefault(src, set()).update(
          d for d in map(package_of, targets) if d is not None and d != src)
  return out


@pytest.fixture(scope="module")
def graph():
  return import_graph()


def test_every_package_has_a_layer(graph):
  layers = read_layers()
  missing = sorted({package_of(m) for m in graph} - set(layers) - {None})
  assert not missing, f"add these to the table in docs/architecture.md: {missing}"


def test_no_import_goes_up_a_layer(graph):
  bad = upward_imports(graph, read_layers())
  assert not bad, "imports against docs/architecture.md:\n" + "\n".join(bad)


def test_no_circular_imports_between_modules(graph):
  assert not cycles(graph)


def test_no_circular_imports_between_packages(graph):
  """Sideways imports are allowed, but not both ways: each package must be buildable on its own."""
  assert not cycles(package_graph(graph))


def test_tasks_imports_only_errors_and_utils(graph):
  """The data model is read by sandboxes, rewards and rollout; its builders live in taskgen."""
  used = package_graph(graph).get("tasks", set())
  assert used <= {"errors", "utils"}, used


def test_the_checker_catches_an_upward_import_and_a_cycle(tmp_path):
  """The checks above pass vacuously if the parser saw no imports; a fake tree proves it sees them."""
  pkg = tmp_path / PACKAGE
  for rel, text in {
      "__init__.py": "",
      "errors.py": "",
      "low/__init__.py": "",
      "low/a.py": f"def f():\n  from {PACKAGE}.high import b\n",  # upward, inside a function
      "high/__init__.py": "",
      "high/b.py": "from ..low import a\nfrom . import c\n",
      "high/c.py": f"import {PACKAGE}.high.b\n",
  }.items():
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text(text)
  g = import_graph(tmp_path)
  assert g[f"{PACKAGE}.high.b"] == {f"{PACKAGE}.low.a", f"{PACKAGE}.high.c"}
  assert upward_imports(g, {"errors": 0, "low": 1, "high": 2}) == [
      f"{PACKAGE}.low.a (layer 1) imports {PACKAGE}.high.b (layer 2)"]
  assert sorted(map(tuple, cycles(g))) == [
      (f"{PACKAGE}.high.b", f"{PACKAGE}.high.c", f"{PACKAGE}.low.a")]
  assert cycles(package_graph(g)) == [["high", "low"]]


MAX_LINES = 500
SOURCE_DIRS = (PACKAGE, "experiments", "tests", "colab")


def long_files(root: pathlib.Path = ROOT, limit: int = MAX_LINES) -> list[str]:
  """``path: N lines`` for each Python file of ``SOURCE_DIRS`` past ``limit`` lines."""
  out = []
  for d in SOURCE_DIRS:
    for path in sorted((root / d).rglob("*.py")):
      n = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
      if n > limit:
        out.append(f"{path.relative_to(root)}: {n} lines")
  return out


def test_no_source_file_is_past_the_size_limit():
  """A module past ~500 lines is usually two jobs in one file: split it by job, as
  ``sampling/engine.py`` was split into engine, scheduler, device and buckets."""
  assert long_files() == [], f"split these modules by job: {long_files()}"


def test_the_size_check_sees_a_long_file(tmp_path):
  (tmp_path / PACKAGE).mkdir()
  (tmp_path / PACKAGE / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
  (tmp_path / PACKAGE / "ok.py").write_text("x = 1\n" * MAX_LINES)
  assert long_files(tmp_path) == [f"{PACKAGE}/big.py: {MAX_LINES + 1} lines"]
