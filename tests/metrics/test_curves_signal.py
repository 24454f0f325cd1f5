"""curves.svg carries the per-step learning signal (zero-variance groups, clip fraction,
approximate KL, KL to the start policy, entropy, completion length) beside the solve rate; the zero-variance fraction
is counted over groups with any valid trial, by hand."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from legorl_jax.metrics import plot
from legorl_jax.trainer.rl_loop import _zero_variance_frac


def test_zero_variance_fraction_by_hand():
  rewards = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 1], [0, 0, 0]], np.float32)
  valid = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0], [0, 0, 0]], bool)
  # group 0 all alike, group 1 mixed, group 2 alike over its valid trials, group 3 has none
  assert _zero_variance_frac(rewards, valid) == 2 / 3


def test_curves_svg_has_the_learning_signal_charts(tmp_path):
  rows = [{"phase": "train", "step": s, "solve_rate": 0.1 * s, "groups_zero_variance_frac": 0.5,
           "clip_high_frac": 0.01 * s, "approx_kl_k3": 1e-4 * s, "entropy": 1.0 - 0.1 * s,
           "completion_tokens_mean": 90 + s, "kl_to_start_k3": 2e-4 * s,
           "kl_to_start_k1": 2e-4 * s} for s in range(1, 4)]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  root = ET.parse(plot.write_curves(str(tmp_path))).getroot()
  ns = "{http://www.w3.org/2000/svg}"
  titles = [c.get("data-title") for c in root.iter(f"{ns}svg") if c.get("data-title")]
  assert titles == ["Solve rate", "Held-out sets (+- SE)", "Learning signal",
                    "KL to the start policy", "Entropy", "Completion tokens"]
  series = {p.get("data-series") for p in root.iter(f"{ns}polyline")}
  assert {"train (sampled)", "zero-variance groups", "clip fraction", "approx KL (k3)",
          "entropy", "mean per trial", "k3", "k1"} <= series


def test_every_held_out_set_has_its_curve_with_error_bars(tmp_path):
  rows = [{"phase": "eval", "step": s, "solve_rate": 0.1 + 0.01 * s, "solve_rate_se": 0.05,
           "greedy_solve_rate": 0.5, "names_demo/solve_rate": 0.6, "names_demo/solve_rate_se": 0.04,
           "templates/solve_rate": 0.02} for s in (0, 10, 20)]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  root = ET.parse(plot.write_curves(str(tmp_path))).getroot()
  ns = "{http://www.w3.org/2000/svg}"
  chart = next(c for c in root.iter(f"{ns}svg") if c.get("data-title") == "Held-out sets (+- SE)")
  assert {p.get("data-series") for p in chart.iter(f"{ns}polyline")} == {"main", "names_demo",
                                                                          "templates"}
  bars = [b for b in chart.iter(f"{ns}line") if b.get("class") == "errbar"]
  assert sorted({b.get("data-series") for b in bars}) == ["main", "names_demo"]  # SEs only there
  assert len(bars) == 6
  series, errors = plot.held_out_sets(rows)
  assert series["main"] == [(0, 0.1), (10, pytest.approx(0.2)), (20, pytest.approx(0.3))]
  assert errors["names_demo"] == {0: 0.04, 10: 0.04, 20: 0.04} and "templates" not in errors
