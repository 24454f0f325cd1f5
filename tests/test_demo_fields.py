"""experiments.demo_fields: the tool-call field spans it attributes tokens to."""

import json

from experiments.demo_fields import field_spans


def test_field_spans_find_json_string_values_with_escapes():
  args = {"path": "ledger_sensor/model.py", "old": 'x = "a"', "new": 'x = "b"\\n'}
  text = ("<tool_call>\n" + json.dumps({"name": "edit", "arguments": args}) + "\n</tool_call>")
  spans = field_spans(text)
  assert set(spans) == {"path", "old", "new"}
  for field, (a, b) in spans.items():
    assert json.loads('"' + text[a:b] + '"') == args[field]
  assert field_spans('{"name": "submit", "arguments": {}}') == {}
