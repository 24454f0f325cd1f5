"""Tests of the bundled tokenizer, chat rendering and tool-call parsing."""

import importlib.util
import json
import pathlib
import shutil

import pytest
import tokenizers
import transformers

from legorl_jax.errors import TokenizerError
from legorl_jax.models import chat_template as ct
from legorl_jax.models import tokenizer as tk

REPO = pathlib.Path(__file__).resolve().parents[2]
EXPECTED_IDS = {"<|endoftext|>": 8183, "<|im_start|>": 8184, "<|im_end|>": 8185,
                "<tool_call>": 8186, "</tool_call>": 8187, "<tool_response>": 8188,
                "</tool_response>": 8189, "<think>": 8190, "</think>": 8191}

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
EDIT = {"type": "function", "function": {
    "name": "str_replace", "description": "Replace text in a file.",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                   "required": ["path", "old", "new"]}}}


def _call(name, args, as_string=False, i=0):
  return {"id": f"call_{i}", "type": "function",
          "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


CONVERSATIONS = [
    # system + tools, one call with string arguments, a tool result, a final answer.
    [{"role": "system", "content": "You fix bugs."},
     {"role": "user", "content": "Tests fail in `calc.py`."},
     {"role": "assistant", "content": "Let me run them.",
      "tool_calls": [_call("bash", {"command": "python -m pytest -q"}, as_string=True)]},
     {"role": "tool", "tool_call_id": "call_0", "content": "1 failed, 3 passed"},
     {"role": "assistant", "content": "One test fails."}],
    # no system message; two calls in one turn; consecutive tool results; content that starts
    # with newlines and spaces; unicode; thinking; an empty-content call turn.
    [{"role": "user", "content": "Rename `naïve_sum` → `safe_sum` 🚀"},
     {"role": "assistant", "content": "\n\n  <think>\nfind uses first\n</think>\n\nSearching.",
      "tool_calls": [_call("bash", {"command": "grep -rn naïve_sum ."}, i=1),
                     _call("bash", {"command": "cat -n calc.py"}, i=2)]},
     {"role": "tool", "tool_call_id": "call_1", "content": "calc.py:3:def naïve_sum(xs):"},
     {"role": "tool", "tool_call_id": "call_2", "content": "     1\timport math\n     2\t\n"},
     {"role": "assistant", "content": None,
      "tool_calls": [_call("str_replace", {"path": "calc.py", "old": "naïve_sum",
                                           "new": "safe_sum"}, i=3)]},
     {"role": "tool", "tool_call_id": "call_3", "content": [{"type": "text", "text": "Edited."}]},
     {"role": "user", "content": "   thanks\n"},
     {"role": "assistant", "content": "    Done: renamed in 1 file.\n"}],
    # a mid-conversation system message and an assistant turn that is only whitespace.
    [{"role": "system", "content": "S"},
     {"role": "user", "content": "hi"},
     {"role": "assistant", "content": " \n"},
     {"role": "system", "content": "Reminder: be brief."},
     {"role": "user", "content": "run ls"},
     {"role": "assistant", "content": "",
      "tool_calls": [_call("bash", {"command": "ls -la"}, i=4)]},
     {"role": "tool", "tool_call_id": "call_4", "content": "total 0\n"},
     {"role": "assistant", "content": "\tEmpty directory."}],
]


@pytest.fixture(scope="module")
def tok():
  return tk.load_tokenizer()


def test_loads_offline_with_auto_tokenizer(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  t = transformers.AutoTokenizer.from_pretrained(str(tk.bundled_tokenizer_dir()))
  assert isinstance(t, transformers.PreTrainedTokenizerFast)
  assert len(t) == 8192 and t.backend_tokenizer.get_vocab_size() == 8192
  assert t.chat_template == ct.CHAT_TEMPLATE
  assert t.eos_token == "<|im_end|>" and t.pad_token == "<|endoftext|>" and t.bos_token is None
  assert tk.load_tokenizer("bundled").get_vocab() == t.get_vocab()


def test_special_tokens_are_single_fixed_ids(tok):
  for token, i in EXPECTED_IDS.items():
    assert tok.convert_tokens_to_ids(token) == i
    assert tok.encode(token, add_special_tokens=False) == [i]
    assert tok.encode(f"x{token}y", add_special_tokens=False)[1] == i
  assert tk.special_token_ids(tok) == {"eos": 8185, "pad": 8183, "im_start": 8184, "im_end": 8185}
  assert tk.stop_token_ids(tok) == [8183, 8185]
  text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
  ids = tok.encode(text, add_special_tokens=False)
  # Control tokens are dropped by skip_special_tokens; tool-call markup survives for parsing.
  assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"
  assert tok.decode(ids) == text


@pytest.mark.parametrize("text", [
    'def naïve_mean(xs: list[float]) -> float:\n    """Mean — ∑xᵢ / n."""\n'
    '    return sum(xs) / len(xs)\n',
    "print('温度 = 25℃ 🚀✨')\r\n\tx\t=\t1  \n\n\n",
    "e\u0301 vs \u00e9, zero\u200bwidth, \U0001f9ea, \x00\x07 control bytes",
    "    if a <= b:  # trailing spaces   \n        raise ValueError(f\"{a!r}\")\n",
])
def test_round_trip_and_matches_raw_tokenizers(tok, text):
  ids = tok.encode(text, add_special_tokens=False)
  assert tok.decode(ids) == text
  raw = tokenizers.Tokenizer.from_file(str(tk.bundled_tokenizer_dir() / "tokenizer.json"))
  assert raw.encode(text, add_special_tokens=False).ids == ids
  assert all(0 <= i < 8183 for i in ids)


def test_code_is_compressed(tok):
  src = (REPO / "legorl_jax" / "models" / "tokenizer.py").read_text()
  assert len(tok.encode(src, add_special_tokens=False)) < len(src.encode()) / 2.5


def _assistant_indices(msgs):
  return [i for i, m in enumerate(msgs) if m["role"] == "assistant"]


@pytest.mark.parametrize("msgs", CONVERSATIONS)
def test_prompt_is_token_prefix_of_conversation(tok, msgs):
  tools = [BASH, EDIT]
  nl = tok.encode("\n", add_special_tokens=False)
  for i in _assistant_indices(msgs):
    prompt = tk.render_chat(tok, msgs[:i], tools, add_generation_prompt=True)
    full = tk.render_chat(tok, msgs[:i + 1], tools, add_generation_prompt=False)
    assert full[:len(prompt)] == prompt, i
    # The reply ends with <|im_end|> then the template's "\n" (loss mask 0 in the proxy).
    assert full[-1 - len(nl):] == [8185] + nl
    # Every later prompt extends the one-shot render of the conversation so far.
    for j in range(i + 2, len(msgs) + 1):
      later = tk.render_chat(tok, msgs[:j], tools, add_generation_prompt=True)
      assert later[:len(full)] == full, (i, j)


def test_prefix_property_on_generated_episodes(tok):
  """The same property on agent episodes from the corpus generator, with odd whitespace."""
  gen = _script().Gen(seed=11)
  pads = ["", " ", "\n", "\n\n  ", "\t", "  \n"]
  for k in range(12):
    msgs, tools = gen.conversation()
    for m in msgs:
      if m["role"] == "assistant":
        m["content"] = pads[k % len(pads)] + m["content"] + pads[(k + 1) % len(pads)]
    for i in _assistant_indices(msgs):
      prompt = tk.render_chat(tok, msgs[:i], tools)
      full = tk.render_chat(tok, msgs[:i + 1], tools, add_generation_prompt=False)
      assert full[:len(prompt)] == prompt, (k, i)
      if i + 2 <= len(msgs):
        later = tk.render_chat(tok, msgs[:i + 2], tools)
        assert later[:len(full)] == full, (k, i)


@pytest.mark.parametrize("msgs", CONVERSATIONS)
def test_text_and_ids_agree(tok, msgs):
  text = tk.render_chat_text(tok, msgs, [BASH], add_generation_prompt=False)
  ids = tk.render_chat(tok, msgs, [BASH], add_generation_prompt=False)
  assert ids == tok.encode(text, add_special_tokens=False)
  # transformers v5 returns a BatchEncoding by default; render_chat gives the same ids as a list.
  enc = tok.apply_chat_template(msgs, tools=[BASH])
  assert tk._as_int_list(enc) == ids and type(ids) is list and type(ids[0]) is int


def test_tools_are_rendered_in_the_system_turn(tok):
  def read_file(path: str, start: int = 1):
    """Read a file.

    Args:
      path: File to read.
      start: First line.
    """
  for msgs in ([{"role": "system", "content": "Be careful."}, {"role": "user", "content": "hi"}],
               [{"role": "user", "content": "hi"}]):
    text = tk.render_chat_text(tok, msgs, [BASH, read_file])
    assert text.startswith("<|im_start|>system\n")
    system = text[:text.index("<|im_end|>")]
    assert json.dumps(BASH) in system
    assert '"name": "read_file"' in system and '"start"' in system
    assert "<tool_call>" in system
    assert ("Be careful." in system) == (msgs[0]["role"] == "system")
    assert text.count("<|im_start|>system") == 1
  assert "<tools>" not in tk.render_chat_text(tok, [{"role": "user", "content": "hi"}])


def test_render_matches_hand_written_string(tok):
  msgs = [{"role": "system", "content": "Sys."},
          {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Look.",
           "tool_calls": [_call("bash", {"command": "ls"}, as_string=True),
                          {"name": "bash", "arguments": {"command": "pwd"}}]},
          {"role": "tool", "content": "a.py"},
          {"role": "tool", "content": "/repo"}]
  expected = (
      "<|im_start|>system\nSys.\n\n# Tools\n\nThese functions are available. Their JSON "
      "signatures are listed inside <tools></tools>, one per line:\n<tools>\n"
      '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
      '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, '
      '"required": ["command"]}}}\n</tools>\n\nTo call functions, write one block per call:\n'
      '<tool_call>\n{"name": <function name>, "arguments": <JSON object of arguments>}\n'
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n"
      '<|im_start|>assistant\nLook.\n<tool_call>\n'
      '{"name": "bash", "arguments": {"command": "ls"}}\n'
      '</tool_call>\n<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>'
      "<|im_end|>\n"
      "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\n/repo\n"
      "</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n")
  assert tk.render_chat_text(tok, msgs, [BASH]) == expected
  assert tk.render_chat(tok, msgs, [BASH]) == tok.encode(expected, add_special_tokens=False)


def test_assistant_mask_covers_generated_tokens_only(tok):
  msgs = CONVERSATIONS[0]
  out = tok.apply_chat_template(msgs, tools=[BASH], return_dict=True,
                                return_assistant_tokens_mask=True)
  ids, mask = out["input_ids"], out["assistant_masks"]
  generated = tok.decode([i for i, m in zip(ids, mask) if m])
  assert generated == ("Let me run them.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": "
                       "{\"command\": \"python -m pytest -q\"}}\n</tool_call><|im_end|>"
                       "One test fails.<|im_end|>")


# ------------------------------------------------------------------------------------------------
# parse_tool_calls.

def test_parse_single_and_multiple_calls():
  text = ('I will look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a.py\\"}"}\n'
          "</tool_call>")
  content, calls, bad = tk.parse_tool_calls(text)
  assert content == "I will look."
  assert calls == [{"name": "bash", "arguments": {"command": "ls"}},
                   {"name": "read", "arguments": {"path": "a.py"}}]
  assert bad == []
  assert tk.parse_tool_calls("plain answer ") == ("plain answer", [], [])
  assert tk.parse_tool_calls('<tool_call>{"name": "submit"}</tool_call>') == (
      "", [{"name": "submit", "arguments": {}}], [])


def test_parse_then_render_gives_the_generated_text_back(tok):
  generated = ('Checking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n'
               "</tool_call>")
  content, calls, _ = tk.parse_tool_calls(generated)
  msgs = [{"role": "user", "content": "go"}]
  reply = {"role": "assistant", "content": content,
           "tool_calls": [{"type": "function", "function": c} for c in calls]}
  prompt = tk.render_chat_text(tok, msgs)
  full = tk.render_chat_text(tok, msgs + [reply], add_generation_prompt=False)
  assert full == prompt + generated + "<|im_end|>\n"


@pytest.mark.parametrize("block", [
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',  # missing brace
    '<tool_call>\n{"arguments": {"command": "ls"}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": "bash", "arguments": [1, 2]}\n</tool_call>',  # not an object
    '<tool_call>\n{"name": "bash", "arguments": "not json"}\n</tool_call>',
    '<tool_call>\n{"name": "a", "arguments": {}} trailing\n</tool_call>',
    "<tool_call></tool_call>",
])
def test_parse_malformed_block_stays_in_content(block):
  good = '<tool_call>{"name": "ok", "arguments": {"x": 1}}</tool_call>'
  text = f"Before.\n{block}\n{good}\nAfter."
  content, calls, bad = tk.parse_tool_calls(text)
  assert calls == [{"name": "ok", "arguments": {"x": 1}}]
  assert bad == [block]
  assert content == f"Before.\n{block}\n\nAfter."


def test_parse_unterminated_and_stray_tags():
  # Generation stopped before the closing tag, but the call is complete: accepted.
  assert tk.parse_tool_calls('x <tool_call>\n{"name": "bash", "arguments": {"c": 1}}\n') == (
      "x", [{"name": "bash", "arguments": {"c": 1}}], [])
  # Cut off mid-JSON: kept as text.
  cut = '<tool_call>\n{"name": "bash", "argu'
  assert tk.parse_tool_calls("x " + cut) == ("x " + cut, [], [cut])
  # An opener followed by another opener: the first is unterminated and kept.
  text = '<tool_call>{"name": <tool_call>{"name": "b", "arguments": {}}</tool_call>'
  assert tk.parse_tool_calls(text) == (
      '<tool_call>{"name":', [{"name": "b", "arguments": {}}], ['<tool_call>{"name": '])
  # A stray closing tag is plain content.
  assert tk.parse_tool_calls("done </tool_call>") == ("done </tool_call>", [], [])


# ------------------------------------------------------------------------------------------------
# Other tokenizers and errors.

def _copy_bundled(dst, config_updates, drop=()):
  dst.mkdir()
  shutil.copy(tk.bundled_tokenizer_dir() / "tokenizer.json", dst)
  config = json.loads((tk.bundled_tokenizer_dir() / "tokenizer_config.json").read_text())
  config.update(config_updates)
  for k in drop:
    config.pop(k)
  (dst / "tokenizer_config.json").write_text(json.dumps(config))
  return dst


QWEN_PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m.role != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_transformers_qwen2_tokenizer_template_renders(tmp_path):
  d = _copy_bundled(tmp_path / "qwen", {"tokenizer_class": "Qwen2Tokenizer",
                                        "chat_template": QWEN_PLAIN_TEMPLATE})
  t = tk.load_tokenizer(d)
  assert type(t).__name__ == "Qwen2Tokenizer"
  msgs = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
          {"role": "user", "content": "and 3 + 3?"}]
  expected = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
              "<|im_start|>user\nand 3 + 3?<|im_end|>\n<|im_start|>assistant\n")
  assert tk.render_chat_text(t, msgs) == expected
  ids = tk.render_chat(t, msgs)
  assert ids == t.encode(expected, add_special_tokens=False)
  assert t.decode(ids) == expected
  assert tk.special_token_ids(t)["im_end"] == 8185
  # An explicit template overrides the tokenizer's.
  assert tk.render_chat_text(t, msgs[:1], chat_template="{{ messages[0].content }}") == "2 + 2?"


def test_load_errors(tmp_path):
  with pytest.raises(TokenizerError, match="no tokenizer files in .*empty.*tokenizer.json"):
    (tmp_path / "empty").mkdir()
    tk.load_tokenizer(tmp_path / "empty")
  with pytest.raises(TokenizerError, match="does not exist"):
    tk.load_tokenizer(tmp_path / "missing")
  d = _copy_bundled(tmp_path / "raw", {}, drop=("chat_template",))
  with pytest.raises(TokenizerError, match="has no chat template.*chat_template"):
    tk.load_tokenizer(d)
  t = tk.load_tokenizer(d, require_chat_template=False)
  with pytest.raises(TokenizerError, match="has no chat template"):
    tk.render_chat(t, [{"role": "user", "content": "hi"}])


def test_render_errors(tok):
  with pytest.raises(TokenizerError, match="Unknown message role critic"):
    tk.render_chat(tok, [{"role": "critic", "content": "x"}])
  with pytest.raises(TokenizerError, match="Only text content parts"):
    tk.render_chat(tok, [{"role": "user", "content": [{"type": "image", "url": "x"}]}])


# ------------------------------------------------------------------------------------------------
# The training script.

def _script():
  spec = importlib.util.spec_from_file_location(
      "make_tokenizer", REPO / "experiments" / "make_tokenizer.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_training_script_is_deterministic():
  mt = _script()
  runs = []
  for _ in range(2):
    docs, manifest = mt.build_corpus(seed=3, n_units=15, repo_text=False)
    runs.append((docs, mt.train(docs, vocab_size=700).to_str(pretty=False)))
  assert runs[0] == runs[1]
  other_docs, _ = mt.build_corpus(seed=4, n_units=15, repo_text=False)
  assert other_docs != runs[0][0]
  t = tokenizers.Tokenizer.from_str(runs[0][1])
  assert t.get_vocab_size() == 700
  assert [t.token_to_id(s) for s in ct.ADDED_TOKENS] == list(range(691, 700))
  # Training never sees the added-token strings, so no BPE entry contains one.
  learned = [s for s in t.get_vocab() if s not in ct.ADDED_TOKENS]
  assert not any("im_start" in s or "tool_call" in s for s in learned)
  assert manifest["documents"] == len(runs[0][0])


def test_committed_files_match_the_script():
  mt = _script()
  bundled = tk.bundled_tokenizer_dir()
  raw = tokenizers.Tokenizer.from_file(str(bundled / "tokenizer.json"))
  files = mt.tokenizer_files(raw)
  for name in ("tokenizer_config.json", "special_tokens_map.json"):
    assert (bundled / name).read_text() == files[name], f"{name} is stale: rerun make_tokenizer.py"
  saved = json.loads((bundled / "tokenizer.json").read_text())
  assert saved["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == mt.SPLIT_PATTERN
  assert (bundled / "tokenizer.json").stat().st_size < 1_000_000
