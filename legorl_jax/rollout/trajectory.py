"""A trial's recording as typed values: what the rollout layer hands to the learner.

The proxy's ``Session.trajectory()`` is the wire form (JSON, also served over HTTP and written
to ``trajectory.json``); ``Trajectory.from_json`` checks it once, at the rollout boundary, so
batching, SFT and the RL loop read named fields instead of string keys, and a malformed or
truncated recording fails there with the field it lacks. ``to_json`` gives the wire form back
unchanged (``from_json(d).to_json() == d`` for every recording the proxy writes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from legorl_jax import errors


@dataclasses.dataclass
class Segment:
  """One token stream the learner may train on: the prompt and sampled tokens of one or more
  calls, in order. ``loss_mask[i]`` is 1 exactly where ``token_ids[i]`` was sampled, and
  ``logprobs[i]`` the sampler's logprob there (0 elsewhere); ``train``: whether the stream is a
  train stream (side streams, e.g. a harness's title calls, are kept but not trained on);
  ``calls``: indices into ``Trajectory.calls``; ``routed_experts``: a mixture-of-experts
  policy's routes, ``route_codec.encode``'s form, or None."""

  token_ids: list[int]
  loss_mask: list[int]
  logprobs: list[float]
  id: int = 0
  stream: str = "main"
  train: bool = True
  reason: str = ""
  calls: list[int] = dataclasses.field(default_factory=list)
  temperatures: list[float] = dataclasses.field(default_factory=list)
  params_versions: list[int] = dataclasses.field(default_factory=list)
  routed_experts: dict[str, Any] | None = None

  @property
  def sampled(self) -> int:
    return sum(1 for m in self.loss_mask if m)

  @classmethod
  def from_json(cls, d: Mapping[str, Any], where: str) -> "Segment":
    _check_fields(cls, d, where, required=("token_ids", "loss_mask", "logprobs"))
    seg = cls(**dict(d))
    if not len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs):
      raise errors.RolloutError(
          f"{where}: {len(seg.token_ids)} token_ids, {len(seg.loss_mask)} loss_mask and "
          f"{len(seg.logprobs)} logprobs; a segment's three lists align token by token. The "
          f"recording is corrupt: rerun the trial.")
    return seg

  def to_json(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    if d["routed_experts"] is None:
      d.pop("routed_experts")
    return d


@dataclasses.dataclass
class Call:
  """One LLM call the harness made: its prompt and sampled ids, where its sample starts in its
  segment (``sample_offset``), the sampling settings, the parameter version that served it,
  how much of its prompt the engine's prefix cache held (``reused_prefix_len``) and its timings."""

  prompt_ids: list[int]
  token_ids: list[int]
  logprobs: list[float]
  index: int = 0
  api: str = ""
  stream: str = "main"
  segment: int = 0
  sample_offset: int = 0
  new_segment: str | None = None
  finish_reason: str = ""
  reply_finish_reason: str = ""
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_tokens: int = 0
  params_version: int = 0
  reused_prefix_len: int = 0
  spliced_messages: int = 0
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  time: float = 0.0

  @property
  def prefilled(self) -> int:
    """Prompt tokens the engine prefilled: all but the cached ones and the last, which the
    first decode step feeds."""
    return max(0, len(self.prompt_ids) - 1 - self.reused_prefix_len)

  @classmethod
  def from_json(cls, d: Mapping[str, Any], where: str) -> "Call":
    _check_fields(cls, d, where, required=("prompt_ids", "token_ids", "logprobs"))
    return cls(**dict(d))

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class Trajectory:
  """One proxy session's recording: train ``segments``, ``side_segments`` (non-train streams),
  the stream names seen, and every ``call`` in order. A demonstration file
  (``demos.jsonl``) keeps only ``segments``; the rest default to empty."""

  segments: list[Segment] = dataclasses.field(default_factory=list)
  side_segments: list[Segment] = dataclasses.field(default_factory=list)
  calls: list[Call] = dataclasses.field(default_factory=list)
  streams: list[str] = dataclasses.field(default_factory=list)
  session_id: str = ""

  @property
  def main_calls(self) -> list[Call]:
    return [c for c in self.calls if c.stream == "main"]

  @classmethod
  def from_json(cls, d: Mapping[str, Any], where: str = "trajectory") -> "Trajectory":
    """The typed form of a ``Session.trajectory()`` dict (or a ``demos.jsonl`` line); raises
    ``RolloutError`` naming the field that is missing, unknown or misaligned."""
    if not isinstance(d, Mapping):
      raise errors.RolloutError(f"{where}: a trajectory is a JSON object; got {type(d).__name__}.")
    _check_fields(cls, d, where, required=())
    return cls(
        segments=[Segment.from_json(s, f"{where} segment {i}")
                  for i, s in enumerate(d.get("segments", ()))],
        side_segments=[Segment.from_json(s, f"{where} side segment {i}")
                       for i, s in enumerate(d.get("side_segments", ()))],
        calls=[Call.from_json(c, f"{where} call {i}") for i, c in enumerate(d.get("calls", ()))],
        streams=list(d.get("streams", ())), session_id=str(d.get("session_id", "")))

  def to_json(self) -> dict[str, Any]:
    return {"session_id": self.session_id,
            "segments": [s.to_json() for s in self.segments],
            "side_segments": [s.to_json() for s in self.side_segments],
            "streams": list(self.streams),
            "calls": [c.to_json() for c in self.calls]}

  def demonstration_json(self) -> dict[str, Any]:
    """The ``demos.jsonl`` line: the train segments, all SFT needs."""
    return {"segments": [s.to_json() for s in self.segments]}


def _check_fields(cls, d: Mapping[str, Any], where: str, required: tuple[str, ...]):
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise errors.RolloutError(
        f"{where}: unknown field(s) {unknown}; a {cls.__name__} has {sorted(names)}. The file "
        f"was written by another version of legorl_jax, or is not a trajectory.")
  missing = [k for k in required if k not in d]
  if missing:
    raise errors.RolloutError(f"{where}: missing field(s) {missing}; the recording is truncated "
                              f"or not a trajectory.")
