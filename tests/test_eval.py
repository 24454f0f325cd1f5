"""The evaluation entry point, run as users run it (a subprocess with config overrides)."""

import json
import os
import subprocess
import sys

import pytest

from experiments.eval import load_tasks
from legorl_jax import errors
from legorl_jax.harnesses import install
from legorl_jax.rewards import status as st
from legorl_jax.tasks.jsonl import write_tasks_jsonl
from legorl_jax.taskgen.synthetic import generate_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _eval(workdir, *overrides, timeout=600):
  cmd = [sys.executable, "-m", "experiments.eval", "--config=experiments/configs/eval.py",
         f"--workdir={workdir}", *overrides]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  printed = json.loads(r.stdout.strip().splitlines()[-1])
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "trials.jsonl")) as f:
    lines = [json.loads(l) for l in f]
  assert printed == summary
  return summary, lines


def test_load_tasks_sources(tmp_path):
  syn = load_tasks("synthetic:3", seed=1)
  assert len(syn) == 3 and syn == generate_tasks(3, seed=1, difficulty="easy", split="validation")
  path = str(tmp_path / "tasks.jsonl")
  write_tasks_jsonl(path, syn)
  assert [t.id for t in load_tasks(path, limit=2)] == [t.id for t in syn[:2]]
  with pytest.raises(errors.ConfigError, match="neither synthetic"):
    load_tasks(str(tmp_path / "missing"))
  with pytest.raises(errors.ConfigError, match="synthetic:N"):
    load_tasks("synthetic:many")


@pytest.mark.slow
def test_scripted_mixed_harnesses(tmp_path):
  if not install.is_installed("mini-swe-agent"):
    pytest.skip("mini-swe-agent is not installed: `python -m legorl_jax.harnesses.install all`")
  summary, lines = _eval(str(tmp_path), "--config.harness=builtin:1,mini-swe-agent:1",
                         "--config.policy=scripted", "--config.sandbox=local",
                         "--config.tasks=synthetic:3", "--config.samples_per_task=2",
                         "--config.concurrency=3", "--config.seed=4")
  assert summary["n_trials"] == 6 and summary["solve_rate"] == 1.0
  assert summary["status_counts"] == {"solved": 6}
  assert summary["policy"] == "scripted" and summary["tasks"] == "synthetic:3"
  finals = [l for l in lines if l["final"]]
  assert len(finals) == 6 and {l["harness"] for l in finals} <= {"builtin", "mini-swe-agent"}
  assert sum(h["n_trials"] for h in summary["by_harness"].values()) == 6
  for l in finals:
    assert l["reward"] == 1.0 and l["turns"] >= 2 and l["sampled_tokens"] > 0
    assert os.path.isfile(l["trajectory_path"]) and os.path.isfile(l["log_paths"]["stdout"])
    assert {"harness_s", "verify_s", "total_s"} <= set(l["durations"])
  # two samples of each task share its group
  groups = sorted(l["group"] for l in finals)
  assert groups == [0, 0, 1, 1, 2, 2]


@pytest.mark.slow
def test_tiny_policy_is_fully_accounted(tmp_path):
  summary, lines = _eval(str(tmp_path), "--config.harness=builtin", "--config.policy=tiny",
                         "--config.tasks=synthetic:2", "--config.max_turns=2",
                         "--config.max_tokens=32", "--config.engine.max_len=4096")
  assert summary["n_trials"] == 2 and sum(summary["status_counts"].values()) == 2
  for l in lines:
    st.check(l["status"])
    assert l["status"] != st.SANDBOX_ERROR
  assert summary["sampled_tokens"] > 0
