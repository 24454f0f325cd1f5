"""Echoed tool calls and side-call classification, against what real harnesses send."""

from legorl_jax.proxy.render import same_calls
from legorl_jax.proxy.streams import default_stream_classifier
from legorl_jax.proxy.types import Message, RenderedRequest, ToolCall


def test_echoed_call_with_defaulted_extra_argument_matches():
  recorded = [ToolCall("toolu_1", "Edit", {"file_path": "a.py", "old_string": "x", "new_string": "y"})]
  echoed = [ToolCall("toolu_1", "Edit", {"file_path": "a.py", "old_string": "x", "new_string": "y",
                                         "replace_all": False})]
  assert same_calls(echoed, recorded)
  changed = [ToolCall("toolu_1", "Edit", {"file_path": "a.py", "old_string": "x", "new_string": "z"})]
  assert not same_calls(changed, recorded)
  assert not same_calls(recorded, echoed)  # a recorded argument missing from the echo


def test_opencode_sized_title_prompt_is_a_side_call():
  title_system = "You are a title generator. " + "Rules for a short title. " * 80  # ~2.1k chars
  req = RenderedRequest(api="chat", model="m", messages=[Message("system", title_system),
                                                         Message("user", "fix the bug")])
  assert 2000 < len(title_system) < 4000
  assert default_stream_classifier(req, None) == "title"
