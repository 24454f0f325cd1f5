"""Training curves as a dependency-free SVG (also embedded by the dashboard)."""

from __future__ import annotations

import html
from typing import Sequence

from legorl_jax.metrics.writer import read_metrics
from legorl_jax.utils import paths

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")


def line_chart_svg(series: dict[str, Sequence[tuple[float, float]]], title: str,
                   width: int = 560, height: int = 260, y_range=None,
                   errors: dict[str, dict[float, float]] | None = None) -> str:
  """One SVG chart; ``series``: name -> [(x, y), ...]. Points are also drawn as dots; with
  ``errors`` (name -> {x: standard error}) each such point gets a bar of +- 1 SE."""
  errors = errors or {}
  pts = [p for s in series.values() for p in s if p[1] is not None]
  pts += [(x, y + sign * errors[n][x]) for n, s in series.items() for x, y in s
          if y is not None and x in errors.get(n, {}) for sign in (-1, 1)]
  pad_l, pad_r, pad_t, pad_b = 48, 12, 28, 30
  w, h = width - pad_l - pad_r, height - pad_t - pad_b
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'class="chart" data-title="{html.escape(title)}">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{pad_l}" y="18" font-size="13" font-family="sans-serif">{html.escape(title)}</text>']
  if not pts:
    out.append(f'<text x="{pad_l}" y="{pad_t + h / 2}" font-size="12">no data</text></svg>')
    return "".join(out)
  xs, ys = [p[0] for p in pts], [p[1] for p in pts]
  x0, x1 = min(xs), max(xs)
  y0, y1 = y_range if y_range else (min(ys), max(ys))
  x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-9 + abs(y0) * 0.1 + 1e-3)
  sx = lambda x: pad_l + (x - x0) / (x1 - x0) * w  # noqa: E731
  sy = lambda y: pad_t + h - (y - y0) / (y1 - y0) * h  # noqa: E731
  out.append(f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="#888"/>')
  out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="#888"/>')
  for v in (y0, (y0 + y1) / 2, y1):
    out.append(f'<text x="4" y="{sy(v) + 4:.1f}" font-size="10" font-family="sans-serif">{v:.4g}</text>')
  out.append(f'<text x="{pad_l}" y="{height - 8}" font-size="10" font-family="sans-serif">{x0:g}</text>')
  out.append(f'<text x="{pad_l + w - 20}" y="{height - 8}" font-size="10" font-family="sans-serif">{x1:g}</text>')
  for i, (name, s) in enumerate(series.items()):
    s = [(x, y) for x, y in s if y is not None]
    if not s:
      continue
    c = _COLORS[i % len(_COLORS)]
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
    out.append(f'<polyline class="curve" data-series="{html.escape(name)}" fill="none" '
               f'stroke="{c}" stroke-width="2" points="{path}"/>')
    out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"/>' for x, y in s]
    bars = errors.get(name, {})
    out += [f'<line class="errbar" data-series="{html.escape(name)}" x1="{sx(x):.1f}" '
            f'y1="{sy(y - bars[x]):.1f}" x2="{sx(x):.1f}" y2="{sy(y + bars[x]):.1f}" '
            f'stroke="{c}" stroke-width="1"/>' for x, y in s if x in bars]
    out.append(f'<text x="{pad_l + w - 150}" y="{pad_t + 14 * (i + 1)}" font-size="11" fill="{c}" '
               f'font-family="sans-serif">{html.escape(name)}</text>')
  out.append("</svg>")
  return "".join(out)


def held_out_sets(metrics: list[dict]) -> tuple[dict, dict]:
  """(series, errors) of every held-out set's sampled solve rate over the evaluations
  (``eval`` rows: step 0 before RL, then every ``eval.every`` steps and the end), the main set
  as "main" and each other one by its mode, each point with its clustered SE."""
  series: dict[str, list] = {}
  errors: dict[str, dict] = {}
  for m in metrics:
    if m.get("phase") != "eval":
      continue
    for key, y in m.items():
      if not key.endswith("solve_rate") or key.endswith("greedy_solve_rate") or y is None:
        continue
      prefix = key[:-len("solve_rate")]
      name = prefix.rstrip("/") or "main"
      series.setdefault(name, []).append((m["step"], y))
      se = m.get(f"{prefix}solve_rate_se")
      if se is not None:
        errors.setdefault(name, {})[m["step"]] = se
  return series, errors


def curves(metrics: list[dict]) -> dict[str, dict[str, list[tuple[float, float]]]]:
  """Chart title -> series from ``metrics.jsonl`` rows."""
  train = [m for m in metrics if m.get("phase") == "train"]
  ev = [m for m in metrics if m.get("phase") == "eval"]
  sft = [m for m in metrics if m.get("phase") == "sft"]
  pick = lambda rows, k: [(r["step"], r.get(k)) for r in rows if r.get(k) is not None]  # noqa: E731
  return {
      "Solve rate": {"train (sampled)": pick(train, "solve_rate"),
                     "held-out (sampled)": pick(ev, "solve_rate"),
                     "held-out (greedy)": pick(ev, "greedy_solve_rate")},
      "Policy loss": {"loss/policy": pick(train, "loss/policy")},
      "Learning signal": {"zero-variance groups": pick(train, "groups_zero_variance_frac"),
                          "clip fraction": pick(train, "clip_high_frac"),
                          "approx KL (k3)": pick(train, "approx_kl_k3")},
      "KL to the start policy": {"k3": pick(train, "kl_to_start_k3"),
                                 "k1": pick(train, "kl_to_start_k1")},
      "Completion tokens": {"mean per trial": pick(train, "completion_tokens_mean")},
      "Entropy": {"entropy": pick(train, "entropy")},
      "Sampler vs learner |dlogp|": {"mean": pick(train, "rollout_abs_dlogp"),
                                     "max": pick(train, "rollout_abs_dlogp_max")},
      "SFT NLL": {"nll": pick(sft, "nll")},
      "Throughput": {"trials/h": pick(train, "trials_per_hour")},
  }


_CURVES_SVG = ("Solve rate", "Held-out sets (+- SE)", "Learning signal", "KL to the start policy",
               "Entropy", "Completion tokens")


def write_curves(workdir: str) -> str:
  """Writes ``workdir/curves.svg`` (solve rate; every held-out set's sampled solve rate at each
  evaluation with +- 1 clustered SE; then the per-step learning-signal charts:
  zero-variance groups, clip fraction, approximate KL per update; KL to the start policy;
  entropy; completion length) and returns
  its path."""
  metrics = read_metrics(workdir)
  charts = curves(metrics)
  sets, errors = held_out_sets(metrics)
  charts["Held-out sets (+- SE)"] = sets
  w, h = 560, 260
  parts = [line_chart_svg(charts[t], t, y_range=(0.0, 1.0) if t == "Solve rate" else None,
                          errors=errors if t.startswith("Held-out") else None)
           .replace("<svg ", f'<svg x="0" y="{i * h}" ', 1) for i, t in enumerate(_CURVES_SVG)]
  svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(parts)}">'
         + "".join(parts) + "</svg>")
  path = paths.join(workdir, "curves.svg")
  paths.write_text(path, svg)
  return path
