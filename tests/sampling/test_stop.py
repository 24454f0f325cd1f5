"""Stop strings cut at the first token boundary whose text contains them."""

from legorl_jax.sampling.stop import as_decode_fn, find_stop


def _text(ids):
  return "".join(f"{t}|" for t in ids)


def _naive(ids, stops):
  for n in range(1, len(ids) + 1):
    text = _text(ids[:n])
    hits = [s for s in stops if s in text]
    if hits:
      return n, min(hits, key=text.find)
  return None


def test_find_stop_matches_naive_scan():
  ids = [12, 345, 6, 78, 90, 1234, 5]
  for stops in (["5|6"], ["78|9"], ["|1234|"], ["nope"], ["0|12", "4|5"], ["6|78", "|6|"]):
    assert find_stop(_text, ids, stops) == _naive(ids, stops), stops


def test_find_stop_spanning_tokens_and_checked_prefix():
  ids = [1, 22, 333, 4444]
  assert find_stop(_text, ids, ["2|33"]) == (3, "2|33")
  assert find_stop(_text, ids, ["2|33"], checked=2) == (3, "2|33")
  assert find_stop(_text, ids, ["2|33"], checked=4) is None


def test_as_decode_fn_accepts_tokenizer_like():
  class Tok:
    def decode(self, ids):
      return "-".join(map(str, ids))

  assert as_decode_fn(Tok())((1, 2)) == "1-2"
  assert as_decode_fn(_text)([3]) == "3|"
  assert as_decode_fn(None) is None
