"""Every benchmark script imports, and its flags parse: with their defaults, and as every command
that BENCHMARKS.md, README.md, docs/ and the scripts' own docstrings quote gives them. Nothing is
run: a broken import, a duplicate or misspelt flag, or a quoted command that no longer parses
fails here instead of in a long measurement.

absl flags are process-wide, the scripts define the same names (``--preset``, ``--steps``, ...)
and other tests' modules define some too, so one child process imports the scripts one at a time,
parses, and removes each script's flags before the next.
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "experiments" / "benchmarks"
DOCS = [REPO / "BENCHMARKS.md", REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
COMMAND = re.compile(r"python3? (?:-m experiments\.benchmarks\.(\w+)|(?:\./)?experiments/benchmarks/"
                     r"(\w+)\.py)([^`\n]*)")


def scripts() -> list[str]:
  """Module names of the benchmark scripts (absl programs; helpers such as ``common`` are not)."""
  return sorted(p.stem for p in BENCH.glob("*.py")
                if re.search(r"^if __name__ == .__main__.:\n  app\.run\(main\)", p.read_text(), re.M))


def retired() -> set[str]:
  """Scripts listed under BENCHMARKS.md's "Retired scripts" (their commands stay in history)."""
  text = (REPO / "BENCHMARKS.md").read_text()
  section = text[text.index("## Retired scripts"):]
  return set(re.findall(r"^\| `(\w+)\.py` \|", section, re.M))


def quoted_commands() -> dict[str, list[tuple[str, list[str]]]]:
  """{script: [(where, argv without the program)]} for every quoted benchmark command."""
  out: dict[str, list] = {}
  sources = DOCS + sorted(BENCH.glob("*.py"))
  for path in sources:
    if not path.exists():
      continue
    text = path.read_text().replace("\\\n", " ")  # shell line continuations
    for m in COMMAND.finditer(text):
      name = m.group(1) or m.group(2)
      args = re.split(r"\s#|;|&&", m.group(3))[0]
      args = args.replace("[", " ").replace("]", " ")  # optional arguments, as in [--cache_first]
      where = f"{path.relative_to(REPO)}: {m.group(0).strip()[:120]}"
      try:
        argv = shlex.split(args)
      except ValueError as e:
        argv = [f"<unparsable: {e}>"]
      out.setdefault(name, []).append((where, argv))
  return out


# Runs in the child: imports each script, parses its argv lists, removes its flags.
_CHILD = r"""
import importlib, json, sys
from absl import flags
FLAGS = flags.FLAGS
job = json.load(sys.stdin)
report = {}
for name in job["modules"]:
  res = report[name] = {"flags": 0, "errors": [], "parsed": 0}
  modname = "experiments.benchmarks." + name
  try:
    importlib.import_module(modname)
  except Exception as e:  # noqa: BLE001 -- reported per script
    res["errors"].append(f"import failed: {type(e).__name__}: {e}")
    continue
  own = list(FLAGS.flags_by_module_dict().get(modname, []))  # a copy: delattr edits it
  res["flags"] = len(own)
  res["errors"] += [f"--{f.name} has no help text" for f in own if not (f.help or "").strip()]
  required = [f.name for f in own
              if any("other than None" in getattr(v, "message", "") for v in f.validators)]
  runs = [("defaults", [f"--{n}=x" for n in required])] + job["commands"].get(name, [])
  for where, argv in runs:
    FLAGS.unparse_flags()
    try:
      rest = FLAGS(["prog", *argv])
      if rest != ["prog"]:
        raise ValueError(f"positional arguments {rest[1:]}")
      res["parsed"] += 1
    except Exception as e:  # noqa: BLE001 -- reported per command
      res["errors"].append(f"{where}: {type(e).__name__}: {e}")
  FLAGS.unparse_flags()
  for f in own:
    delattr(FLAGS, f.name)
  sys.modules.pop(modname, None)
json.dump(report, sys.stdout)
"""


@pytest.fixture(scope="module")
def report():
  commands = quoted_commands()
  job = {"modules": scripts(),
         "commands": {k: [list(c) for c in v] for k, v in commands.items()}}
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(job), text=True,
                        capture_output=True, cwd=REPO, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_there_are_scripts_and_quoted_commands():
  assert len(scripts()) >= 15
  assert sum(len(v) for v in quoted_commands().values()) >= 40


@pytest.mark.parametrize("name", scripts())
def test_script_imports_and_its_flags_parse(report, name):
  res = report[name]
  assert not res["errors"], "\n".join(res["errors"])
  assert res["flags"] > 0, f"{name} defines no flags of its own"


def test_every_quoted_command_names_a_script():
  present, gone = set(scripts()), retired()
  assert not present & gone, f"retired but still present: {present & gone}"
  unknown = {k: v[0][0] for k, v in quoted_commands().items() if k not in present | gone}
  assert not unknown, f"commands for scripts that do not exist: {unknown}"
  for name in gone:
    assert not (BENCH / f"{name}.py").exists()
