"""The recorder keeps a mixture-of-experts policy's routes aligned with each segment's tokens:
the first routes recorded for a token stay, later calls only fill in missing ones (-1), and the
trajectory carries them compactly (``route_codec``). Dense completions add no key."""

import asyncio
import dataclasses
import json

import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.proxy import ProxyService, ScriptedBackend, openai_chat, route_codec
from tests.proxy.conftest import scripted_reply

L_MOE, K = 3, 2


def fake_routes(call: int, n: int) -> np.ndarray:
  """What an engine would return for a call: a route per position, -1 on the last (unfed)."""
  pos = np.arange(n)[:, None, None]
  r = (call * 5 + pos + np.arange(L_MOE)[None, :, None] + np.arange(K)) % 16
  r[-1] = -1
  return r.astype(np.int8)


class RoutingBackend:
  """The scripted policy, its completions carrying ``fake_routes`` of their call number."""

  def __init__(self, tokenizer):
    self.inner = ScriptedBackend(tokenizer, scripted_reply, max_len=1024)
    self.max_len, self.calls = self.inner.max_len, 0

  async def generate(self, prompt_ids, sampling, **kw):
    c = await self.inner.generate(prompt_ids, sampling, **kw)
    self.calls += 1
    return dataclasses.replace(c, routes=fake_routes(self.calls, len(prompt_ids) + len(c.token_ids)))


def _call(service, session, messages, **kw):
  req = openai_chat.parse(dict({"model": "m", "messages": messages}, **kw))
  reply = asyncio.run(service.complete(req, session))
  return {"role": "assistant", "content": reply.content}


def test_segment_routes_follow_tokens_and_first_recorded_wins(tokenizer):
  service = ProxyService(RoutingBackend(tokenizer), tokenizer)
  s = service.sessions.create("moe")
  conv = [{"role": "user", "content": "hello"}]
  conv += [_call(service, s, conv), {"role": "user", "content": "again"}]
  _call(service, s, conv)
  (seg,) = s.segments()
  first, second = s.calls
  n1 = len(first.prompt_ids) + len(first.token_ids)
  assert seg.routes.shape == (len(seg.token_ids), L_MOE, K)
  r1 = fake_routes(1, n1)
  np.testing.assert_array_equal(seg.routes[:n1 - 1], r1[:-1])  # call 1's own routes stay
  # call 1's last sampled token had none; call 2's prefill computed it: filled in
  r2 = fake_routes(2, len(second.prompt_ids) + len(second.token_ids))
  np.testing.assert_array_equal(seg.routes[n1 - 1], r2[n1 - 1])
  np.testing.assert_array_equal(seg.routes[n1:], r2[n1:])  # new prompt and sampled tokens
  assert (seg.routes[-1] == -1).all() and (seg.routes[:-1] >= 0).all()
  # The trajectory (JSON, as trajectory.json holds it) decodes back to the same array.
  (traj_seg,) = json.loads(json.dumps(s.trajectory()))["segments"]
  np.testing.assert_array_equal(route_codec.decode(traj_seg["routed_experts"]), seg.routes)


def test_dense_segments_have_no_routes_key(tokenizer):
  service = ProxyService(ScriptedBackend(tokenizer, scripted_reply, max_len=1024), tokenizer)
  s = service.sessions.create("dense")
  _call(service, s, [{"role": "user", "content": "hello"}])
  (seg,) = s.trajectory()["segments"]
  assert "routed_experts" not in seg and s.segments()[0].routes is None


def test_routes_of_the_wrong_length_are_refused(tokenizer):
  class Short(RoutingBackend):
    async def generate(self, prompt_ids, sampling, **kw):
      c = await super().generate(prompt_ids, sampling, **kw)
      return dataclasses.replace(c, routes=c.routes[:-1])

  service = ProxyService(Short(tokenizer), tokenizer)
  s = service.sessions.create("short")
  with pytest.raises(errors.ProxyError, match="routes for") as e:
    _call(service, s, [{"role": "user", "content": "hello"}])
  assert e.value.status == 500 and not s.calls


def test_route_codec_round_trip_and_malformed_records():
  for dtype in (np.int8, np.int16):
    a = np.arange(-1, 23).astype(dtype).reshape(4, 3, 2)
    b = route_codec.decode(json.loads(json.dumps(route_codec.encode(a))))
    assert b.dtype == dtype and np.array_equal(a, b)
  good = route_codec.encode(np.zeros((2, 1, 2), np.int8))
  for bad in ([1, 2], dict(good, dtype="float32"), dict(good, shape=[2, 2]),
              dict(good, shape=[3, 1, 2]), dict(good, data="***"), dict(good, extra=1)):
    with pytest.raises(errors.RolloutError, match="seg 3"):
      route_codec.decode(bad, where="seg 3")
