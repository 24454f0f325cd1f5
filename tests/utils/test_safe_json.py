"""safe_json: the one parser for untrusted JSON. Compared against the stdlib decoder (the
reference for what parses) at depths on both sides of the bound, from shallow and deep stacks."""

import ast
import json
import pathlib
import sys

import pytest

from legorl_jax.errors import InvalidJSONError
from legorl_jax.utils import safe_json

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _nested(depth: int, closed: bool = True) -> str:
  return "[" * depth + ("]" * depth if closed else "")


def _depth_of(obj) -> int:
  d = 0
  while isinstance(obj, list) and obj:
    obj, d = obj[0], d + 1
  return d + (1 if isinstance(obj, list) else 0)


@pytest.mark.parametrize("depth", [10, 900, 1000, 5000, 100_000])
@pytest.mark.parametrize("closed", [True, False])
def test_every_depth_is_parsed_or_refused_never_recursion_error(depth, closed):
  text = _nested(depth, closed)
  if depth <= safe_json.MAX_DEPTH and closed:
    assert _depth_of(safe_json.loads(text)) == depth
  else:
    with pytest.raises(InvalidJSONError) as e:
      safe_json.loads(text.encode(), what="request body")
    assert "request body" in str(e.value)
    if depth > safe_json.MAX_DEPTH:
      assert f"nests {depth} levels deep" in str(e.value)


def test_the_bound_is_exact_and_objects_count_too():
  limit = safe_json.MAX_DEPTH
  assert _depth_of(safe_json.loads(_nested(limit))) == limit
  with pytest.raises(InvalidJSONError, match=f"nests {limit + 1} levels"):
    safe_json.loads(_nested(limit + 1))
  obj = '{"a":' * (limit + 1) + "1" + "}" * (limit + 1)
  with pytest.raises(InvalidJSONError, match="levels deep"):
    safe_json.loads(obj)


def test_brackets_inside_strings_do_not_count():
  text = json.dumps({"code": "[" * 5000 + '\\"' + "{" * 5000, "k": ["]]]"]})
  assert safe_json.loads(text) == json.loads(text)
  assert safe_json.nesting_depth(text) == 2


def _outcome_with_scan(text: str, bound: int):
  """What ``loads`` must give, decided by the full scan alone (the reference for the fast path)."""
  depth = safe_json.nesting_depth(text)
  if depth > bound:
    return f"refused: body nests {depth} levels deep; at most {bound} are accepted"
  return json.loads(text)


@pytest.mark.parametrize("text,bound,scans", [
    (_nested(safe_json.MAX_DEPTH), safe_json.MAX_DEPTH, False),  # at the bound: count suffices
    (_nested(safe_json.MAX_DEPTH + 1), safe_json.MAX_DEPTH, True),  # one past: scanned, refused
    ('[{"a": [1]}]', 3, False),
    ('[[{"a": [1]}]]', 3, True),
    ('{"a": {"b": {"c": {}}}}', 3, True),
    # Brackets inside strings: the count is past the bound, the real depth (2) is not.
    (json.dumps({"code": "[" * 300 + "{" * 300, "k": ["]]"]}), safe_json.MAX_DEPTH, True),
    ('["[[[[", {"k": "{{"}]', 3, True),
])
def test_bracket_count_fast_path_agrees_with_the_scan(monkeypatch, text, bound, scans):
  """Skipping the scan when ``[`` + ``{`` count at most the bound changes no outcome or message,
  for str and bytes; the scan still runs (and accepts) when only strings push the count up."""
  want = _outcome_with_scan(text, bound)
  calls, scan = [], safe_json.nesting_depth

  def spy(t):
    calls.append(t)
    return scan(t)
  monkeypatch.setattr(safe_json, "nesting_depth", spy)
  for data in (text, text.encode()):
    calls.clear()
    try:
      got = safe_json.loads(data, what="body", max_depth=bound)
    except InvalidJSONError as e:
      got = f"refused: {e}"
    assert got == want
    assert bool(calls) == scans
  assert (text.count("[") + text.count("{") > bound) == scans


def _at_stack_depth(frames: int, fn):
  if frames == 0:
    return fn()
  return _at_stack_depth(frames - 1, fn)


@pytest.mark.parametrize("depth", [safe_json.MAX_DEPTH, safe_json.MAX_DEPTH + 1, 5000])
def test_outcome_does_not_depend_on_the_callers_stack(depth):
  """The same text gives the same outcome from a shallow stack and from one ~600 frames deep
  (where the bare stdlib decoder already fails at depth 400)."""
  text = _nested(depth)
  deep = sys.getrecursionlimit() - 400
  with pytest.raises(RecursionError):
    _at_stack_depth(deep, lambda: json.loads(_nested(450)))

  def outcome():
    try:
      return _depth_of(safe_json.loads(text))
    except InvalidJSONError as e:
      return type(e)
  assert outcome() == _at_stack_depth(deep, outcome)


def test_numbers_and_constants():
  assert safe_json.loads('{"n": 18446744073709551615, "x": 1.5e300}') == {
      "n": 18446744073709551615, "x": 1.5e300}
  with pytest.raises(InvalidJSONError, match="digits"):
    safe_json.loads("1" * 5000)  # the stdlib raises a bare ValueError past 4300 digits
  with pytest.raises(InvalidJSONError, match="digits"):
    safe_json.loads("[" + "9" * 65 + "]")
  with pytest.raises(InvalidJSONError, match="overflows"):
    safe_json.loads("[1e400]")
  # NaN / Infinity parse as in the stdlib: the validators that read a field name it.
  assert safe_json.loads('{"a": NaN}')["a"] != safe_json.loads('{"a": NaN}')["a"]


def test_invalid_text_names_the_problem():
  with pytest.raises(InvalidJSONError, match=r"task line is not valid JSON: Expecting .* column"):
    safe_json.loads('{"a": ', what="task line")
  with pytest.raises(InvalidJSONError, match="not valid UTF-8"):
    safe_json.loads(b'{"a": "\xff"}')
  assert safe_json.loads(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a BOM is accepted
  assert isinstance(InvalidJSONError("x"), ValueError) and InvalidJSONError.status == 400


# Files whose json.load(s) read only what this project wrote itself (run files, its own
# markers and stamps, its own processes' messages), or that cannot import the package.
_TRUSTED = {
    "legorl_jax/harnesses/builtin_agent.py": "stdlib-only agent run inside the sandbox; catches "
                                             "RecursionError itself",
    "legorl_jax/harnesses/install.py": "its own install stamp",
    "legorl_jax/metrics/dashboard.py": "the run's own trials.jsonl / summary.json",
    "legorl_jax/metrics/writer.py": "the run's own metrics.jsonl",
    "legorl_jax/sandbox/local.py": "its own sandbox marker file",
    "legorl_jax/trainer/multihost.py": "messages between the run's own processes",
    "legorl_jax/trainer/sft.py": "demonstrations the run recorded itself",
    "legorl_jax/trainer/rl_loop.py": "the run's own rollout records",
    "legorl_jax/trainer/pipeline.py": "the run's own summary files",
    "legorl_jax/taskgen/repo/builder.py": "round-trips a task dict it just built",
}


def test_no_bare_json_parse_of_untrusted_input():
  offenders = []
  for path in sorted((ROOT / "legorl_jax").rglob("*.py")):
    rel = path.relative_to(ROOT).as_posix()
    if rel == "legorl_jax/utils/safe_json.py" or rel in _TRUSTED:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Attribute) and node.attr in ("loads", "load", "raw_decode")
          and isinstance(node.value, ast.Name) and node.value.id == "json"):
        offenders.append(f"{rel}:{node.lineno}")
      if isinstance(node, ast.Attribute) and node.attr == "JSONDecoder":
        offenders.append(f"{rel}:{node.lineno}")
  assert not offenders, ("parse untrusted JSON with legorl_jax.utils.safe_json (or list the "
                         f"file in _TRUSTED with why): {offenders}")
