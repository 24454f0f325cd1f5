"""The training pipeline on a mixture-of-experts policy (``experiments/configs/demo_tiny_moe.py``:
the ``tiny-moe`` preset, ``trainer.routing_replay``), through the real built-in harness, proxy,
engine, bubblewrap sandbox and verifier: SFT on scripted demonstrations (which carry no
routes), then one RL step whose trajectories carry the sampler's routes and whose learner
replays them; its recorded logprobs equal the learner's (|delta| < 1e-5, fp32)."""

import glob
import json
import os
import subprocess
import sys

import pytest

from legorl_jax.proxy import route_codec
from tests.xla_flags import subprocess_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--config=experiments/configs/demo_tiny_moe.py", "--config.sft.steps=2",
        "--config.sft.num_demos=2", "--config.sft.rows_per_batch=2", "--config.sft.check_demos=0",
        "--config.sft.share_prompt=()", "--config.eval.before_after=False",
        "--config.tasks.num_train=8", "--config.tasks.num_val=2",
        "--config.rollout.tasks_per_step=2", "--config.rollout.samples_per_task=2",
        "--config.rollout.concurrency=4", "--config.trainer.rows_per_batch=4",
        "--config.trainer.micro_batches=2", "--config.sampling.max_tokens=32",
        "--config.harness.max_turns=2", "--config.engine.max_batch=4",
        "--config.checkpoint.every=1", "--config.trainer.steps=1"]


def _lines(path):
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


@pytest.mark.slow
def test_one_rl_step_of_a_moe_policy_replays_the_sampler_routes(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_xla_flags())
  r = subprocess.run([sys.executable, "-m", "experiments.train", f"--workdir={tmp_path}", *ARGS],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
  assert json.load(open(tmp_path / "summary.json"))["policy"] == "preset:tiny-moe"
  rl = [t for t in _lines(tmp_path / "trials.jsonl") if t["phase"] == "rl"]
  assert len(rl) == 4  # 2 tasks x 2 samples
  (train,) = [m for m in _lines(tmp_path / "metrics.jsonl") if m["phase"] == "train"]
  assert train["routes_recorded_frac"] > 0.9  # every token but each segment's last
  assert train["rollout_abs_dlogp_max"] < 1e-5
  # The trajectories on disk carry the routes: [T, L_moe = 4, k = 2], int8.
  paths = glob.glob(str(tmp_path / "rollouts" / "step_00001" / "*" / "trajectory.json"))
  assert paths
  for path in paths:
    for seg in json.load(open(path))["segments"]:
      routes = route_codec.decode(seg["routed_experts"])
      assert routes.shape == (len(seg["token_ids"]), 4, 2) and routes.dtype == "int8"
