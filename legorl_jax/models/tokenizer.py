"""Tokenizers and chat rendering, through `transformers`.

Every prompt the policy sees is rendered by the tokenizer's own chat template (tool
definitions, assistant tool calls, tool results), so a Hugging Face checkpoint and the bundled
tiny tokenizer go through the same code. Host-side only; nothing here runs on device.

The bundled tokenizer (``assets/tokenizer``, made by ``experiments/make_tokenizer.py``) is a
byte-level BPE with 8192 ids: 8183 BPE ids, then the added tokens of `chat_template`
(``<|endoftext|>`` = 8183 ... ``</think>`` = 8191).
"""

import os
import pathlib
import re
from typing import Any, Mapping, Sequence

from legorl_jax.errors import InvalidJSONError, TokenizerError
from legorl_jax.models import chat_template as ct
from legorl_jax.utils import safe_json

BUNDLED = "bundled"

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
# End-of-turn / end-of-text tokens used by common chat models; any present in a vocabulary
# stops generation in addition to the tokenizer's eos token.
_KNOWN_STOP_TOKENS = (ct.IM_END, ct.ENDOFTEXT, "<|eot_id|>", "<|end_of_text|>", "<|end|>",
                      "<end_of_turn>", "</s>")


def bundled_tokenizer_dir() -> pathlib.Path:
  """Directory of the tokenizer shipped with the package (tiny / small presets)."""
  return pathlib.Path(__file__).resolve().parent / "assets" / "tokenizer"


def load_tokenizer(path_or_name: str | os.PathLike | None = None, *,
                   require_chat_template: bool = True):
  """Loads a `transformers` tokenizer.

  Args:
    path_or_name: None or "bundled" for the bundled tokenizer; a checkpoint directory; or a
      Hugging Face hub id (only resolvable when cached or online).
    require_chat_template: raise if the tokenizer has no chat template (every rollout prompt
      is rendered through it); pass False for plain-text uses.

  Returns:
    A `transformers` fast tokenizer (``PreTrainedTokenizerFast`` / ``TokenizersBackend``).
  """
  from transformers import AutoTokenizer  # Heavy import; keep module import cheap.

  if path_or_name is None or str(path_or_name) == BUNDLED:
    path = bundled_tokenizer_dir()
    if not (path / "tokenizer.json").is_file():
      raise TokenizerError(
          f"bundled tokenizer is missing: expected {path}/tokenizer.json. Regenerate it with "
          "`python experiments/make_tokenizer.py`.")
    source = str(path)
  else:
    path = pathlib.Path(path_or_name).expanduser()
    if path.is_dir():
      if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise TokenizerError(
            f"no tokenizer files in {path}: expected tokenizer.json (with tokenizer_config.json) "
            f"or one of {', '.join(_TOKENIZER_FILES[2:])}. Copy the tokenizer files of the "
            "checkpoint into this directory, or pass tokenizer=\"bundled\".")
      source = str(path)
    elif path.exists() or _looks_like_path(str(path_or_name)):
      raise TokenizerError(
          f"tokenizer directory {path} does not exist (or is not a directory); expected a "
          "directory holding tokenizer.json and tokenizer_config.json.")
    else:
      source = str(path_or_name)
  try:
    tokenizer = AutoTokenizer.from_pretrained(source)
  except Exception as e:  # OSError, ValueError, tokenizers' parse errors...: all mean unusable.
    raise TokenizerError(
        f"cannot load a tokenizer from {source!r}: {e}. Expected a directory with tokenizer.json "
        "and tokenizer_config.json (or a cached hub id).") from e
  if require_chat_template and not getattr(tokenizer, "chat_template", None):
    raise TokenizerError(_no_template_message(source))
  return tokenizer


def render_chat_text(tokenizer, messages: Sequence[Mapping[str, Any]], tools=None,
                     add_generation_prompt: bool = True, *, chat_template: str | None = None,
                     **template_kwargs) -> str:
  """Renders a conversation to prompt text with the tokenizer's chat template.

  Messages are OpenAI-style dicts (role, content, tool_calls with dict or JSON-string
  arguments, tool results with role "tool"); tools are JSON function schemas or Python
  functions (converted by `transformers`).
  """
  _check_template(tokenizer, chat_template)
  try:
    text = tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
        chat_template=chat_template, tokenize=False, **template_kwargs)
  except Exception as e:  # jinja2 TemplateError, UndefinedError, TypeError, ValueError...
    raise TokenizerError(f"chat template failed to render the conversation: {e}") from e
  if not isinstance(text, str):
    raise TokenizerError(f"chat template rendering returned {type(text).__name__}, expected str")
  return text


def render_chat(tokenizer, messages: Sequence[Mapping[str, Any]], tools=None,
                add_generation_prompt: bool = True, *, chat_template: str | None = None,
                **template_kwargs) -> list[int]:
  """Renders a conversation to prompt token ids (a plain list of ints).

  Equal to ``tokenizer.encode(render_chat_text(...), add_special_tokens=False)``: the template
  writes any control tokens itself.
  """
  _check_template(tokenizer, chat_template)
  try:
    out = tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
        chat_template=chat_template, tokenize=True, return_dict=False, **template_kwargs)
  except Exception as e:
    raise TokenizerError(f"chat template failed to render the conversation: {e}") from e
  return _as_int_list(out)


def _as_int_list(out) -> list[int]:
  """Normalises apply_chat_template outputs (list, BatchEncoding/dict, array) to list[int]."""
  if isinstance(out, Mapping) or hasattr(out, "input_ids"):
    out = out["input_ids"]
  if hasattr(out, "tolist"):
    out = out.tolist()
  out = list(out)
  if len(out) == 1 and isinstance(out[0], (list, tuple)):
    out = list(out[0])
  if not all(isinstance(i, int) for i in out):
    raise TokenizerError(f"expected a flat list of token ids, got {type(out[0]).__name__} items")
  return [int(i) for i in out]


def _check_template(tokenizer, chat_template):
  if chat_template is None and not getattr(tokenizer, "chat_template", None):
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    raise TokenizerError(_no_template_message(name))


def _no_template_message(source) -> str:
  return (f"tokenizer {source!r} has no chat template. Add a \"chat_template\" entry to its "
          "tokenizer_config.json (or a chat_template.jinja file next to it), load the bundled "
          "tokenizer with load_tokenizer(\"bundled\"), or pass chat_template=... to render_chat.")


def _looks_like_path(s: str) -> bool:
  """Hub ids are "name" or "org/name"; anything else is meant as a local path."""
  return s.startswith((".", "/", "~")) or s.count("/") > 1 or (os.sep != "/" and os.sep in s)


# ---------------------------------------------------------------------------------------------
# Tool-call parsing.

_BLOCK_RE = re.compile(re.escape(ct.TOOL_CALL_OPEN) + "|" + re.escape(ct.TOOL_CALL_CLOSE))


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], list[str]]:
  """Splits generated assistant text into content and ``<tool_call>`` JSON calls.

  Never drops text: a block whose JSON is malformed, lacks a string "name", or has
  non-object arguments stays in the content verbatim and is also returned as an unparseable
  fragment. An unterminated final ``<tool_call>`` (generation stopped before the closing tag)
  is accepted only if what follows it is one complete, valid call.

  Returns:
    (content, calls, fragments): content is the text outside parsed calls, stripped at both
    ends (so rendering content + calls through the template gives the original text back);
    calls are ``{"name": str, "arguments": dict}``; fragments are the raw unparseable blocks.
  """
  pieces, calls, bad = [], [], []
  pos = 0
  while True:
    start = text.find(ct.TOOL_CALL_OPEN, pos)
    if start < 0:
      pieces.append(text[pos:])
      break
    pieces.append(text[pos:start])
    body_start = start + len(ct.TOOL_CALL_OPEN)
    close = text.find(ct.TOOL_CALL_CLOSE, body_start)
    reopen = text.find(ct.TOOL_CALL_OPEN, body_start)
    if close >= 0 and (reopen < 0 or close < reopen):
      end = close + len(ct.TOOL_CALL_CLOSE)
      call = _decode_call(text[body_start:close])
    else:  # Unterminated: runs to the next opening tag or the end of the text.
      end = reopen if reopen >= 0 else len(text)
      call = _decode_call(text[body_start:end]) if reopen < 0 else None
    if call is None:
      pieces.append(text[start:end])
      bad.append(text[start:end])
    else:
      calls.append(call)
    pos = end
  return "".join(pieces).strip(), calls, bad


def _decode_call(body: str) -> dict[str, Any] | None:
  """One ``{"name": ..., "arguments": {...}}`` object, or None if it is not a valid call."""
  body = body.strip()
  try:
    obj = safe_json.loads(body, what="tool call")
  except InvalidJSONError:
    return None
  if not isinstance(obj, dict):
    return None
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return None
  args = obj.get("arguments", obj.get("parameters", {}))
  if isinstance(args, str):
    try:
      args = safe_json.loads(args, what="tool-call arguments") if args.strip() else {}
    except InvalidJSONError:
      return None
  if args is None:
    args = {}
  if not isinstance(args, dict):
    return None
  return {"name": name, "arguments": args}


# ---------------------------------------------------------------------------------------------
# Special ids.

def _token_id(tokenizer, token: str) -> int | None:
  """Id of `token` if it is a single entry of the vocabulary, else None."""
  vocab = tokenizer.get_vocab()
  return vocab.get(token)


def special_token_ids(tokenizer) -> dict[str, int | None]:
  """Ids of the tokens the sampler and learner need.

  Returns {"eos", "pad", "im_start", "im_end"}. pad falls back to eos when the tokenizer has
  none; im_start / im_end are None for templates that do not use ChatML markers.
  """
  eos = tokenizer.eos_token_id
  if eos is None:
    raise TokenizerError(
        f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no eos token; set "
        "\"eos_token\" in its tokenizer_config.json.")
  pad = tokenizer.pad_token_id
  return {
      "eos": int(eos),
      "pad": int(eos if pad is None else pad),
      "im_start": _token_id(tokenizer, ct.IM_START),
      "im_end": _token_id(tokenizer, ct.IM_END),
  }


def stop_token_ids(tokenizer) -> list[int]:
  """Sorted ids that end a generated assistant turn: eos plus known end-of-turn tokens."""
  ids = {special_token_ids(tokenizer)["eos"]}
  for token in _KNOWN_STOP_TOKENS:
    i = _token_id(tokenizer, token)
    if i is not None:
      ids.add(int(i))
  return sorted(ids)
