"""The whole training run at toy scale, through the real built-in harness, proxy, engine,
bubblewrap sandbox and verifier: every trial accounted for, summary fields present, resume."""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import demo_tiny
from legorl_jax.utils import cpu_time
from tests.xla_flags import subprocess_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = [*demo_tiny.SMALL_RUN, "--config.checkpoint.every=1"]


def _train(workdir, *extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_xla_flags())
  return subprocess.run([sys.executable, "-m", "experiments.train", f"--workdir={workdir}",
                         "--config=experiments/configs/demo_tiny.py", *SMALL, *extra],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)


def _lines(path):
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("run")
  r = _train(workdir, "--config.trainer.steps=1", "--config.tasks.also_held_out=('templates',)")
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
  return workdir, r


@pytest.mark.slow
def test_summary_and_accounting(run):
  workdir, r = run
  summary = json.load(open(workdir / "summary.json"))
  for key in ("val_solve_rate_before_rl", "val_solve_rate_after_rl", "val_greedy_solve_rate_before_rl",
              "val_greedy_solve_rate_after_rl", "val_pass@2_before_rl", "val_pass@2_after_rl",
              "sft_demos", "rl_steps", "val_templates_solve_rate_before_rl",
              "val_templates_greedy_solve_rate_after_rl", "val_templates_pass@2_after_rl"):
    assert key in summary, key
  assert summary["policy"] == "preset:tiny" and summary["trainable"] == "all"
  assert summary["val_templates_tasks"] == 2
  phase_s = summary["wall_s_by_phase"]
  assert set(phase_s) == {"setup", "sft_demos", "sft", "eval_before", "rl", "eval_after"}, phase_s
  assert all(v > 0 for v in phase_s.values()) and sum(phase_s.values()) <= summary["wall_s"]
  # One process ran it all: the whole run's phase seconds are this process's.
  assert summary["wall_s_by_phase_all_runs"] == pytest.approx(phase_s, abs=1e-6)
  assert summary["sft_demos"] == 4  # the scripted policy solves every demo task (+2 held out)
  # The RL phase's CPU (this process and its reaped trial processes) fits in its wall time x cores.
  assert 0 < summary["rl_cpu_s"] <= summary["rl_s"] * cpu_time.usable_cores() * 1.05
  assert 0.0 <= summary["sft_check_greedy_exact"] <= 1.0 and summary["sft_check_nll"] > 0
  trials = _lines(workdir / "trials.jsonl")
  phases = {}
  for t in trials:
    phases[t["phase"]] = phases.get(t["phase"], 0) + 1
    assert t["status"] in ("solved", "failed", "timeout", "overlong", "reward_hack", "harness_error",
                           "sandbox_error", "verifier_error")
  # 2 val tasks x (2 samples + 1 greedy) before and after, per held-out set; 2 tasks x 2
  # samples in RL.
  assert phases == {"eval_before_rl": 6, "rl": 4, "eval_after_rl": 6, "eval_before_rl_templates": 6,
                    "eval_after_rl_templates": 6}, phases
  metrics = _lines(workdir / "metrics.jsonl")
  train = [m for m in metrics if m["phase"] == "train"]
  assert len(train) == 1 and "trials_per_hour" in train[0] and "params_version" in train[0]
  # The step's profile (trainer.step_profile): cores busy per part, the engine's busy share, and
  # the rollout's CPU by who used it: the engine's device thread and the trials' processes ran.
  m = train[0]
  for part in ("rollout", "update", "step"):
    assert 0 < m[f"cores_busy_{part}"] <= cpu_time.usable_cores() * 1.05, part
  assert 0 < m["engine_busy_frac"] <= 1.0 and 0 < m["engine_live_row_frac"] <= 1.0
  assert m["rollout_cpu/legorl-sampler"] > 0 and m["rollout_cpu/children"] > 0
  assert m["engine_prefill_s"] + m["engine_decode_s"] <= m["rollout_wall_s"] * 1.01
  assert os.path.exists(workdir / "curves.svg")
  assert "held-out solve rate" in r.stdout


@pytest.mark.slow
def test_report_rebuilds_the_summary_figures_from_the_records(run):
  """``experiments.report`` recomputes every held-out figure from ``trials.jsonl``; on a real
  run they equal what the pipeline computed in-process and wrote to ``summary.json``."""
  from legorl_jax.trainer import run_report
  workdir, _ = run
  summary = json.load(open(workdir / "summary.json"))
  rows = run_report.evaluation_rows(run_report.evaluations(_lines(workdir / "trials.jsonl"), 2), 2)
  got = {(r["set"], r["step"]): r for r in rows}
  assert sorted(got) == [("main", 0), ("main", 1), ("templates", 0), ("templates", 1)]
  for (name, step), r in got.items():
    pre, when = ("val_" if name == "main" else f"val_{name}_"), ("before" if step == 0 else "after")
    for figure in ("solve_rate", "solve_rate_se", "greedy_solve_rate", "pass@2", "n_tasks_mixed"):
      assert r[figure] == pytest.approx(summary[f"{pre}{figure}_{when}_rl"]), (name, step, figure)
    if step:
      assert r["delta"] == pytest.approx(summary[f"{pre}solve_rate_delta_rl"])
  assert run_report.step_rows(_lines(workdir / "metrics.jsonl"))[0]["step"] == 1
  out = subprocess.run([sys.executable, "-m", "experiments.report", f"--workdir={workdir}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "| templates | 1 |" in out.stdout, out.stderr[-2000:]


@pytest.mark.slow
def test_resume_continues_from_the_checkpoint(run):
  workdir, _ = run
  r = _train(workdir, "--config.trainer.steps=2")
  assert r.returncode == 0, r.stderr[-5000:]
  assert "Resumed" in r.stdout and "phase rl, RL step 1" in r.stdout
  trials = _lines(workdir / "trials.jsonl")
  assert sum(t["phase"] == "rl" and t["step"] == 2 for t in trials) == 4
  assert not any(t["phase"] == "rl" and t["step"] == 1 and t["trial_id"] in
                 {x["trial_id"] for x in trials if x.get("step") == 2} for t in trials)
  assert json.load(open(workdir / "summary.json"))["rl_steps"] == 2


@pytest.mark.slow
def test_evaluations_of_one_policy_are_paired(tmp_path):
  """Two evaluations of the same policy sample the same tokens trial for trial (each sample's
  proxy session is seeded from the run seed, task and sample index), so the before/after-RL
  difference is not sampling noise between two independent draws."""
  from experiments.configs import demo_tiny as demo
  from legorl_jax.harnesses import registry
  from legorl_jax.models import create_model, get_preset
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import pipeline
  from legorl_jax.trainer.policy_service import PolicyService

  cfg = demo.get_config()
  cfg.tasks.num_val, cfg.eval.samples, cfg.eval.greedy = 2, 2, False
  cfg.sampling.max_tokens, cfg.harness.max_turns, cfg.engine.max_batch = 24, 1, 4
  tasks = pipeline.held_out_tasks(cfg)
  service = PolicyService(create_model(get_preset("tiny"), seed=0), tok_lib.load_tokenizer(), cfg,
                          str(tmp_path / "sockets"))
  trial_cfg = TrialConfig(harness_timeout_s=60.0, max_turns=1, sandbox=SandboxConfig(backend="local"))
  try:
    sampled = []
    for name in ("first", "second"):
      trials = tmp_path / f"{name}.jsonl"
      pipeline.evaluate(service, tasks, registry.get_adapter("builtin"), trial_cfg, cfg,
                        str(tmp_path / name), trials_path=str(trials))
      seen, by_sample = {}, {}
      for r in _lines(trials):  # job order: each task's samples 0..n-1
        k = seen[r["task_id"]] = seen.get(r["task_id"], -1) + 1
        by_sample[(r["task_id"], k)] = _sampled_ids(r["trajectory_path"])
      sampled.append(by_sample)
  finally:
    service.close()
  assert len(sampled[0]) == 4 and sampled[0] == sampled[1]
  assert len({tuple(v) for v in sampled[0].values()}) > 1  # samples differ from one another


def _sampled_ids(trajectory_path):
  with open(trajectory_path) as f:
    traj = json.load(f)
  return [t for seg in traj["segments"] for t, m in zip(seg["token_ids"], seg["loss_mask"]) if m]
