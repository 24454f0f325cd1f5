"""pass@k against brute-force enumeration; solve statistics; batches from trial results."""

import dataclasses
import itertools
import math

import ml_collections
import numpy as np

from experiments.configs import common
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
  trajectory: dict = None


def _traj(n_prompt, n_sampled):
  ids = list(range(n_prompt + n_sampled))
  return {"segments": [{"token_ids": ids, "loss_mask": [0] * n_prompt + [1] * n_sampled,
                        "logprobs": [0.0] * n_prompt + [-0.5] * n_sampled, "train": True}]}


def test_build_batches_grpo_advantages_and_staleness():
  cfg = common.base_config()
  cfg.rollout.samples_per_task = 2
  cfg.trainer.buckets, cfg.trainer.rows_per_batch, cfg.trainer.max_staleness = (16,), 4, 1
  rs = [R("a", "t0", 0, "solved", 1.0, [3], trajectory=_traj(4, 3)),
        R("b", "t0", 0, "failed", 0.0, [3], trajectory=_traj(4, 2)),
        R("c", "t1", 1, "solved", 1.0, [1], trajectory=_traj(4, 2)),   # 2 versions old: stale
        R("d", "t1", 1, "failed", 0.0, [3], trajectory=_traj(4, 2))]
  batches, m = rl_loop.build_batches(rs, cfg, current_version=3)
  assert m["dropped_stale"] == 1 and m["trials_in_loss"] == 2
  (b,) = batches
  adv = sorted({float(x) for x in b["advantages"][b["segment_ids"] > 0]})
  np.testing.assert_allclose(adv, [-1.0, 1.0], atol=1e-5)  # (r - mean) / std in group t0


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
