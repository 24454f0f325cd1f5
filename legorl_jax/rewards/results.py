"""Parsing test results (pytest JUnit XML, pyrunner JSON) and turning them into a reward."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from legorl_jax.errors import VerifierError
from legorl_jax.utils import safe_json

PASSED, FAILED, ERROR, SKIPPED, MISSING = "passed", "failed", "error", "skipped", "missing"


def parse_pyrunner_json(text: str) -> dict[str, str]:
  """{test id: outcome} from the pyrunner's JSON output."""
  try:
    payload = safe_json.loads(text, what="pyrunner output")
    return {k: str(v["outcome"]) for k, v in payload["tests"].items()}
  except (ValueError, KeyError, TypeError, AttributeError) as e:  # InvalidJSONError is a ValueError
    raise VerifierError(f"pyrunner output is not valid results JSON: {e}") from None


def parse_junit_xml(text: str) -> dict[str, str]:
  """{test id: outcome} from JUnit XML as pytest writes it (xunit1 or xunit2).

  The id is ``file::Class::name`` when the ``file`` attribute is present (xunit1),
  otherwise the dotted ``classname`` is turned into a path guess ``a/b.py::Class::name``.
  """
  root = _junit_root(text)
  out = {}
  for case in root.iter("testcase"):
    name = case.get("name", "")
    classname = case.get("classname", "")
    file = case.get("file")
    outcome = PASSED
    for child in case:
      tag = child.tag
      if tag == "failure":
        outcome = FAILED
      elif tag == "error":
        outcome = ERROR
      elif tag == "skipped":
        outcome = SKIPPED
    out[_junit_id(file, classname, name)] = outcome
  return out


def junit_failure_messages(text: str) -> dict[str, str]:
  """{test id: the ``message`` of its failure or error} for the tests that did not pass (ids
  as ``parse_junit_xml`` gives them). The message is the exception's text (pytest's
  assertion explanation), without the traceback and the test source that follow it."""
  root = _junit_root(text)
  out = {}
  for case in root.iter("testcase"):
    for child in case:
      if child.tag in ("failure", "error"):
        out[_junit_id(case.get("file"), case.get("classname", ""), case.get("name", ""))] = (
            child.get("message") or "")
        break
  return out


def _junit_root(text: str) -> ET.Element:
  try:
    return ET.fromstring(text)
  except ET.ParseError as e:
    raise VerifierError(f"JUnit XML is malformed: {e}") from None


def _junit_id(file, classname, name):
  parts = classname.split(".") if classname else []
  if file:
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file
    rest = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
    return "::".join([file] + ([*rest.split(".")] if rest else []) + [name])
  # Without a file attribute: classes start with an upper-case letter by convention.
  i = len(parts)
  while i > 0 and parts[i - 1][:1].isupper():
    i -= 1
  path = "/".join(parts[:i]) + ".py" if i else ""
  return "::".join([p for p in [path, *parts[i:], name] if p])


def match_results(observed: dict[str, str], expected_ids) -> dict[str, str]:
  """Outcome of each expected id: exact id, else a unique observed id that ends with it.

  SWE-bench lists sometimes name tests without the file part (``test_x (mod.Class)``
  style aside, ``Class::test_x``); an expected id that matches nothing is ``missing``.
  """
  out = {}
  for tid in expected_ids:
    if tid in observed:
      out[tid] = observed[tid]
      continue
    cands = [k for k in observed if k.endswith("::" + tid)]
    out[tid] = observed[cands[0]] if len(cands) == 1 else MISSING
  return out


def score(per_test: dict[str, str], fail_to_pass, pass_to_pass, *, partial_credit: bool = False) -> float:
  """1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0 (or the fraction
  passed with ``partial_credit``, and then only if some FAIL_TO_PASS test passed)."""
  ids = list(fail_to_pass) + list(pass_to_pass)
  if not ids:
    raise VerifierError("score() needs at least one FAIL_TO_PASS or PASS_TO_PASS test id")
  ok = [per_test.get(t) == PASSED for t in ids]
  if all(ok):
    return 1.0
  if not partial_credit:
    return 0.0
  if fail_to_pass and not any(per_test.get(t) == PASSED for t in fail_to_pass):
    return 0.0
  return sum(ok) / len(ok)
