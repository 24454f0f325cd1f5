"""One self-contained HTML page for a run: curves, per-task solve grid, trial browser.

Everything is inlined (SVG charts, JSON data, a few lines of JavaScript), so the page opens
from disk, is attached to a bug report, or is served by anything.
"""

from __future__ import annotations

import collections
import glob
import html
import json
import os

from legorl_jax.metrics import plot
from legorl_jax.metrics.writer import read_metrics
from legorl_jax.utils import paths


def _read_jsonl(path: str) -> list[dict]:
  out = []
  if paths.exists(path):
    with paths.open_file(path) as f:
      for line in f:
        try:
          out.append(json.loads(line))
        except ValueError:
          continue
  return out


def _trials(workdir: str) -> list[dict]:
  rows = [r for r in _read_jsonl(paths.join(workdir, "trials.jsonl")) if r.get("final", True)]
  return rows


def _token_view(traj: dict, tokenizer, max_tokens: int = 3000) -> list[dict]:
  """Segments as lists of [text, mask, logprob] per token (decoded one by one)."""
  segs = []
  for seg in (traj.get("segments", []) + traj.get("side_segments", []))[:8]:
    ids = seg["token_ids"][:max_tokens]
    pieces = [tokenizer.decode([i]) for i in ids] if tokenizer is not None else [str(i) for i in ids]
    segs.append({"stream": seg.get("stream", "main"), "reason": seg.get("reason", ""),
                 "train": seg.get("train", True),
                 "tokens": [[p, int(m), round(float(lp), 4)] for p, m, lp in
                            zip(pieces, seg["loss_mask"], seg["logprobs"])]})
  return segs


def build(workdir: str, tokenizer=None, max_trials: int = 120) -> str:
  """Returns the page's HTML."""
  metrics = read_metrics(workdir)
  charts = plot.curves(metrics)
  chart_svgs = [plot.line_chart_svg(series, title, y_range=(0.0, 1.0) if title == "Solve rate" else None)
                for title, series in charts.items()]
  trials = _trials(workdir)
  # Per-task solve grid: rows = tasks, columns = RL steps, cell = solved / trials.
  grid: dict[str, dict[int, list[int]]] = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
  steps = sorted({int(t.get("step", 0)) for t in trials})
  for t in trials:
    cell = grid[t["task_id"]][int(t.get("step", 0))]
    cell[0] += int(t["status"] == "solved")
    cell[1] += 1
  rows = []
  for task in sorted(grid):
    cells = []
    for s in steps:
      solved, n = grid[task].get(s, [0, 0])
      frac = solved / n if n else None
      color = "#eee" if frac is None else f"hsl({int(120 * frac)}, 70%, {85 - 35 * frac:.0f}%)"
      label = "" if frac is None else f"{solved}/{n}"
      cells.append(f'<td style="background:{color}" title="step {s}: {label}">{label}</td>')
    rows.append(f"<tr><th>{html.escape(task)}</th>{''.join(cells)}</tr>")
  grid_html = (f'<table class="grid"><tr><th>task \\ step</th>'
               + "".join(f"<th>{s}</th>" for s in steps) + "</tr>" + "".join(rows) + "</table>")
  # Trial browser data: the latest trials with their trajectories.
  browse = []
  for t in trials[-max_trials:]:
    path = t.get("trajectory_path")
    traj = {}
    if path and paths.exists(path):
      try:
        with paths.open_file(path) as f:
          traj = json.load(f)
      except (OSError, ValueError):
        traj = {}
    browse.append({"id": t["trial_id"], "task": t["task_id"], "status": t["status"],
                   "reward": t.get("reward"), "step": t.get("step"), "harness": t.get("harness"),
                   "turns": t.get("turns"), "segments": _token_view(traj, tokenizer)})
  summary = {}
  spath = paths.join(workdir, "summary.json")
  if paths.exists(spath):
    with paths.open_file(spath) as f:
      summary = json.load(f)
  data = json.dumps(browse).replace("</", "<\\/")
  return _PAGE.format(
      title=html.escape(_run_name(workdir)),
      summary=html.escape(json.dumps(summary, indent=1, sort_keys=True)),
      charts="".join(f'<div class="chart-box">{s}</div>' for s in chart_svgs),
      grid=grid_html, data=data, n_trials=len(trials))


def _run_name(workdir: str) -> str:
  if paths.is_remote(workdir):
    return str(workdir).rstrip("/").rsplit("/", 1)[-1]
  return os.path.basename(os.path.abspath(workdir))


def write(workdir: str, tokenizer=None, out: str | None = None) -> str:
  out = out or paths.join(workdir, "dashboard.html")
  paths.write_text(out, build(workdir, tokenizer))
  return out


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>legorl_jax run {title}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 8px; }}
.chart-box {{ border: 1px solid #ddd; }}
table.grid {{ border-collapse: collapse; font-size: 11px; }}
table.grid td, table.grid th {{ border: 1px solid #ddd; padding: 2px 4px; text-align: center; }}
table.grid th:first-child {{ text-align: left; max-width: 420px; overflow: hidden; white-space: nowrap; }}
#trials {{ width: 100%; font-size: 12px; }}
.tok {{ white-space: pre-wrap; font-family: monospace; }}
.m0 {{ color: #777; }}
.m1 {{ background: #d8f0d8; }}
pre.summary {{ background: #f6f6f6; padding: 8px; font-size: 12px; }}
</style></head><body>
<h1>Run {title}</h1>
<pre class="summary">{summary}</pre>
<h2>Training curves</h2>
<div class="charts">{charts}</div>
<h2>Per-task solve grid</h2>
{grid}
<h2>Trial browser ({n_trials} trials)</h2>
<select id="trials" size="8"></select>
<div id="trial"></div>
<script>
const TRIALS = {data};
const sel = document.getElementById('trials');
TRIALS.forEach((t, i) => {{
  const o = document.createElement('option');
  o.value = i; o.textContent = `step ${{t.step}} | ${{t.status}} | r=${{t.reward}} | ${{t.harness}} | ${{t.task}}`;
  sel.appendChild(o);
}});
function show(i) {{
  const t = TRIALS[i]; const box = document.getElementById('trial'); box.innerHTML = '';
  const h = document.createElement('h3'); h.textContent = t.id + ' (' + t.turns + ' turns)'; box.appendChild(h);
  t.segments.forEach(s => {{
    const p = document.createElement('p');
    p.textContent = `segment: stream=${{s.stream}} train=${{s.train}} reason=${{s.reason}}`;
    box.appendChild(p);
    const div = document.createElement('div'); div.className = 'tok';
    s.tokens.forEach(([text, m, lp]) => {{
      const span = document.createElement('span'); span.className = 'm' + m; span.textContent = text;
      span.title = m ? 'logprob ' + lp : 'prompt (mask 0)'; div.appendChild(span);
    }});
    box.appendChild(div);
  }});
}}
sel.addEventListener('change', e => show(e.target.value));
if (TRIALS.length) {{ sel.value = TRIALS.length - 1; show(TRIALS.length - 1); }}
</script>
</body></html>
"""
