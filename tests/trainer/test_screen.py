"""The screen (issue 44) on the tiny preset: SFT checkpoints saved along the way, scored at two
temperatures on RL-pool bugs under training names through the real engine, harness, sandbox and
verifier; one ranked table, its JSON, and the flags that start RL from the top row."""

import json
import os

import numpy as np
import pytest

from experiments.configs import demo_tiny
from legorl_jax import errors
from legorl_jax.models import create_model, get_preset
from legorl_jax.models import tokenizer as tok_lib
from legorl_jax.taskgen.synthetic.generator import bug_key
from legorl_jax.trainer import eval_stats, screen, screen_run, task_sets


class _Policy:
  """What ``save_if_due`` needs of a learner: the current policy as a Decoder."""

  def __init__(self, seed):
    self._model = create_model(get_preset("tiny"), seed=seed)

  def model(self):
    return self._model


def _cfg():
  c = demo_tiny.get_config()
  c.tasks.num_train, c.tasks.rl_bugs_percent = 60, 50
  c.sft.num_demos, c.sft.check_demos = 8, 0
  c.sft.save_at = (1, 3)
  c.screen.bugs, c.screen.samples, c.screen.temperatures = 2, 2, (0.6, 1.0)
  c.sampling.max_tokens, c.harness.max_turns, c.engine.max_batch = 24, 1, 4
  c.rollout.concurrency = 4
  return c


def test_save_at_saves_the_listed_steps_only(tmp_path):
  cfg, tok = _cfg(), tok_lib.load_tokenizer()
  saved = [screen.save_if_due(_Policy(s), s, cfg, str(tmp_path), tok) for s in (1, 2, 3)]
  assert saved[1] is None and saved[0].endswith("step_1") and saved[2].endswith("step_3")
  assert screen.saved_checkpoints(str(tmp_path)) == [screen.checkpoint_dir(str(tmp_path), 1),
                                                      screen.checkpoint_dir(str(tmp_path), 3)]
  cfg.sft.save_at = (0,)
  with pytest.raises(errors.ConfigError, match="sft.save_at"):
    screen.save_at_steps(cfg)


def test_ranking_order():
  rows = [screen.ScreenRow("a", 0.6, 4, 2, 0.5, 0.7, 0.25, 0.1, 10, {}),
          screen.ScreenRow("b", 0.6, 4, 2, 0.2, 0.9, 0.50, 0.1, 10, {}),
          screen.ScreenRow("c", 0.8, 4, 2, 0.3, 0.9, 0.50, 0.1, 10, {})]
  assert [r.checkpoint for r in screen.rank(rows)] == ["c", "b", "a"]  # mixed, pass@k, pass@1
  assert [r.rank for r in rows] == [3, 2, 1]


@pytest.mark.slow
def test_screen_table_on_the_tiny_preset(tmp_path):
  cfg, tok = _cfg(), tok_lib.load_tokenizer()
  for s in (1, 3):  # two SFT checkpoints (different weights stand in for more or less SFT)
    screen.save_if_due(_Policy(s), s, cfg, str(tmp_path), tok)
  out = screen_run.run_screen(cfg, str(tmp_path), screen.saved_checkpoints(str(tmp_path)))
  print("\n" + out["table"])  # shown with pytest -s
  lines = out["table"].splitlines()
  assert lines[0].split() == ["rank", "checkpoint", "T", "pass@1", "pass@2", "mixed", "entropy"]
  assert len(lines) == 2 + 4  # 2 checkpoints x 2 temperatures
  rows = out["rows"]
  assert [r["rank"] for r in rows] == [1, 2, 3, 4]
  keys = [(-r["mixed_share"], -r["pass_k"], -r["pass1"]) for r in rows]
  assert keys == sorted(keys)
  # The bugs: RL-pool bugs, one task each, under training names.
  loader, _, _ = task_sets.load_tasks(cfg)
  pool = {bug_key(t) for t in loader.source}
  assert len(out["bugs"]) == 2 and set(out["bugs"]) <= pool
  for r in rows:
    assert r["bugs"] == 2 and r["samples"] == 2 and set(r["bug_rates"]) == set(out["bugs"])
    # pass@1 is the mean per-bug rate; pass@2 from the same counts; mixed = rates strictly inside.
    rates = list(r["bug_rates"].values())
    assert r["pass1"] == pytest.approx(np.mean(rates))
    assert r["pass_k"] == pytest.approx(np.mean([eval_stats.pass_at_k(2, round(2 * x), 2)
                                                 for x in rates]))
    assert r["mixed_share"] == pytest.approx(np.mean([0 < x < 1 for x in rates]))
    assert r["sampled_tokens"] > 0 and r["token_entropy"] > 0
  # Token entropy against a recomputation from the trajectories the trials wrote to disk.
  ckpts = screen.saved_checkpoints(str(tmp_path))
  for r in rows:
    part = f"ckpt_{ckpts.index(r['checkpoint'])}"
    recs = [json.loads(l) for l in open(tmp_path / "screen" / part / "trials.jsonl")]
    nll = []
    for rec in recs:
      if rec.get("final", True) and f"/T{r['temperature']:g}/" in rec["trajectory_path"]:
        for seg in json.load(open(rec["trajectory_path"]))["segments"]:
          nll += [-lp for lp, m in zip(seg["logprobs"], seg["loss_mask"]) if m]
    assert len(nll) == r["sampled_tokens"] and r["token_entropy"] == pytest.approx(np.mean(nll))
  saved = json.load(open(tmp_path / "screen" / "screen.json"))
  assert saved["best"]["checkpoint"] == rows[0]["checkpoint"]
  assert (tmp_path / "screen" / "screen.txt").read_text().strip() == out["table"]
  # The RL run starts from the top row: checkpoint, one temperature for sampler and learner.
  rl = screen.apply_best(cfg, str(tmp_path / "screen" / "screen.json"))
  assert rl.model.checkpoint == rows[0]["checkpoint"] and rl.sft.steps == 0
  assert rl.sampling.temperature == rl.loss.temperature == rows[0]["temperature"]
  assert rl.rollout.pass_rate.priors.endswith("screen.json")
  assert f"--config.sampling.temperature={rows[0]['temperature']:g}" in out["overrides"]
  assert os.path.isdir(rows[0]["checkpoint"])
