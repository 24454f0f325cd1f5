"""The tokenizer of a GGUF file, rebuilt from its metadata as a `transformers` fast tokenizer.

GGUF's ``tokenizer.ggml.model = "gpt2"`` is a byte-level BPE: ``tokens`` (the vocabulary in id
order, in GPT-2's byte-to-unicode alphabet), ``merges`` ("a b" strings, by rank),
``token_type`` (1 normal, 3 control, 4 user-defined, ...) and ``pre`` naming llama.cpp's
pre-tokenizer regex. Control tokens become special added tokens (dropped by
``skip_special_tokens``), user-defined ones plain added tokens.

Chat template: the tokenizer gets the project's ChatML tool template (``chat_template.py``),
not the file's (SmolLM2's has no tools). One change to the file's pre-tokenization keeps the
proxy's prefix invariant: a text piece that starts with a turn header ``ROLE\\n`` (right after
``<|im_start|>``) keeps that header as its own piece, so assistant content starting with
whitespace cannot merge with the header's ``\\n``. Without leading whitespace the ids are the
ones the model was trained on: the file's regex splits ``ROLE`` and ``\\n`` there anyway.
"""

from __future__ import annotations

from typing import Any

from legorl_jax import errors
from legorl_jax.models import chat_template as ct
from legorl_jax.models.gguf_file import GGUFFile, open_gguf, special_token_ids

_GPT2 = None  # ByteLevel's built-in regex is GPT-2's.
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (split digits one by one first, regex, BPE ignore_merges).
PRE_TOKENIZERS = {
    "default": (False, _GPT2, False),
    "gpt2": (False, _GPT2, False),
    "smollm": (True, _GPT2, False),
    "starcoder": (True, _GPT2, False),
    "refact": (True, _GPT2, False),
    "qwen2": (False, _QWEN2, False),
    "llama-bpe": (False, _LLAMA3, True),
}
_HEADER = r"\A(?:system|user|assistant|tool)\n"
CONTROL, USER_DEFINED = 3, 4


def _pre_tokenizer(file: GGUFFile):
  from tokenizers import Regex, pre_tokenizers  # pylint: disable=import-outside-toplevel

  pre = str(file.meta.get("tokenizer.ggml.pre") or "default")
  if pre not in PRE_TOKENIZERS:
    raise errors.TokenizerError(
        f"{file.path.name}: tokenizer.ggml.pre = {pre!r} is not supported; supported: "
        f"{sorted(PRE_TOKENIZERS)}. Pass a Hugging Face tokenizer directory with "
        "--config.model.tokenizer=DIR instead.")
  digits, regex, ignore_merges = PRE_TOKENIZERS[pre]
  add_prefix = bool(file.meta.get("tokenizer.ggml.add_space_prefix", False))
  steps = [pre_tokenizers.Split(Regex(_HEADER), behavior="isolated")]
  if digits:
    steps.append(pre_tokenizers.Digits(individual_digits=True))
  if regex is None:
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=add_prefix, use_regex=True))
  else:
    steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=add_prefix, use_regex=False))
  return pre_tokenizers.Sequence(steps), ignore_merges


def tokenizer_from_gguf(path: Any, *, chat_template: str = ct.CHAT_TEMPLATE):
  """A `transformers` fast tokenizer built from a GGUF file's tokenizer metadata.

  Args:
    path: a .gguf file or an open GGUFFile.
    chat_template: the Jinja chat template (default: the project's ChatML tool template).
  Returns:
    ``transformers.PreTrainedTokenizerFast`` with eos ``<|im_end|>`` when the vocabulary has it
    (else the file's eos), bos / pad from the file.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models  # pylint: disable=import-outside-toplevel
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  file = open_gguf(path)
  m = file.meta
  kind = m.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise errors.TokenizerError(
        f"{file.path.name}: tokenizer.ggml.model = {kind!r} is not supported; only 'gpt2' "
        "(byte-level BPE, as in SmolLM2, Qwen2/3 and Llama 3 files) is rebuilt from GGUF "
        "metadata. Pass a Hugging Face tokenizer directory with --config.model.tokenizer=DIR.")
  tokens = list(m.get("tokenizer.ggml.tokens") or [])
  merges = [tuple(x.split(" ", 1)) for x in (m.get("tokenizer.ggml.merges") or [])]
  types = list(m.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  if not tokens or len(types) != len(tokens):
    raise errors.TokenizerError(f"{file.path.name}: tokenizer.ggml.tokens is missing or its "
                                "token_type list has a different length.")
  vocab = {}
  for i, t in enumerate(tokens):
    vocab.setdefault(t, i)  # a repeated string keeps its first id, as llama.cpp's lookup does
  pre, ignore_merges = _pre_tokenizer(file)
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges,
                             fuse_unk=False, byte_fallback=False))
  tok.pre_tokenizer = pre
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k == CONTROL])
  tok.add_tokens([AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == USER_DEFINED])
  ids = special_token_ids(file)
  names = {k: (tokens[v] if v is not None and 0 <= v < len(tokens) else None)
           for k, v in ids.items()}
  pad = names["pad"] or (ct.ENDOFTEXT if ct.ENDOFTEXT in vocab else None)
  # transformers writes the bos/eos post-processor itself from these two flags.
  return PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=names["bos"], eos_token=names["eos"], pad_token=pad,
      unk_token=None, chat_template=chat_template, clean_up_tokenization_spaces=False,
      add_bos_token=bool(m.get("tokenizer.ggml.add_bos_token")) and names["bos"] is not None,
      add_eos_token=bool(m.get("tokenizer.ggml.add_eos_token")) and names["eos"] is not None,
      model_max_length=int(m.get(f"{file.architecture}.context_length") or 4096))
