"""A real toy run that saves its SFT policy along the way, draws RL tasks by pass rate, replays
demonstrations in RL and is stopped by the KL guard.

``trainer.max_kl`` far below what one step at a high learning rate moves: the run must stop at
RL step 1 with ``KLBoundError`` naming the step, the KL and the flag, after writing the step's
metrics (entropy, KL to the start, the replayed demonstrations' NLL) to ``metrics.jsonl``."""

import json

import pytest

from tests.trainer.test_pipeline import _lines, _train


@pytest.mark.slow
def test_kl_guard_stops_a_run_that_replays_demos(tmp_path):
  r = _train(tmp_path, "--config.trainer.steps=3", "--config.eval.before_after=False",
             "--config.optim.learning_rate=0.05", "--config.trainer.max_kl=1e-9",
             "--config.loss.demo_replay_weight=0.1", "--config.loss.demo_replay_seqs=2",
             "--config.sft.save_at=(2,)", "--config.rollout.sampler=pass_rate")
  assert r.returncode != 0, r.stdout[-2000:]
  assert "KLBoundError" in r.stderr and "RL step 1" in r.stderr and "trainer.max_kl" in r.stderr, \
      r.stderr[-3000:]
  train = [m for m in _lines(tmp_path / "metrics.jsonl") if m["phase"] == "train"]
  assert [m["step"] for m in train] == [1]
  m = train[0]
  assert m["kl_to_start_k3"] > 1e-9 and m["entropy"] > 0
  assert m["demo_replay_sequences"] == 2 and m["loss/demo_nll"] > 0 and m["demo_tokens"] > 0
  assert not (tmp_path / "summary.json").exists()
  # sft.save_at: the policy after SFT step 2 of 3, as a checkpoint the screen can load.
  assert (tmp_path / "sft_checkpoints" / "step_2" / "config.json").exists()
  assert not (tmp_path / "sft_checkpoints" / "step_3").exists()
  # The pass-rate sampler drew step 1's tasks and logged every bug's visits and rate.
  assert m["pool_bugs"] > 0 and m["pool_bugs_visited"] == 2
  (line,) = _lines(tmp_path / "rollouts" / "pass_rate.jsonl")
  assert line["step"] == 1 and sum(b["visits"] for b in line["bugs"].values()) == 2
