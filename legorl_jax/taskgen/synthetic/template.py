"""Template data types for synthetic repositories."""

from __future__ import annotations

import ast
import dataclasses
import functools


@dataclasses.dataclass(frozen=True)
class Module:
  """One module of a template package: its correct source and example calls per function."""
  name: str
  doc: str
  source: str
  examples: dict[str, list[str]]

  def full_source(self) -> str:
    return f'"""{self.doc}"""\n\n' + self.source.strip() + "\n"

  def functions(self) -> list[str]:
    return list(_function_names(self.full_source()))


@dataclasses.dataclass(frozen=True)
class Template:
  """A small package (2+ modules) that a synthetic repository is made from."""
  name: str
  package: str
  title: str
  summary: str
  modules: tuple[Module, ...]

  def module(self, name: str) -> Module:
    for m in self.modules:
      if m.name == name:
        return m
    raise KeyError(name)


@functools.lru_cache(maxsize=256)
def _function_names(source: str) -> tuple[str, ...]:
  return tuple(n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))
