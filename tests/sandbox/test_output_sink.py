"""OutputSink: head up to the limit, a note of what was dropped, the exact tail; against a
reference built from the whole stream."""

import random

import pytest

from legorl_jax.sandbox.base import OutputSink


def _reference(data: bytes, limit: int, tail: int) -> bytes:
  if len(data) <= limit:
    return data
  rest = data[limit:]
  kept = rest[-tail:]
  return data[:limit] + f"\n[legorl: {len(rest) - len(kept)} bytes of output dropped]\n".encode() + kept


@pytest.mark.parametrize("to_file", [False, True])
@pytest.mark.parametrize("size,limit,tail", [(0, 10, 4), (10, 10, 4), (11, 10, 4), (5000, 100, 64),
                                             (5000, 0, 16), (300, 100, 1000)])
def test_matches_reference(tmp_path, to_file, size, limit, tail):
  rng = random.Random(size * 31 + limit)
  data = bytes(rng.randrange(256) for _ in range(size))
  path = str(tmp_path / "out") if to_file else None
  sink = OutputSink(path, limit, tail=tail)
  i = 0
  while i < len(data):  # uneven chunks, as pipes deliver them
    n = rng.randint(1, 97)
    sink.write(data[i:i + n])
    i += n
  sink.close()
  sink.close()  # idempotent
  got = open(path, "rb").read() if to_file else sink.value()
  assert got == _reference(data, limit, tail)
  if to_file:
    assert sink.value() == b""
