"""The dashboard renders in headless Chromium: a non-empty screenshot with the curves drawn."""

import json
import os
import shutil
import subprocess

import pytest

from legorl_jax.metrics import dashboard
from legorl_jax.metrics.writer import MetricsWriter, read_metrics

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _fake_run(workdir):
  """A run directory as experiments.train writes it (metrics, trials, one trajectory)."""
  w = MetricsWriter(str(workdir), tensorboard=False)
  for step in range(1, 6):
    w.write(step, {"solve_rate": 0.1 * step, "loss/policy": 1.0 / step, "entropy": 2.0 - 0.1 * step,
                   "rollout_abs_dlogp": 1e-6, "trials_per_hour": 1000 + step}, phase="train")
  w.write(0, {"solve_rate": 0.1, "greedy_solve_rate": 0.2}, phase="eval")
  w.write(5, {"solve_rate": 0.4, "greedy_solve_rate": 0.3}, phase="eval")
  w.close()
  traj = {"segments": [{"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [0, -0.5, -0.25],
                        "stream": "main", "train": True, "reason": "first_call"}]}
  tpath = os.path.join(workdir, "t0.json")
  with open(tpath, "w") as f:
    json.dump(traj, f)
  with open(os.path.join(workdir, "trials.jsonl"), "w") as f:
    for step in range(1, 6):
      for i in range(3):
        f.write(json.dumps({"trial_id": f"t{step}{i}", "task_id": f"task{i}", "status":
                            "solved" if i < step % 3 else "failed", "reward": 1.0, "step": step,
                            "harness": "builtin", "turns": 2, "trajectory_path": tpath}) + "\n")


def test_metrics_writer_round_trip(tmp_path):
  _fake_run(tmp_path)
  rows = read_metrics(str(tmp_path))
  assert len(rows) == 7 and rows[0]["phase"] == "train" and rows[-1]["greedy_solve_rate"] == 0.3


def test_page_holds_curves_grid_and_browser(tmp_path):
  _fake_run(tmp_path)
  page = dashboard.build(str(tmp_path))
  assert page.count('class="curve"') >= 4
  assert "task2" in page and "<table class=\"grid\">" in page
  assert '"tokens": [["1", 0, 0.0]' in page


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (bash .ci/setup_system.sh)")
def test_renders_in_headless_chromium(tmp_path):
  _fake_run(tmp_path)
  out = dashboard.write(str(tmp_path))
  shot = tmp_path / "shot.png"
  dom = subprocess.run(
      [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
       "--disable-component-update", "--disable-sync", "--no-first-run",
       f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"file://{out}"],
      capture_output=True, text=True, timeout=120)
  assert dom.returncode == 0, dom.stderr[-2000:]
  # The browser ran the page's script: the trial browser filled its list and the token view.
  assert dom.stdout.count("<option") >= 15 and 'class="m1"' in dom.stdout
  assert dom.stdout.count('class="curve"') >= 4
  r = subprocess.run(
      [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
       "--disable-component-update", "--disable-sync", "--no-first-run",
       f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,1600",
       f"--screenshot={shot}", f"file://{out}"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
  data = shot.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page is a few kB
