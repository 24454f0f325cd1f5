"""``test_pipeline_kill.py``'s kill-and-resume with a mixture-of-experts policy, after an SFT
phase. It also holds what ``tests/trainer/test_pipeline_moe.py`` held (a run of its own until
2026-12-04): SFT on a MoE policy, routes recorded by the engine, stored with the trajectories
and replayed by the learner.
"""

import glob
import json

import pytest

from legorl_jax.proxy import route_codec
from tests.reliability import killkit

# The MoE runs also learn from scripted demonstrations first (SFT rows carry no routes), then
# update in two micro-batches with the sampler's routes replayed. Two samples per task, not the
# dense case's four: at the suite's -O0 compiles this policy's update runs slowly (~1.4 s per
# row), and two samples per group cover every check here.
MOE_EXTRA = ("--config.sft.steps=2", "--config.sft.num_demos=2", "--config.sft.rows_per_batch=2",
             "--config.sft.check_demos=0", "--config.sft.share_prompt=()",
             "--config.rollout.samples_per_task=2", "--config.trainer.rows_per_batch=4",
             "--config.trainer.micro_batches=2")


def _lines(path):
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


@pytest.mark.slow
def test_moe_pipeline_killed_mid_step_resumes_to_the_uninterrupted_result(tmp_path):
  """The pipeline kill-and-resume test with a mixture-of-experts policy (``demo_tiny_moe.py``:
  the engine records routes, the learner replays them), after an SFT phase: the resumed run's
  parameters, metrics and sampled tokens equal the uninterrupted run's. In the uninterrupted
  run, every RL step's trajectories carry the sampler's routes (on disk: ``[T, L_moe, k]``
  int8) and the learner, replaying them, gives the recorded logprobs (|delta| < 1e-5, fp32).

  At the suite's LLVM -O0 compiles, not XLA's default level as the dense case: at the default
  level this policy's two runs sampled different tokens already in step 1, before any kill (2 of
  8 runs, 2026-12-04; the dense case passed 6 of 6), so its sampling there depends on timing,
  i.e. on which rows share a batch. The cause is not found yet: ``moe.blocked_experts`` alone gives a token the same output
  bit for bit in 130 random batches of 1 to 128 tokens at both levels."""
  o = killkit.pipeline_kill(str(tmp_path), steps=2, kill_after=1,
                             config="experiments/configs/demo_tiny_moe.py",
                             xla_default=False, extra=MOE_EXTRA)
  assert o.ok, f"{o.detail}; left running: {o.leaked}"
  assert o.lost == 0
  assert len(o.final) == 2 * 4  # 2 steps of 2 tasks x 2 samples, once
  full = tmp_path / "full"
  summary = json.load(open(full / "summary.json"))
  assert summary["policy"] == "preset:tiny-moe" and summary["wall_s_by_phase"]["sft"] > 0
  train = [m for m in _lines(full / "metrics.jsonl") if m["phase"] == "train"]
  assert [m["step"] for m in train] == [1, 2]
  for m in train:
    assert m["routes_recorded_frac"] > 0.9  # every token but each segment's last
    assert m["rollout_abs_dlogp_max"] < 1e-5
  for step in (1, 2):
    paths = glob.glob(str(full / "rollouts" / f"step_{step:05d}" / "*" / "trajectory.json"))
    assert paths
    for path in paths:
      for seg in json.load(open(path))["segments"]:
        routes = route_codec.decode(seg["routed_experts"])
        assert routes.shape == (len(seg["token_ids"]), 4, 2) and routes.dtype == "int8"
