"""Piecewise cached tokenization against the tokenizer's one-shot encoding."""

import random

from legorl_jax.proxy.pieces import PieceEncoder

_BITS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "user\n", "assistant\n", "\n", "  ",
         " \n", "\t", "hello", " world", "\u00e9t\u00e9", "123", "<tool_call>", '{"a": 1}',
         "\u4e2d", "\r\n", "system", "<|im_", "end|>"]


def _random_text(rnd, n):
  return "".join(rnd.choice(_BITS) for _ in range(n))


def test_pieces_equal_one_shot_encoding(tokenizer):
  enc = PieceEncoder(tokenizer)
  assert enc._split is not None  # the bundled tokenizer supports cutting before its specials
  rnd = random.Random(0)
  texts = [_random_text(rnd, rnd.randint(1, 40)) for _ in range(400)]
  for _ in range(2):  # second pass: every piece comes from the cache
    for t in texts:
      assert enc.encode(t) == tokenizer.encode(t, add_special_tokens=False), repr(t)
  assert enc.hits > 0 and enc.misses > 0


def test_history_is_tokenized_once(tokenizer):
  enc = PieceEncoder(tokenizer)
  turns = [f"<|im_start|>user\nturn {i} " + "word " * 50 + "<|im_end|>\n" for i in range(20)]
  for n in range(1, len(turns) + 1):
    misses = enc.misses
    text = "".join(turns[:n]) + "<|im_start|>assistant\n"
    assert enc.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert enc.misses - misses <= 3  # the new turn (+ its "<|im_end|>\n" and the header)


def test_cache_is_bounded(tokenizer):
  enc = PieceEncoder(tokenizer, max_chars=2000)
  rnd = random.Random(1)
  for i in range(200):
    t = f"<|im_start|>user\n{i} " + _random_text(rnd, 30)
    assert enc.encode(t) == tokenizer.encode(t, add_special_tokens=False)
    assert enc.cached_chars <= 2000
  off = PieceEncoder(tokenizer, max_chars=0)
  assert off.encode("<|im_start|>a<|im_end|>") == tokenizer.encode("<|im_start|>a<|im_end|>",
                                                                    add_special_tokens=False)
  assert off.cached_chars == 0


def test_left_stripping_specials_are_not_cut_before(tokenizer):
  """A special token with lstrip eats the spaces before it: text is not cut there."""
  from transformers import AutoTokenizer
  from tokenizers import AddedToken
  tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
  tok.add_special_tokens({"additional_special_tokens": [AddedToken("<|eat|>", lstrip=True,
                                                                   normalized=False)]})
  enc = PieceEncoder(tok)
  assert "<|eat|>" not in enc._boundary_tokens() and "<|im_start|>" in enc._boundary_tokens()
  text = "<|im_start|>user\nhi   <|eat|> there<|im_end|>\n"
  assert enc.encode(text) == tok.encode(text, add_special_tokens=False)
