"""Word lists and the seeded text generator behind the bundled tokenizer's corpus.

``Gen(seed)`` writes Python modules, tests, diffs, shell sessions (ls, cat -n, git, pytest,
tracebacks) and agent conversations (tool definitions, <tool_call> JSON calls, tool replies)
from the tables below, so the tokenizer sees the text a coding agent reads and writes without
any downloaded corpus. ``experiments/make_tokenizer.py`` renders the conversations through the
package's chat template and trains on the result; the same seed gives the same text.
"""

import difflib
import json
import random

from legorl_jax.models import chat_template as ct

NOUNS = """item value key name path file line node edge graph tree list queue stack cache buffer
record row column table user account order price total count index offset size length width
height score token batch step epoch config option flag setting request response header body
payload message event task job worker result error status state model layer weight grad loss
metric logger parser reader writer client server session socket port host url query filter
matrix vector point shape color image pixel frame window timer clock date time day month year
interval range bound limit threshold rate ratio mean sample seed number digit string text word
char prefix suffix pattern template format schema field attribute method handler callback hook
plugin module package version release commit branch tag repo diff patch test fixture report
summary inventory product customer invoice payment cart discount tax address email student
grade course book author title page chapter movie rating review comment post channel room
player game board card deck move turn round team temperature sensor reading device signal
packet route vertex distance cost budget balance transaction ledger entry segment chunk block
slot bucket heap pair element child parent root leaf level depth width counter total amount
quantity unit label category tags note directory folder archive snapshot checkpoint dataset
feature target prediction probability logit mask attention head embedding kernel shard mesh
device array tensor dtype axis dimension span cursor window stream pipe process thread lock
""".split()
VERBS = """get set add remove update create delete load save read write parse format render
compute calculate validate check find search sort filter merge split join count sum normalize
convert encode decode build make run execute process handle apply reset clear fetch send
receive open close start stop register resolve flatten group pad trim strip clamp scale rotate
shift insert append pop push peek lookup match replace escape serialize compare copy clone
init configure collect emit dispatch schedule retry cancel wait notify track log dump extract
transform aggregate evaluate predict train rank select pick generate shuffle partition reverse
dedupe hash verify compress download upload sync export iterate accumulate measure summarize
""".split()
ADJS = """new old max min first last next prev current default valid empty full active pending
done raw clean sorted unique visible hidden public private local remote global temp final base
main input output left right top bottom inner outer upper lower short long small large fast
slow safe strict lazy dirty stale fresh cached parsed nested flat average weighted partial
missing extra duplicate negative positive total initial running previous expected actual
""".split()
TYPES = ["int", "str", "float", "bool", "list[int]", "list[str]", "dict[str, int]",
         "dict[str, Any]", "tuple[int, int]", "Optional[str]", "Sequence[float]", "bytes",
         "pathlib.Path", "np.ndarray", "jax.Array", "Callable[[int], int]", "Iterable[str]"]
EXCEPTIONS = ["ValueError", "KeyError", "TypeError", "IndexError", "RuntimeError",
              "FileNotFoundError", "ZeroDivisionError", "AttributeError", "AssertionError"]
MODULES = ["os", "re", "sys", "json", "math", "time", "random", "logging", "pathlib",
           "itertools", "functools", "collections", "dataclasses", "typing", "subprocess",
           "shutil", "argparse", "datetime", "statistics", "heapq", "bisect", "csv", "hashlib"]
JAX_LINES = [
    "logits = jnp.einsum('btd,dv->btv', hidden, embedding)",
    "logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)",
    "probs = jax.nn.softmax(scores, axis=-1)",
    "mask = jnp.arange(seq_len)[None, :] < lengths[:, None]",
    "loss = -(logp * mask).sum() / jnp.maximum(mask.sum(), 1)",
    "params = jax.tree.map(lambda p, g: p - lr * g, params, grads)",
    "x = jnp.where(mask, x, jnp.finfo(x.dtype).min)",
    "key, subkey = jax.random.split(key)",
    "out = jax.lax.scan(body, carry, xs)",
    "ratio = jnp.exp(new_logp - old_logp)",
    "clipped = jnp.clip(ratio, 1.0 - eps, 1.0 + eps)",
    "advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)",
    "q = q.reshape(batch, seq_len, num_heads, head_dim)",
    "y = np.asarray(x, dtype=np.float32)",
    "np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)",
    "grads = jax.grad(loss_fn)(params, batch)",
    "state = state.replace(step=state.step + 1)",
]
PROSE = [
    "Return the {adj} {noun} of the given {noun2}s.",
    "Compute the {noun} for each {noun2} and return them in order.",
    "Raise {exc} if the {noun} is {adj}.",
    "The {noun} must not be empty; an empty {noun2} raises {exc}.",
    "Helper used by `{func}` to {verb} the {noun}.",
    "Fix the bug where `{func}` returns the wrong {noun} when the {noun2} is {adj}.",
    "`{func}` should {verb} every {noun} in the {noun2}, but it skips the last one.",
    "Calling `{func}` with a {adj} {noun} raises {exc} instead of returning an empty {noun2}.",
    "Let me look at the repository structure first.",
    "I'll run the tests to see which ones fail.",
    "The failing test expects `{func}` to {verb} the {noun} before returning it.",
    "The loop stops one element early, so the last {noun} is never counted.",
    "Now I understand the problem: the {noun} is compared with `<` instead of `<=`.",
    "Let me read `{path}` to understand how the {noun} is computed.",
    "All tests pass now. The fix changes `{func}` so that it handles a {adj} {noun}.",
    "I changed the condition in `{func}` and added a check for the {adj} {noun}.",
    "Let me search for where `{func}` is used.",
    "That edit did not apply because the old string was not found; I'll view the file again.",
    "The {noun} is stored in a dict keyed by {noun2}, so lookups are O(1).",
    "Note: this function is not thread-safe; callers must hold the {noun} lock.",
]
BUILTINS = ["len", "sum", "max", "min", "sorted", "abs", "int", "str", "list", "set", "tuple"]
METHODS = ["get(key, default)", "items()", "keys()", "strip()", "split(',')", "lower()",
           "startswith('#')", "copy()", "values()", "pop()", "replace(' ', '_')", "count(x)",
           "index(value)", "endswith('.py')", "format(name)", "setdefault(key, [])"]
SWAPS = [("<", "<="), ("+ 1", ""), ("==", "!="), (" - ", " + "), ("[0]", "[-1]"),
         ("return ", "return not "), ("max(", "min("), ("is None", "is not None")]
UNICODE_SNIPPETS = ["naïve café — déjà vu", "∑ xᵢ ≤ ε · n", "✓ passed ✗ failed", "→ ← ↑ ↓",
                    "温度 = 25℃", "Grüße aus Köln", "´ñ`", "Ωμέγα λάμδα", "emoji 🚀 🐍 ✨"]


class Gen:
  """Deterministic generator of code, shell output and transcripts (one random.Random)."""

  def __init__(self, seed: int):
    self.r = random.Random(seed)
    self.tab = "    "

  def pick(self, xs):
    return xs[self.r.randrange(len(xs))]

  def chance(self, p):
    return self.r.random() < p

  def ident(self, parts=2):
    words = [self.pick(ADJS)] if self.chance(0.3) else []
    words += [self.pick(NOUNS) for _ in range(max(1, parts - len(words)))]
    return "_".join(words)

  def func_name(self):
    return f"{self.pick(VERBS)}_{self.ident(self.r.randint(1, 2))}"

  def class_name(self):
    return self.pick(ADJS + NOUNS).capitalize() + self.pick(NOUNS).capitalize()

  def path(self):
    pkg = self.pick(["src/app", "lib", "pkg", "core", "utils", "app/services", "toolkit"])
    return f"{pkg}/{self.pick(NOUNS)}{self.pick(['', 's', '_utils', '_io'])}.py"

  def sentence(self):
    return self.pick(PROSE).format(
        adj=self.pick(ADJS), noun=self.pick(NOUNS), noun2=self.pick(NOUNS),
        exc=self.pick(EXCEPTIONS), func=self.func_name(), verb=self.pick(VERBS),
        path=self.path())

  def hexid(self, n=7):
    return "".join(self.pick("0123456789abcdef") for _ in range(n))

  # -- Python ---------------------------------------------------------------------------------

  def expr(self, names, depth=0):
    r, n = self.r.random(), self.pick(names)
    if depth > 1 or r < 0.25:
      return self.pick([n, n, str(self.r.randint(0, 100)), f"{self.r.random():.2f}",
                        f'"{self.pick(NOUNS)}"', "None", "True", f"len({n})"])
    if r < 0.45:
      op = self.pick(["+", "-", "*", "//", "%", "/", "**"])
      return f"{self.expr(names, depth + 1)} {op} {self.expr(names, depth + 1)}"
    if r < 0.6:
      return f"{self.pick(BUILTINS)}({n})"
    if r < 0.75:
      return f"{n}.{self.pick(METHODS)}"
    if r < 0.85:
      return f"[{self.pick(['x', 'x.strip()', 'str(x)'])} for x in {n} if x is not None]"
    if r < 0.92:
      return f"{n}[{self.pick(['0', '-1', 'i', 'i + 1', ':n', '1:', 'key'])}]"
    return f'f"{{{n}}} {self.pick(NOUNS)}s"'

  def cond(self, names):
    a, b = self.pick(names), self.expr(names, 1)
    return self.pick([f"{a} {self.pick(['<', '<=', '>', '>=', '==', '!='])} {b}",
                      f"not {a}", f"{a} is None", f"{a} in {self.pick(names)}",
                      f"isinstance({a}, {self.pick(['int', 'str', 'dict', 'list'])})",
                      f"len({a}) > {self.r.randint(0, 9)}"])

  def statement(self, names, ind, depth):
    """Lines of one statement; may define a new name (appended to `names`)."""
    r, inner = self.r.random(), ind + self.tab
    if depth < 2 and r < 0.15:
      lines = [f"{ind}if {self.cond(names)}:"] + self.block(names, inner, depth + 1)
      if self.chance(0.4):
        lines += [f"{ind}else:"] + self.block(names, inner, depth + 1)
      return lines
    if depth < 2 and r < 0.27:
      seq = self.pick(names)
      var, it = self.pick([("i", f"range(len({seq}))"), ("item", seq), ("row", seq),
                           ("i, item", f"enumerate({seq})"), ("key, value", f"{seq}.items()")])
      return [f"{ind}for {var} in {it}:"] + self.block(names + var.split(", "), inner, depth + 1)
    if depth < 2 and r < 0.32:
      return ([f"{ind}try:"] + self.block(names, inner, depth + 1, 1) +
              [f"{ind}except {self.pick(EXCEPTIONS)} as e:",
               f'{inner}raise {self.pick(EXCEPTIONS)}(f"cannot {self.pick(VERBS)}: {{e}}") from e'])
    if r < 0.37:
      what = f"{self.pick(ADJS)} {self.pick(NOUNS)}"
      return [f'{ind}raise {self.pick(EXCEPTIONS)}(f"{what}: {{{self.pick(names)}!r}}")']
    if r < 0.42:
      return [ind + self.pick(JAX_LINES)]
    if r < 0.47:
      return [f"{ind}# {self.sentence()}"]
    if r < 0.55:
      return [f"{ind}{self.pick(names)}.append({self.expr(names)})"]
    if r < 0.6:
      level = self.pick(["info", "debug", "warning"])
      return [f'{ind}logger.{level}("%s {self.pick(VERBS)}ed", {self.pick(names)})']
    var = self.ident(self.r.randint(1, 2))
    line = f"{ind}{var} = {self.expr(names)}"
    names.append(var)
    return [line]

  def block(self, names, ind, depth=0, n=None):
    names, lines = list(names), []
    for _ in range(n or self.r.randint(1, 4)):
      lines += self.statement(names, ind, depth)
    return lines

  def function(self, ind="", method=False):
    params = list(dict.fromkeys(self.ident(1) for _ in range(self.r.randint(0, 3))))
    sig = ["self"] if method else []
    for p in params:
      hint = f": {self.pick(TYPES)}" if self.chance(0.5) else ""
      default = f" = {self.pick(['None', '0', '1', 'True', repr(self.pick(NOUNS))])}"
      sig.append(p + hint + (default if self.chance(0.2) else ""))
    ret = f" -> {self.pick(TYPES)}" if self.chance(0.5) else ""
    body = ind + self.tab
    doc = self.sentence()
    if params and self.chance(0.4):
      doc += f"\n\n{body}Args:\n" + "\n".join(
          f"{body}  {p}: the {self.pick(ADJS)} {self.pick(NOUNS)}." for p in params)
      doc += f"\n\n{body}Returns:\n{body}  The {self.pick(NOUNS)}.\n{body}"
    names = (params or ["items"]) + (["self"] if method else [])
    out = [f"{ind}def {self.func_name()}({', '.join(sig)}){ret}:", f'{body}"""{doc}"""']
    out += self.block(names, body)
    out.append(f"{body}return {self.expr(names)}")
    return "\n".join(out)

  def klass(self):
    base = self.pick(["", "", "(Exception)", f"(Base{self.pick(NOUNS).capitalize()})"])
    out = ["@dataclasses.dataclass"] if self.chance(0.3) else []
    out += [f"class {self.class_name()}{base}:", f'{self.tab}"""{self.sentence()}"""', ""]
    attrs = list(dict.fromkeys(self.ident(1) for _ in range(self.r.randint(1, 4))))
    out.append(f"{self.tab}def __init__(self, {', '.join(attrs)}):")
    out += [f"{self.tab * 2}self.{a} = {a}" for a in attrs]
    for _ in range(self.r.randint(1, 3)):
      out += [""] + ([f"{self.tab}@property"] if self.chance(0.2) else [])
      out.append(self.function(self.tab, method=True))
    return "\n".join(out)

  def module(self):
    self.tab = self.pick(["    ", "    ", "  "])
    out = [f'"""{self.sentence()}"""', ""]
    out += sorted(f"import {m}" for m in self.r.sample(MODULES, self.r.randint(1, 5)))
    if self.chance(0.3):
      out += ["", "import jax", "import jax.numpy as jnp", "import numpy as np"]
    if self.chance(0.4):
      out.append("from typing import Any, Callable, Iterable, Optional, Sequence")
    out += ["", "logger = logging.getLogger(__name__)",
            f"{self.ident(2).upper()} = {self.r.randint(1, 4096)}", ""]
    for _ in range(self.r.randint(1, 4)):
      out += ["", self.klass() if self.chance(0.3) else self.function(), ""]
    if self.chance(0.2):
      out += ["", 'if __name__ == "__main__":', f"{self.tab}main()"]
    return "\n".join(out).rstrip() + "\n"

  def test_module(self, mod_path):
    self.tab = self.pick(["    ", "  "])
    funcs = [self.func_name() for _ in range(self.r.randint(1, 3))]
    out = ["import pytest", "", f"from {mod_path[:-3].replace('/', '.')} import {', '.join(funcs)}"]
    for f in funcs:
      a, b = self.r.randint(-5, 50), self.r.randint(-5, 50)
      if self.chance(0.4):
        cases = f"[({a}, {b}), ({b}, {a + b}), ([], 0)]"
        out += ["", f'@pytest.mark.parametrize("{self.ident(1)}, expected", {cases})']
      out += ["", f"def test_{f}_{self.pick(ADJS)}():", f"{self.tab}assert {f}({a}) == {b}"]
      if self.chance(0.5):
        out += [f"{self.tab}with pytest.raises({self.pick(EXCEPTIONS)}):",
                f"{self.tab * 2}{f}(None)"]
    return "\n".join(out) + "\n"

  def mutate(self, src):
    """`src` with one to three small edits (the kind a bug fix makes)."""
    lines = src.split("\n")
    for _ in range(self.r.randint(1, 3)):
      i = self.r.randrange(len(lines))
      a, b = self.pick(SWAPS)
      lines[i] = lines[i].replace(a, b, 1) if a in lines[i] else f"{lines[i]}  # {self.pick(VERBS)}"
    return "\n".join(lines)

  def diff(self):
    path, src = self.path(), self.module()
    body = "".join(difflib.unified_diff(src.splitlines(True), self.mutate(src).splitlines(True),
                                        f"a/{path}", f"b/{path}"))
    return f"diff --git a/{path} b/{path}\nindex {self.hexid()}..{self.hexid()} 100644\n{body}"

  # -- Shell ----------------------------------------------------------------------------------

  def ls(self, long=False):
    exts = [".py", ".txt", ".json", ".md", "", ".cfg", ".toml"]
    names = sorted({self.pick(NOUNS) + self.pick(exts) for _ in range(self.r.randint(2, 12))})
    if not long:
      return "  ".join(names) + "\n"
    out = [f"total {self.r.randint(8, 200)}"]
    for n in [".", ".."] + names:
      mode = "drwxr-xr-x" if "." not in n or n in (".", "..") else "-rw-r--r--"
      when = (f"{self.pick(['Jan', 'Mar', 'Jun', 'Oct'])} {self.r.randint(1, 28):2d} "
              f"{self.r.randint(0, 23):02d}:{self.r.randint(0, 59):02d}")
      out.append(f"{mode} {self.r.randint(1, 9):2d} agent agent {self.r.randint(40, 40000):6d} "
                 f"{when} {n}")
    return "\n".join(out) + "\n"

  def cat_n(self, src):
    return "".join(f"{i:6d}\t{line}\n" for i, line in enumerate(src.splitlines(), 1))

  def traceback(self, path):
    frames = [("<module>", f"{self.func_name()}()")] + [
        (self.func_name(), f"return {self.func_name()}({self.ident(1)})")
        for _ in range(self.r.randint(1, 3))]
    out = ["Traceback (most recent call last):"]
    for fn, code in frames:
      where = self.pick([path, self.path()])
      out += [f'  File "/repo/{where}", line {self.r.randint(1, 300)}, in {fn}', f"    {code}"]
      if self.chance(0.3):
        out.append(" " * 11 + "^" * self.r.randint(3, 12))
    why = self.pick(["division by zero", repr(self.pick(NOUNS)), "list index out of range",
                     self.sentence()])
    out.append(f"{self.pick(EXCEPTIONS)}: {why}")
    return "\n".join(out) + "\n"

  def pytest_output(self, path):
    tests = [f"test_{self.func_name()}" for _ in range(self.r.randint(1, 6))]
    failed = [t for t in tests if self.chance(0.4)]
    tp = "tests/test_" + path.split("/")[-1]
    dots = "".join("F" if t in failed else "." for t in tests)
    out = ["=" * 29 + " test session starts " + "=" * 30,
           "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
           "rootdir: /repo", f"collected {len(tests)} items", "",
           f"{tp} {dots}{' ' * 20}[100%]", ""]
    if failed:
      out.append("=" * 35 + " FAILURES " + "=" * 35)
      for t in failed:
        a, b = self.r.randint(0, 99), self.r.randint(0, 99)
        out += ["_" * 20 + f" {t} " + "_" * 20, "", f"    def {t}():",
                f">       assert {t[5:]}({a}) == {b}", f"E       assert {a + 1} == {b}", "",
                f"{tp}:{self.r.randint(3, 80)}: AssertionError"]
      out.append("=" * 30 + " short test summary info " + "=" * 30)
      out += [f"FAILED {tp}::{t} - assert {self.r.randint(0, 99)} == {self.r.randint(0, 99)}"
              for t in failed]
    passed = len(tests) - len(failed)
    summary = ", ".join(([f"{len(failed)} failed"] if failed else []) +
                        ([f"{passed} passed"] if passed else []))
    out.append(f"{'=' * 20} {summary} in {self.r.random() * 3:.2f}s {'=' * 20}")
    return "\n".join(out) + "\n"

  def git_output(self):
    r = self.r.random()
    if r < 0.35:
      mods = sorted({self.path() for _ in range(self.r.randint(1, 4))})
      return ("On branch main\nChanges not staged for commit:\n"
              '  (use "git add <file>..." to update what will be committed)\n\n'
              + "".join(f"\tmodified:   {m}\n" for m in mods) + "\nno changes added to commit\n")
    if r < 0.6:
      return "".join(f"{self.hexid()} {self.pick(VERBS).capitalize()} {self.pick(ADJS)} "
                     f"{self.pick(NOUNS)} handling\n" for _ in range(self.r.randint(2, 8)))
    return self.diff()

  def grep(self, pattern):
    return "".join(
        f"./{self.path()}:{self.r.randint(1, 400)}:{self.tab}{pattern}({self.ident(1)})\n"
        for _ in range(self.r.randint(0, 5)))

  def shell(self):
    """A (command, output) pair as a coding agent would see them."""
    path, k = self.path(), self.r.randrange(9)
    if k == 0:
      long = self.chance(0.5)
      return ("ls -la" if long else "ls"), self.ls(long)
    if k == 1:
      return f"cat -n {path}", self.cat_n(self.module())
    if k == 2:
      return self.pick(["git status", "git log --oneline -5", "git diff"]), self.git_output()
    if k == 3:
      target = self.pick([" tests/", " tests/test_" + path.split("/")[-1], ""])
      return f"python -m pytest -q{target}", self.pytest_output(path)
    if k == 4:
      return f"python -m {path[:-3].replace('/', '.')}", self.traceback(path)
    if k == 5:
      pattern = self.func_name()
      return f'grep -rn "{pattern}" .', self.grep(pattern)
    if k == 6:
      return "find . -name '*.py' | head", "".join(
          f"./{self.path()}\n" for _ in range(self.r.randint(1, 10)))
    if k == 7:
      return f"sed -n '1,40p' {path}", self.module()
    pkg = self.pick(["numpy", "pytest", "requests", "pyyaml", "rich"])
    return f"pip install {pkg}", (
        f"Collecting {pkg}\n  Using cached {pkg}-{self.r.randint(1, 9)}.{self.r.randint(0, 30)}.0"
        f"-py3-none-any.whl\nInstalling collected packages: {pkg}\nSuccessfully installed {pkg}\n")

  # -- Transcripts ----------------------------------------------------------------------------

  def tool_use(self, name, path):
    """(arguments, tool output) of one call of the tool `name`."""
    if name == "bash":
      cmd, out = self.shell()
      return {"command": cmd}, out
    if name == "read_file":
      return {"path": path}, self.cat_n(self.module())
    if name == "str_replace":
      old = self.function()
      return ({"path": path, "old_str": old, "new_str": self.mutate(old)},
              f"The file {path} has been edited.")
    if name == "write_file":
      test_path = "tests/test_" + path.split("/")[-1]
      return {"path": test_path, "content": self.test_module(path)}, "File written."
    if name == "search":
      pattern = self.func_name()
      return {"pattern": pattern, "path": "."}, self.grep(pattern) or "No matches found."
    return {}, "Submitted."

  def conversation(self):
    """(messages, tools) of one agent episode."""
    tools = [t for t in TOOLS if self.chance(0.7)] or TOOLS[:1]
    path = self.path()
    msgs = [{"role": "system", "content": self.pick(SYSTEM_PROMPTS)}] if self.chance(0.8) else []
    issue = " ".join(self.sentence() for _ in range(self.r.randint(1, 3)))
    if self.chance(0.2):
      issue += " " + self.pick(UNICODE_SNIPPETS)
    msgs.append({"role": "user", "content": f"{issue}\n\nThe code is in `{path}`."})
    for _ in range(self.r.randint(1, 6)):
      content = self.sentence() if self.chance(0.7) else ""
      if self.chance(0.15):
        thought = f"{self.sentence()} {self.sentence()}"
        content = f"{ct.THINK_OPEN}\n{thought}\n{ct.THINK_CLOSE}\n\n{content}"
      calls, results = [], []
      for _ in range(1 if self.chance(0.8) else 2):
        name = self.pick(tools)["function"]["name"]
        args, out = self.tool_use(name, path)
        if self.chance(0.3):  # OpenAI clients send arguments as a JSON string.
          args = json.dumps(args, ensure_ascii=False)
        call_id = f"call_{self.hexid(8)}"
        calls.append({"id": call_id, "type": "function",
                      "function": {"name": name, "arguments": args}})
        results.append({"role": "tool", "tool_call_id": call_id, "content": out})
      msgs += [{"role": "assistant", "content": content, "tool_calls": calls}] + results
    final = " ".join(self.sentence() for _ in range(self.r.randint(1, 3)))
    return msgs + [{"role": "assistant", "content": final}], tools

  def qa(self):
    """A tool-less exchange: a request and a markdown answer with code."""
    self.tab = "    "
    answer = f"{self.sentence()}\n\n```python\n{self.function()}\n```\n\n{self.sentence()}"
    return [{"role": "user", "content": f"Write a Python function: {self.sentence()}"},
            {"role": "assistant", "content": answer}], None


def _tool(name, desc, props, required):
  return {"type": "function", "function": {
      "name": name, "description": desc,
      "parameters": {"type": "object", "properties": props, "required": required}}}


_STR, _INT = {"type": "string"}, {"type": "integer"}
TOOLS = [
    _tool("bash", "Run a bash command in the repository and return its output.",
          {"command": {**_STR, "description": "The command to run."}}, ["command"]),
    _tool("read_file", "Read a file with line numbers.",
          {"path": _STR, "start_line": _INT, "end_line": _INT}, ["path"]),
    _tool("str_replace", "Replace one exact occurrence of old_str with new_str in a file.",
          {"path": _STR, "old_str": _STR, "new_str": _STR}, ["path", "old_str", "new_str"]),
    _tool("write_file", "Create or overwrite a file.",
          {"path": _STR, "content": _STR}, ["path", "content"]),
    _tool("search", "Search files for a regular expression.",
          {"pattern": _STR, "path": _STR}, ["pattern"]),
    _tool("submit", "Finish the task.", {}, []),
]
SYSTEM_PROMPTS = [
    "You are a coding agent working in a git repository. Use the tools to inspect and edit files, "
    "run the tests, and stop when the task is done.",
    "You are a helpful assistant.",
    "You are an expert Python developer. Make minimal, correct changes.",
]
