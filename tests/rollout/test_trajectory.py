"""The typed trajectory against the proxy's own recording: a real session (scripted policy, two
chat turns, a side stream, mixture-of-experts routes) reads into ``Trajectory`` and writes back
to the very dict the recorder produced, through JSON as ``trajectory.json`` holds it; a
malformed recording fails with the field it concerns."""

import asyncio
import json

import pytest

from legorl_jax import errors
from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import ProxyService, openai_chat
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.trainer import batching
from tests.proxy.test_recorder_routes import RoutingBackend


@pytest.fixture(scope="module")
def recording():
  tokenizer = load_tokenizer()
  service = ProxyService(RoutingBackend(tokenizer), tokenizer)
  s = service.sessions.create("typed")
  conv = [{"role": "user", "content": "Fix the bug, please."}]
  for follow in ("Now run the tests.", None):
    reply = asyncio.run(service.complete(openai_chat.parse({"model": "m", "messages": conv}), s))
    conv.append({"role": "assistant", "content": reply.content})
    if follow:
      conv.append({"role": "user", "content": follow})
  # a side stream's call (a harness's title request): recorded, never trained on
  title = openai_chat.parse({"model": "m", "messages": [
      {"role": "system", "content": "Generate a title."}, {"role": "user", "content": "hi"}]})
  asyncio.run(service.complete(title, s))
  return json.loads(json.dumps(service.sessions.pop("typed").trajectory()))


def test_round_trip_is_the_recorders_dict(recording):
  traj = Trajectory.from_json(recording)
  assert traj.to_json() == recording
  assert len(traj.calls) == 3 and [c.stream for c in traj.calls] == ["main", "main", "title"]
  assert len(traj.main_calls) == 2 and traj.streams == sorted(recording["streams"])
  (seg,) = traj.segments
  assert seg.train and seg.routed_experts is not None and seg.sampled == sum(seg.loss_mask) > 0
  assert [s.stream for s in traj.side_segments] == ["title"] and not traj.side_segments[0].train
  # the learner's view: the typed segment's tokens and routes, nothing of the side stream
  (ts,) = batching.sequences_from_trajectory(traj, advantage=0.5, trial_id="t")
  assert ts.token_ids == recording["segments"][0]["token_ids"] and ts.routes.shape[0] == len(ts.token_ids)
  assert Trajectory.from_json(traj.demonstration_json()).segments == traj.segments


def test_prefilled_counts_what_the_cache_did_not_hold(recording):
  for c, raw in zip(Trajectory.from_json(recording).calls, recording["calls"]):
    assert c.prefilled == max(0, len(raw["prompt_ids"]) - 1 - raw["reused_prefix_len"])


@pytest.mark.parametrize("break_it, words", [
    (lambda d: d["segments"][0].pop("loss_mask"), ["segment 0", "missing", "loss_mask"]),
    (lambda d: d["segments"][0]["logprobs"].pop(), ["segment 0", "align"]),
    (lambda d: d["calls"][1].update(prompt="x"), ["call 1", "unknown", "prompt"]),
    (lambda d: d.update(segmentz=[]), ["unknown", "segmentz"]),
])
def test_a_malformed_recording_names_its_field(recording, break_it, words):
  d = json.loads(json.dumps(recording))
  break_it(d)
  with pytest.raises(errors.RolloutError) as e:
    Trajectory.from_json(d, "trial t7")
  assert "trial t7" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_not_an_object():
  with pytest.raises(errors.RolloutError, match="JSON object"):
    Trajectory.from_json([1, 2], "trajectory.json")
