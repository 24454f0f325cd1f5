"""curves.svg carries the per-step learning signal (zero-variance groups, clip fraction,
approximate KL, KL to the start policy, entropy, completion length) beside the solve rate; the zero-variance fraction
is counted over groups with any valid trial, by hand."""

import json
import xml.etree.ElementTree as ET

import numpy as np

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
  assert titles == ["Solve rate", "Learning signal", "KL to the start policy", "Entropy",
                    "Completion tokens"]
  series = {p.get("data-series") for p in root.iter(f"{ns}polyline")}
  assert {"train (sampled)", "zero-variance groups", "clip fraction", "approx KL (k3)",
          "entropy", "mean per trial", "k3", "k1"} <= series
