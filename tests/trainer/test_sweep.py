"""The sweep (issue 44, item 5): arms parsed and applied to the config, their figures read back
from a run's records, the ranking, and a real two-arm sweep on the tiny preset from one saved
start (``python -m experiments.sweep``)."""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import demo_tiny
from legorl_jax import errors
from legorl_jax.trainer import sweep
from tests.trainer.test_pipeline import ROOT, SMALL
from tests.xla_flags import subprocess_xla_flags


def test_arms_change_only_what_they_name():
  cfg = demo_tiny.get_config()
  arm = sweep.parse_arm("top2 trainer.trainable=top:2 optim.learning_rate=1 temperature=0.8")
  assert arm.name == "top2" and arm.overrides["trainer.trainable"] == "top:2"
  c = sweep.arm_config(cfg, "/ckpt", arm, steps=10)
  assert c.trainer.trainable == "top:2" and c.optim.learning_rate == 1.0
  assert c.sampling.temperature == c.loss.temperature == 0.8
  assert c.model.checkpoint == "/ckpt" and c.sft.steps == 0 and c.trainer.steps == 10
  assert cfg.trainer.trainable == "all" and cfg.sft.steps == 300  # the base config is untouched
  with pytest.raises(errors.ConfigError, match="no key"):
    sweep.arm_config(cfg, "/ckpt", sweep.parse_arm("x optim.lr=1"), 10)
  with pytest.raises(errors.ConfigError, match="name"):
    sweep.parse_arm("optim.learning_rate=1")


def test_figures_and_ranking(tmp_path):
  for name, zero, solve, gain in (("a", [0.5, 0.5], [0.2, 0.4], 0.1), ("b", [0.25, 0.25], [0.1, 0.1], None),
                                  ("c", [0.5, 0.5], [0.5, 0.5], -0.1)):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(
        json.dumps({"phase": "train", "step": i + 1, "groups_zero_variance_frac": z, "solve_rate": s}) + "\n"
        for i, (z, s) in enumerate(zip(zero, solve))) + json.dumps({"phase": "eval", "step": 0}) + "\n")
    if gain is not None:
      (d / "summary.json").write_text(json.dumps({"val_solve_rate_delta_rl": gain,
                                                  "val_solve_rate_delta_se_rl": 0.05}))
  rows = [{"name": n, **sweep.arm_figures(str(tmp_path / n))} for n in "abc"]
  assert rows[0]["mixed_share"] == pytest.approx(0.5) and rows[0]["train_solve_rate"] == pytest.approx(0.3)
  assert rows[1]["gain"] is None and rows[0]["steps"] == 2
  ranked = sweep.rank_arms(rows)
  assert [r["name"] for r in ranked] == ["b", "c", "a"]  # mixed share, then training solve rate
  table = sweep.format_table(ranked).splitlines()
  assert table[0].split()[:3] == ["rank", "arm", "mixed"] and len(table) == 5


def test_an_arm_the_kl_guard_stopped_ranks_last_and_says_why(tmp_path):
  for name, solve in (("calm", 0.2), ("hot", 0.6)):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"phase": "train", "step": 1, "solve_rate": solve,
                                                 "groups_mixed": 4, "tasks_drawn": 8}) + "\n")
  (tmp_path / "hot" / sweep.STOPPED).write_text(json.dumps(
      {"reason": "RL step 1: kl_to_start_k3 = 0.3 passed trainer.max_kl = 0.2; the policy ..."}))
  rows = sweep.rank_arms([{"name": n, **sweep.arm_figures(str(tmp_path / n))} for n in ("hot", "calm")])
  assert [r["name"] for r in rows] == ["calm", "hot"]  # better figures, but it did not finish
  assert rows[0]["stopped"] is None and rows[1]["stopped"].startswith("RL step 1")
  table = sweep.format_table(rows)
  assert "stopped after 1 steps: RL step 1: kl_to_start_k3 = 0.3 passed trainer.max_kl = 0.2" in table


def test_mixed_share_counts_the_groups_drawn_under_dynamic_sampling(tmp_path):
  # rl_long/rl_gain draw rounds until enough groups are mixed and keep only those, so the kept
  # groups are all mixed (zero-variance share 0.0); the drawn ones say how often RL finds signal
  steps = [{"groups_zero_variance_frac": 0.0, "groups_mixed": 9, "tasks_drawn": 24},
           {"groups_zero_variance_frac": 0.0, "groups_mixed": 4, "tasks_drawn": 8},
           {"groups_zero_variance_frac": 0.0, "groups_mixed": 3, "tasks_drawn": 0}]  # no draw: skipped
  (tmp_path / "metrics.jsonl").write_text("".join(
      json.dumps({"phase": "train", "step": i + 1, "solve_rate": 0.2, **m}) + "\n"
      for i, m in enumerate(steps)))
  assert sweep.arm_figures(str(tmp_path))["mixed_share"] == pytest.approx(13 / 32)


def test_which_arms_share_the_evaluation_before_rl():
  shares = lambda spec: sweep.shares_before_eval(sweep.parse_arm(spec))  # noqa: E731
  assert shares("base")
  assert shares("lr2e-4 optim.learning_rate=2e-4 loss.kl_coef=0.1 trainer.trainable=top:8")
  assert shares("wide rollout.tasks_per_step=11 rollout.pass_rate.epsilon=0.1 trainer.steps=3")
  assert not shares("t06 temperature=0.6")  # the sampler's temperature moves the evaluation
  assert not shares("t06 loss.temperature=0.6")
  assert not shares("lora trainer.trainable=lora")  # adapters change the forward's arithmetic
  assert not shares("n16 eval.samples=16") and not shares("s1 seed=1")
  assert not shares("ckpt model.checkpoint=/x") and not shares("sb rollout.concurrency=4")


def test_shared_evaluation_copies_only_the_before_rl_records(tmp_path):
  donor, arm = tmp_path / "base", tmp_path / "lr"
  (donor / "eval" / "before_rl").mkdir(parents=True)
  result = {"solve_rate": 0.25, "per_task": {"t1": [1, 0]}, "eval_s": 300.0}
  (donor / "eval" / "before_rl" / "result.json").write_text(json.dumps(result))
  rows = [{"phase": "eval", "step": 0, "solve_rate": 0.25}, {"phase": "train", "step": 1},
          {"phase": "eval", "step": 10, "solve_rate": 0.5}]
  (donor / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  trials = [{"phase": "eval_before_rl", "task_id": "t1"}, {"phase": "rl", "task_id": "t2"},
            {"phase": "eval_after_rl", "task_id": "t1"}]
  (donor / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trials))
  assert not sweep.share_before_eval(str(tmp_path / "none"), str(arm))  # no donor result
  assert not arm.exists()
  assert sweep.share_before_eval(str(donor), str(arm))
  assert json.loads((arm / "eval" / "before_rl" / "result.json").read_text()) == result
  assert [json.loads(l) for l in (arm / "metrics.jsonl").read_text().splitlines()] == rows[:1]
  assert [json.loads(l) for l in (arm / "trials.jsonl").read_text().splitlines()] == trials[:1]
  assert not sweep.share_before_eval(str(donor), str(arm))  # the arm has its own: untouched
  assert len((arm / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_two_arm_sweep_on_the_tiny_preset(tmp_path):
  from legorl_jax.models import create_model, get_preset, save_pretrained
  from legorl_jax.models import tokenizer as tok_lib
  start = tmp_path / "start"
  save_pretrained(create_model(get_preset("tiny"), seed=0), str(start), tokenizer=tok_lib.load_tokenizer())
  small = [a for a in SMALL if not a.startswith("--config.sft.")]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_xla_flags())
  r = subprocess.run([sys.executable, "-m", "experiments.sweep", f"--workdir={tmp_path / 'sweep'}",
                      "--config=experiments/configs/demo_tiny.py", f"--start={start}", *small,
                      "--config.eval.greedy=False", "--config.sweep.steps=1",
                      "--config.sweep.arms=('base', 'hot optim.learning_rate=0.05', "
                      "'tight trainer.max_kl=1e-12 loss.entropy_coef=0.5 optim.learning_rate=0.05')"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
  out = json.load(open(tmp_path / "sweep" / "sweep.json"))
  assert sorted(x["name"] for x in out["rows"]) == ["base", "hot", "tight"]
  assert [x["rank"] for x in out["rows"]] == [1, 2, 3]
  # the KL guard stops 'tight' after its first step: recorded and ranked last, the sweep goes on
  tight = out["rows"][-1]
  assert tight["name"] == "tight" and "passed trainer.max_kl = 1e-12" in tight["stopped"]
  assert tight["steps"] == 1 and tight["gain"] is None
  assert "arm tight stopped: RL step 1" in r.stdout
  for x in out["rows"][:2]:
    assert x["steps"] == 1 and x["mixed_share"] is not None and x["before"] is not None
    summary = json.load(open(os.path.join(x["workdir"], "summary.json")))
    assert summary["policy"] == str(start) and "sft_steps" not in summary  # RL only, from the start
  assert "rank  arm" in r.stdout
  # 'hot' changes only the learning rate, so it reuses base's evaluation before RL (paired)
  assert "arm hot: evaluation before RL shared from" in r.stdout
  before = {x["name"]: x["before"] for x in out["rows"]}
  assert before["hot"] == before["base"]
  evals = {n: [json.loads(l)["task_id"] for l in open(tmp_path / "sweep" / n / "trials.jsonl")
               if json.loads(l)["phase"] == "eval_before_rl"] for n in ("base", "hot")}
  assert evals["hot"] == evals["base"] and evals["hot"]
