"""Per-op CPU time of XLA thunks from a ``jax.profiler`` trace, by coarse class (matmul,
layout copies, loops, the rest): where a learner step's seconds go, for ``--profile``."""

import json
import os


def profile_steps(run, state, profile_dir: str, n: int):
  """Runs ``n`` more steps under ``jax.profiler`` (for ``op_breakdown``); returns the state."""
  import jax
  jax.profiler.start_trace(profile_dir)
  for _ in range(n):
    state, _ = run(state)
  jax.profiler.stop_trace()
  return state


def _op_category(name: str) -> str:
  """Coarse class of an XLA:CPU thunk by its HLO name (fusion names carry their root ops)."""
  base = name.split(".")[0]
  if base.startswith(("ynn_fusion", "xnn_fusion", "onednn")) or base in ("dot", "dot_general",
                                                                        "custom-call"):
    return "matmul"
  if "copy" in base or "transpose" in base:
    return "layout copy (incl. fused elementwise)"
  if base == "while":
    return "loops (fused lm head, own time)"
  return "elementwise / reductions / other"


def op_breakdown(profile_dir: str, steps: int) -> dict | None:
  """Per-step CPU time of the XLA thunks in a ``jax.profiler`` trace, by ``_op_category``.

  Times are summed over the thunk events of all threads (each op is counted once, however
  many threads it used: it is execution time of op tasks, not wall time). None if no trace.
  """
  import glob
  import gzip
  paths = sorted(glob.glob(os.path.join(profile_dir, "plugins", "profile", "*", "*.trace.json.gz")))
  if not paths:
    return None
  with gzip.open(paths[-1]) as f:
    events = json.load(f)["traceEvents"]
  skip = ("ThunkExecutor", "$", "Slinky", "Pjit", "Common", "end:", "Handle", "Parse", "Allocate",
          "Wait", "TfrtCpu", "PjRt")
  totals, top = {}, {}
  for e in events:
    if e.get("ph") != "X" or e["name"].startswith(skip):
      continue
    cat = _op_category(e["name"])
    totals[cat] = totals.get(cat, 0.0) + e["dur"] / 1e6 / steps
    top[e["name"]] = top.get(e["name"], 0.0) + e["dur"] / 1e6 / steps
  total = sum(totals.values())
  return {"op_s_per_step": round(total, 4),
          "fraction": {k: round(v / total, 4) for k, v in sorted(totals.items())},
          "top_ops": {k: round(v, 4) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:12]}}
