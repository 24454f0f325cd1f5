"""BENCHMARKS.md stays readable as figures are added: the current-figures table comes first,
each of its cells holds one figure and its condition (at most 200 characters) and each row names
its command; outside tables no line is over 100 characters."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "BENCHMARKS.md"
MAX_CELL = 200
MAX_LINE = 100
CURRENT = "## Current figures"


def _lines() -> list[str]:
  return DOC.read_text(encoding="utf-8").split("\n")


def _cells(row: str) -> list[str]:
  """A table row's cells (a pipe escaped as ``\\|`` stays inside its cell)."""
  return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _current_table() -> tuple[list[str], list[list[str]]]:
  lines = _lines()
  start = lines.index(CURRENT)
  end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
  rows = [line for line in lines[start:end] if line.startswith("|")]
  assert len(rows) > 2, "the current-figures table is missing"
  return _cells(rows[0]), [_cells(r) for r in rows[2:]]


def test_current_figures_come_first():
  headings = [line for line in _lines() if line.startswith("## ")]
  assert headings[0] == CURRENT
  assert "# History" in _lines()


def test_current_figures_cells_are_short():
  header, rows = _current_table()
  long = [(row[0][:60], cell[:60], len(cell)) for row in rows for cell in row
          if len(cell) > MAX_CELL]
  assert not long, f"cells over {MAX_CELL} characters (row, cell, length): {long}"
  assert all(len(row) == len(header) for row in rows), "a row with a wrong number of cells"


def test_each_current_figure_names_its_command():
  header, rows = _current_table()
  col = header.index("command")
  missing = [row[0] for row in rows if not re.search(r"`[^`]*(python|pytest)[^`]*`", row[col])]
  assert not missing, f"rows without a command: {missing}"


def test_no_long_line_outside_tables():
  long = [(n, len(line)) for n, line in enumerate(_lines(), 1)
          if len(line) > MAX_LINE and not line.lstrip().startswith("|")]
  assert not long, f"lines over {MAX_LINE} characters outside tables (line, length): {long}"
