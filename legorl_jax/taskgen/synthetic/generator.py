"""Synthetic bug-fix tasks: real small Python repositories with one injected bug.

A task = a template package (README, modules with docstrings, visible tests) with one
mutated function, an issue-style instruction describing the failing behaviour (not the
fix), hidden tests that fail before and pass after the gold patch, and the cheap pyrunner
verifier. Everything is checked by executing the examples at generation time.

Difficulty: ``hinted`` is ``easy`` plus the buggy line quoted in the instruction (the CPU
demo's level: a tiny policy can copy the line and learn which edit fixes it); ``easy`` ships only the buggy module, uses single-line bug families and names
the file, function, call, actual and expected result; ``medium`` adds a second module and
does not name the file; ``hard`` ships every module, also removes edge-case guards, and
words the instruction as a user report. Splits: a (template, function) pair belongs to
exactly one of train/validation, so the two share no template instance.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import signal
import threading
from typing import Callable

from legorl_jax.errors import TaskError
from legorl_jax.sandbox.diff import compute_diff
from legorl_jax.tasks.repo import files_to_archive
from legorl_jax.tasks.schema import Limits, RepoSource, Task, TaskMetadata, VerifierSpec
from legorl_jax.taskgen.synthetic import rename
from legorl_jax.taskgen.synthetic.mutations import FAMILIES, Mutation, candidate_mutations
from legorl_jax.taskgen.synthetic.template import Module, Template
from legorl_jax.taskgen.synthetic.templates_a import TEMPLATES_A
from legorl_jax.taskgen.synthetic.templates_b import TEMPLATES_B

TEMPLATES: tuple[Template, ...] = TEMPLATES_A + TEMPLATES_B
DIFFICULTIES = ("hinted", "easy", "medium", "hard")
SPLITS = ("train", "validation")
VALIDATION_PERCENT = 25
_EASY_FAMILIES = ("wrong_operator", "off_by_one", "wrong_constant", "swapped_arguments", "wrong_return")
_RAISES = "__raises__"


def split_of(template: str, function: str) -> str:
  """The split a (template, function) pair belongs to; stable across versions and seeds."""
  h = int(hashlib.sha256(f"{template}:{function}".encode()).hexdigest()[:8], 16)
  return "validation" if h % 100 < VALIDATION_PERCENT else "train"


class _Timeout(BaseException):
  pass


def _evaluate(source: str, calls: list[str], module_name: str) -> list[tuple[str, object]]:
  """Runs each call against ``source``: ("value", result) or ("raises", exception name)."""
  return list(_evaluate_cached(source, tuple(calls), module_name))


@functools.lru_cache(maxsize=4096)
def _evaluate_cached(source, calls, module_name):
  ns: dict = {"__name__": module_name}
  exec(compile(source, module_name, "exec"), ns)  # noqa: S102 - our own template code
  out = []
  use_alarm = threading.current_thread() is threading.main_thread()
  for call in calls:
    old = None
    if use_alarm:
      def on_alarm(*_):
        raise _Timeout()
      old = signal.signal(signal.SIGALRM, on_alarm)
      signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
      out.append(("value", eval(call, dict(ns))))  # noqa: S307 - our own example calls
    except _Timeout:
      out.append(("raises", "TimeoutError"))
    except Exception as e:  # noqa: BLE001 - a raising call is a legitimate outcome
      out.append(("raises", type(e).__name__))
    finally:
      if use_alarm:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
  return tuple(out)


def _same(a, b) -> bool:
  if a[0] != b[0]:
    return False
  x, y = a[1], b[1]
  if isinstance(x, float) or isinstance(y, float):
    return isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
  if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
    return type(x) is type(y) and len(x) == len(y) and all(_same(("value", p), ("value", q)) for p, q in zip(x, y))
  if isinstance(x, dict) and isinstance(y, dict):
    return x.keys() == y.keys() and all(_same(("value", x[k]), ("value", y[k])) for k in x)
  return type(x) is type(y) and x == y


def _describe(outcome) -> str:
  return f"raises {outcome[1]}" if outcome[0] == "raises" else f"returns `{outcome[1]!r}`"


# --- building one task ------------------------------------------------------------------------

_TEST_HELPERS = '''import math


def _same(a, b):
    """Equality that tolerates float rounding, recursively."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _raises(exc_name, fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__ == exc_name
    return False
'''


def _test_file(pkg: str, module: str, cases: list[tuple[str, str, object]]) -> str:
  """Source of a test module; ``cases`` are (test name, call, gold outcome)."""
  funcs = sorted({call.split("(")[0] for _, call, _ in cases})
  lines = [f'"""Tests for {pkg}.{module}."""\n', _TEST_HELPERS.rstrip() + "\n",
           f"from {pkg}.{module} import {', '.join(funcs)}\n"]
  for name, call, outcome in cases:
    if outcome[0] == "raises":
      body = f"    assert _raises({outcome[1]!r}, lambda: {call})"
    else:
      body = f"    assert _same({call}, {outcome[1]!r})"
    lines.append(f"\ndef {name}():\n{body}\n")
  return "\n".join(lines)


def _readme(t: Template, modules: list[Module]) -> str:
  mods = "\n".join(f"- `{t.package}/{m.name}.py`: {m.doc} Functions: "
                   + ", ".join(f"`{f}`" for f in m.functions()) + "." for m in modules)
  return (f"# {t.title}\n\n{t.summary}\n\n## Modules\n\n{mods}\n\n## Tests\n\n"
          f"Plain test functions live in `tests/`; run them with `python -m pytest tests`.\n")


def _instruction(difficulty, t, module, func, call, actual, expected, bug_line=None) -> str:
  if difficulty == "hinted":
    return (f"The function `{func}` in `{t.package}/{module}.py` is wrong.\n"
            f"`{call}` {actual} but it should return `{expected[1]!r}`.\n"
            f"The bug is in this line:\n{bug_line}")
  if difficulty == "easy":
    return (f"The function `{func}` in `{t.package}/{module}.py` is wrong.\n"
            f"`{call}` {actual} but it should return `{expected[1]!r}`.\n"
            f"Fix `{func}` in `{t.package}/{module}.py`.")
  if difficulty == "medium":
    return (f"`{func}` in the `{t.package}` package gives a wrong result: `{call}` {actual}, "
            f"expected `{expected[1]!r}`. Please fix it without changing the tests.")
  return (f"Bug report for {t.title.lower()} ({t.package}): when I call `{call}` it {actual}, "
          f"but according to the docs I expected `{expected[1]!r}`. Other inputs may be affected too.")


def _build(t: Template, module: Module, func: str, mut: Mutation, difficulty: str, split: str,
           variant_index: int = 0) -> Task | None:
  gold_src = module.full_source()
  bug_src = mut.apply(gold_src)
  mod_name = f"{t.package}.{module.name}"
  calls = [(f, c) for f in module.functions() for c in module.examples.get(f, [])]
  gold = _evaluate(gold_src, [c for _, c in calls], mod_name)
  bug = _evaluate(bug_src, [c for _, c in calls], mod_name)
  failing = [i for i, (g, b) in enumerate(zip(gold, bug)) if not _same(g, b)]
  if not failing or any(g[0] == "raises" and g[1] == "TimeoutError" for g in gold):
    return None
  if difficulty in ("hinted", "easy") and (mut.new == "" or bug_src.count(mut.new) != 1):
    return None  # easy fixes must be one unambiguous exact-string edit
  # Prefer a failing example of the mutated function itself for the instruction.
  first = next((i for i in failing if calls[i][0] == func), failing[0])
  shipped = [module] if difficulty in ("hinted", "easy") else list(t.modules[:2]) if difficulty == "medium" else list(t.modules)
  if module not in shipped:
    shipped = [module] + shipped[:-1]
  files, hidden, f2p, p2p = {}, {}, [], []
  files["README.md"] = _readme(t, shipped)
  files[f"{t.package}/__init__.py"] = (f'"""{t.title}: {t.summary}"""\n\n'
                                       + "".join(f"from {t.package} import {m.name}\n" for m in shipped))
  for m in shipped:
    files[f"{t.package}/{m.name}.py"] = bug_src if m is module else m.full_source()
  # Visible tests: one passing example per function of the other shipped modules, and of
  # unaffected functions of the buggy module (P2P); hidden tests: every example of the
  # buggy module (F2P where the bug shows, P2P elsewhere).
  for m in shipped:
    m_calls = [(f, c) for f in m.functions() for c in m.examples.get(f, [])[:1]]
    m_src = bug_src if m is module else m.full_source()
    outcomes = _evaluate(m_src, [c for _, c in m_calls], f"{t.package}.{m.name}")
    cases, k = [], 0
    gold_m = _evaluate(m.full_source(), [c for _, c in m_calls], f"{t.package}.{m.name}")
    for (f, c), o, g in zip(m_calls, outcomes, gold_m):
      if m is module and f == func or not _same(o, g):
        continue
      k += 1
      cases.append((f"test_{f}", c, g))
    if cases:
      path = f"tests/test_{m.name}.py"
      files[path] = _test_file(t.package, m.name, cases)
      p2p += [f"{path}::{name}" for name, _, _ in cases]
  hidden_path = f"tests/test_{module.name}_hidden.py"
  cases, counts = [], {}
  for i, ((f, c), g) in enumerate(zip(calls, gold)):
    counts[f] = counts.get(f, 0) + 1
    name = f"test_{f}_{counts[f]}"
    cases.append((name, c, g))
    (f2p if i in failing else p2p).append(f"{hidden_path}::{name}")
  hidden[hidden_path] = _test_file(t.package, module.name, cases)
  rel = f"{t.package}/{module.name}.py"
  gold_patch = compute_diff({rel: bug_src.encode()}, {rel: gold_src.encode()}).patch
  test_files = sorted(p for p in files if p.startswith("tests/")) + [hidden_path]
  key_text = f"{t.name}|{func}|{mut.lineno}|{mut.old}|{mut.new}|{difficulty}"
  if variant_index:
    key_text += f"|{variant_index}|{t.package}|{module.name}"
  key = hashlib.sha256(key_text.encode()).hexdigest()[:10]
  return Task(
      id=f"synth/{difficulty}/{t.name}/{func}/{mut.family}/{key}",
      repo=RepoSource(kind="archive", data=files_to_archive(files)),
      instruction=_instruction(difficulty, t, module.name, func, calls[first][1], _describe(bug[first]),
                               gold[first], bug_line=mut.new),
      verifier=VerifierSpec(kind="pyrunner", test_files=tuple(test_files), timeout_s=30.0),
      hidden_tests=hidden, gold_patch=gold_patch, fail_to_pass=tuple(f2p), pass_to_pass=tuple(p2p),
      limits=Limits(timeout_s=600.0, memory_mb=1024, pids=128, cpus=1.0),
      metadata=TaskMetadata(language="python", difficulty=difficulty, source="synthetic",
                            extra={"template": t.name, "module": module.name, "function": func,
                                   "family": mut.family, "split": split, "bug_line": mut.lineno,
                                   "bug_old": mut.old, "bug_new": mut.new, "variant": variant_index}))


def generate_task_pool(difficulty: str = "easy", split: str = "train", variants: int = 1,
                       first_variant: int = 0) -> list[Task]:
  """Every valid task of one difficulty and split, in a fixed order.

  ``variants`` > 1 adds renamed copies of each (template, function): the same logic under new
  package, module and variable names (``rename.variant``); variant 0 is the original. Variants
  ``first_variant .. first_variant + variants - 1`` are made, so a second call with a higher
  ``first_variant`` gives repositories whose names the first call's tasks never used.
  """
  if difficulty not in DIFFICULTIES:
    raise TaskError(f"unknown difficulty {difficulty!r}; choose one of {DIFFICULTIES}")
  if split not in SPLITS:
    raise TaskError(f"unknown split {split!r}; choose one of {SPLITS}")
  if int(variants) < 1 or int(first_variant) < 0:
    raise TaskError(f"variants must be >= 1 (1 = original names only) and first_variant >= 0, "
                    f"got variants={variants}, first_variant={first_variant}")
  families = _EASY_FAMILIES if difficulty in ("hinted", "easy") else FAMILIES
  pool = []
  for t in TEMPLATES:
    for m in t.modules:
      for func in m.functions():
        if split_of(t.name, func) != split:
          continue
        for index in range(int(first_variant), int(first_variant) + int(variants)):
          renamed = _same_behaviour_variant(t, m, func, index)
          if renamed is None:
            continue
          tv, mv = renamed
          for mut in candidate_mutations(mv.full_source(), func):
            if mut.family in families:
              task = _build(tv, mv, func, mut, difficulty, split, variant_index=index)
              if task is not None:
                pool.append(task)
  return pool


def _same_behaviour_variant(t: Template, m: Module, func: str, index: int):
  """``rename.variant`` when every example of the module gives the same result renamed."""
  out = rename.variant(t, m, func, index)
  if out is None or index == 0:
    return out
  calls = [c for f in m.functions() for c in m.examples.get(f, [])]
  before = _evaluate(m.full_source(), calls, f"{t.package}.{m.name}")
  after = _evaluate(out[1].full_source(), calls, f"{out[0].package}.{out[1].name}")
  return out if all(_same(a, b) for a, b in zip(before, after)) else None


def bug_key(task: Task) -> str:
  """The bug a synthetic task injects, the same under every renamed variant: template,
  function, bug family and line."""
  x = task.metadata.extra
  return f"{x['template']}:{x['function']}:{x['family']}:{x['bug_line']}"


def family_of_bug_key(key: str | None) -> str | None:
  """The bug family of a ``bug_key`` (``template:function:family:line``); None for any other
  key (a task outside the synthetic bugs, or none)."""
  parts = (key or "").split(":")
  return parts[2] if len(parts) == 4 else None


def generate_tasks(n: int, *, seed: int = 0, difficulty: str = "easy", split: str = "train",
                   variants: int = 1, first_variant: int = 0,
                   keep: Callable[[Task], bool] | None = None, subset: str = "") -> list[Task]:
  """``n`` distinct tasks, deterministic in (seed, difficulty, split), families balanced.

  Tasks are drawn family by family in a seeded round robin, so rarer bug families are not
  swamped by frequent ones. ``keep`` restricts the pool first (``subset`` names it in the
  error). Raises TaskError when the pool has fewer than ``n`` tasks.
  """
  pool = generate_task_pool(difficulty, split, variants, first_variant)
  if keep is not None:
    pool = [t for t in pool if keep(t)]
  if n > len(pool):
    raise TaskError(f"only {len(pool)} distinct {difficulty}/{split}{subset} synthetic tasks "
                    f"exist with variants={variants}; asked for {n} (raise variants or ask for "
                    "fewer)")
  rng = random.Random(f"{seed}:{difficulty}:{split}")
  by_family: dict[str, list[Task]] = {}
  for task in pool:
    by_family.setdefault(task.metadata.extra["family"], []).append(task)
  for tasks in by_family.values():
    rng.shuffle(tasks)
  order = sorted(by_family)
  out = []
  while len(out) < n:
    rng.shuffle(order)
    for fam in order:
      if by_family[fam] and len(out) < n:
        out.append(by_family[fam].pop())
  return out
