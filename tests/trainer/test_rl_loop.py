"""pass@k against brute-force enumeration; solve statistics; batches from trial results."""

import dataclasses
import itertools
import math

import ml_collections
import numpy as np
import pytest

from experiments.configs import common
from legorl_jax import errors
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.trainer import rl_loop


def brute_pass_at_k(n, c, k):
  outcomes = [1] * c + [0] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
  for n in range(1, 7):
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert math.isclose(rl_loop.pass_at_k(n, c, k), brute_pass_at_k(n, c, k))


@dataclasses.dataclass
class R:
  trial_id: str
  task_id: str
  group: int
  status: str
  reward: float
  params_versions: list
  sampled_tokens: int = 3
  trajectory: Trajectory = None


def _traj(n_prompt, n_sampled):
  ids = list(range(n_prompt + n_sampled))
  return Trajectory.from_json(
      {"segments": [{"token_ids": ids, "loss_mask": [0] * n_prompt + [1] * n_sampled,
                     "logprobs": [0.0] * n_prompt + [-0.5] * n_sampled, "train": True}]})


def test_build_batches_grpo_advantages_and_staleness():
  cfg = common.base_config()
  cfg.rollout.samples_per_task = 2
  cfg.trainer.buckets, cfg.trainer.rows_per_batch, cfg.trainer.max_staleness = (16,), 4, 1
  rs = [R("a", "t0", 0, "solved", 1.0, [3], trajectory=_traj(4, 3)),
        R("b", "t0", 0, "failed", 0.0, [3], trajectory=_traj(4, 2)),
        R("c", "t1", 1, "solved", 1.0, [1], trajectory=_traj(4, 2)),   # 2 versions old: stale
        R("d", "t1", 1, "failed", 0.0, [3], trajectory=_traj(4, 2))]
  batches, m = rl_loop.build_batches(rs, cfg, current_version=3)
  # Staleness drops only the stale trial: "d" stays, alone in its group, so advantage 0.
  assert m["dropped_stale"] == 1 and m["trials_in_loss"] == 3
  (b,) = batches
  adv = sorted({float(x) for x in b["advantages"][b["segment_ids"] > 0]})
  np.testing.assert_allclose(adv, [-1.0, 0.0, 1.0], atol=1e-5)  # (r - mean) / std in group t0


def test_group_masking_follows_the_rollout_config_only():
  """A sandbox error masks its whole group by default; with rollout.mask_broken_groups=False the
  group's other trials stay, with their baseline computed from the valid ones alone."""
  def run(mask_groups):
    cfg = common.base_config()
    cfg.rollout.samples_per_task = 3
    cfg.rollout.mask_broken_groups = mask_groups
    cfg.trainer.buckets, cfg.trainer.rows_per_batch = (16,), 4
    rs = [R("a", "t0", 0, "solved", 1.0, [0], trajectory=_traj(4, 3)),
          R("b", "t0", 0, "failed", 0.0, [0], trajectory=_traj(4, 2)),
          R("c", "t0", 0, "sandbox_error", 0.0, [0], trajectory=_traj(4, 2))]
    return rl_loop.build_batches(rs, cfg, current_version=0)
  batches, m = run(True)
  assert batches == [] and m["trials_in_loss"] == 0 and m["dropped_group_masked"] == 2
  (b,), m = run(False)
  assert m["trials_in_loss"] == 2 and "dropped_group_masked" not in m
  adv = sorted({float(x) for x in b["advantages"][b["segment_ids"] > 0]})
  np.testing.assert_allclose(adv, [-1.0, 1.0], atol=1e-5)  # mean and std of a and b only
  cfg = common.base_config()
  cfg.advantage.kwargs = {"mask_broken_groups": False}
  with pytest.raises(errors.ConfigError, match="rollout.mask_broken_groups"):
    rl_loop.build_batches([], cfg, current_version=0)


def test_solve_stats_excludes_infrastructure():
  rs = [R("a", "t0", 0, "solved", 1.0, [0]), R("b", "t0", 0, "sandbox_error", 0.0, [0]),
        R("c", "t1", 1, "failed", 0.0, [0]), R("d", "t1", 1, "solved", 1.0, [0])]
  s = rl_loop.solve_stats(rs, k_values=(1, 2))
  assert s["n_trials"] == 3 and math.isclose(s["solve_rate"], 2 / 3)
  assert math.isclose(s["pass@2"], 1.0)


def test_interrupted_step_is_set_aside_and_every_trial_recorded(tmp_path):
  """A step directory left by a killed run: finished attempts keep their record, trial dirs
  without one become ``harness_error`` records, a half-written last line is skipped, and a
  second interruption of the same step gets its own directory."""
  import json
  import os
  import types

  tasks = [types.SimpleNamespace(id="synth/a"), types.SimpleNamespace(id="synth/b")]

  def cut_step(done, running):
    step = tmp_path / "step_00002"
    step.mkdir()
    for t in done + running:
      (step / t).mkdir()
    lines = [json.dumps({"trial_id": t, "task_id": "synth/a", "status": "failed", "final": True})
             for t in done]
    (step / "trials.jsonl").write_text("\n".join(lines) + '\n{"trial_id": "synth_b.x')
    return str(step)

  step = cut_step(["synth_a.01", "synth_a.02"], ["synth_b.03"])
  recs = rl_loop.interrupted_records(step, tasks)
  assert not os.path.exists(step) and os.path.isdir(step + ".interrupted")
  assert [(r["trial_id"], r["task_id"], r["status"]) for r in recs] == [
      ("synth_a.01", "synth/a", "failed"), ("synth_a.02", "synth/a", "failed"),
      ("synth_b.03", "synth/b", "harness_error")]
  assert all(r["interrupted"] and r["dir"] == step + ".interrupted" for r in recs)
  assert recs[2]["reward"] == 0.0 and not recs[2]["final"]

  step = cut_step([], ["synth_a.04"])
  recs = rl_loop.interrupted_records(step, tasks)
  assert [r["trial_id"] for r in recs] == ["synth_a.04"]
  assert recs[0]["dir"] == step + ".interrupted.2"


def test_trial_seeds_differ_per_step_task_and_sample():
  seeds = {rl_loop.trial_seed(0, step, g, f"t{g}", s)
           for step in (1, 2) for g in range(3) for s in range(4)}
  assert len(seeds) == 24
  assert rl_loop.trial_seed(0, 1, 0, "t0", 0) != rl_loop.trial_seed(1, 1, 0, "t0", 0)


def test_build_batches_shares_each_groups_prompt():
  """With trainer.share_prompt a group's samples become branches of one row behind their
  prompt; a trajectory too long for a branch goes to a plain row; advantages stay per sample."""
  from legorl_jax.trainer import batching
  cfg = common.base_config()
  cfg.rollout.samples_per_task = 3
  cfg.trainer.buckets, cfg.trainer.rows_per_batch, cfg.trainer.micro_batches = (32,), 2, 1
  cfg.trainer.share_prompt = (8, 6, 3, 2)
  traj = lambda k: Trajectory.from_json(
      {"segments": [{"token_ids": [5] * 6 + list(range(10 * k, 10 * k + 3 + k)),
                     "loss_mask": [0] * 6 + [1] * (3 + k),
                     "logprobs": [0.0] * 6 + [-0.5] * (3 + k), "train": True}]})
  rs = [R(f"a{k}", "t0", 0, "solved" if k else "failed", float(k > 0), [3], trajectory=traj(k))
        for k in range(3)]
  rs[2].trajectory.segments[0].token_ids[-1] = 999  # still fits: 1 + 5 tokens
  rs += [R(f"b{k}", "t1", 1, "solved" if k else "failed", float(k > 0), [3],
           trajectory=_traj(4, 12 if k == 0 else 3)) for k in range(3)]
  batches, m = rl_loop.build_batches(rs, cfg, current_version=3)
  grouped = [b for b in batches if batching.LAYOUT_KEY in b]
  plain = [b for b in batches if batching.LAYOUT_KEY not in b]
  assert len(grouped) == 1 and len(plain) == 1
  assert m["batch_sequences"] == 6 and m["batch_shared_sequences"] == 5
  g = grouped[0]
  assert g["input_ids"].shape == (2, 8 + 3 * 6)
  # the long trajectory of group t1 is alone in the plain row, with its own advantage
  (row,) = np.where((plain[0]["segment_ids"] > 0).any(1))[0]
  assert plain[0]["loss_mask"][row].sum() == 12
  advs = []
  for r in range(2):
    for j in range(3):
      sl = slice(8 + 6 * j, 8 + 6 * (j + 1))
      live = g["segment_ids"][r, sl] > 0
      if live.any():
        assert len(set(g["advantages"][r, sl][live])) == 1
        advs.append(round(float(g["advantages"][r, sl][live][0]), 4))
  # group rewards (0, 1, 1) -> GRPO advantages (-1.414, 0.707, 0.707); t1's failed sample is
  # the long one, in the plain row
  assert sorted(advs) == [-1.4142, 0.7071, 0.7071, 0.7071, 0.7071]
  np.testing.assert_allclose(plain[0]["advantages"][row][plain[0]["segment_ids"][row] > 0], -1.4142, atol=1e-4)


def test_bad_share_prompt_names_the_key():
  from legorl_jax import errors
  from legorl_jax.trainer import config_check
  cfg = common.base_config()
  cfg.trainer.share_prompt = (8, 6, 1, 2)
  with pytest.raises(errors.ConfigError, match="trainer.share_prompt"):
    config_check.validate(cfg)
