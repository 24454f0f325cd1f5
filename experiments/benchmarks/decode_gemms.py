"""The weight matmuls of one decode step alone: XLA:CPU against PyTorch on the same shapes.

A decode step at ``--rows`` rows multiplies ``[rows, K]`` activations by every block's
projection kernels (q, k, v, o, gate, up, down) and the output head: the step's fixed part,
which no attention change touches. This times exactly those products, with random fp32
weights of a preset's shapes, as one jitted XLA function and as the same ``torch`` matmuls
(``--torch_threads``), alternating, and prints the milliseconds and GFLOP/s of each. If XLA:CPU
runs them no slower than PyTorch, a sampler that beats ``transformers`` by more than its Python
overhead must read or compute less, not multiply better.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_gemms --preset smollm2-135m --rows 32
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models.config import get_preset  # noqa: E402

flags.DEFINE_string("preset", "smollm2-135m", "Model preset whose shapes to use.")
flags.DEFINE_integer("rows", 32, "Rows of the activations (the decode batch).")
flags.DEFINE_integer("repeats", 9, "Timed calls per side (alternating); medians reported.")
flags.DEFINE_integer("torch_threads", 2, "PyTorch intra-op threads.")
FLAGS = flags.FLAGS


def step_shapes(cfg) -> list[tuple[int, int]]:
  """(K, N) of every weight matmul in one decode step: each block's projections, then the head."""
  d, f = cfg.hidden_size, cfg.intermediate_size
  q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  block = [(d, q), (d, kv), (d, kv), (q, d), (d, f), (d, f), (f, d)]
  return block * cfg.num_layers + [(d, cfg.vocab_size)]


def main(argv):
  del argv
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(FLAGS.torch_threads)
  cfg = get_preset(FLAGS.preset)
  shapes = step_shapes(cfg)
  m = FLAGS.rows
  rng = np.random.default_rng(0)
  weights = [rng.standard_normal(s, dtype=np.float32) * 0.02 for s in shapes]
  inputs = {k: rng.standard_normal((m, k), dtype=np.float32) for k in {k for k, _ in shapes}}

  jw = [jnp.asarray(w) for w in weights]
  jx = {k: jnp.asarray(v) for k, v in inputs.items()}

  @jax.jit
  def xla_step(xs, ws):
    # Each product's sum keeps it live; the sums cost ~1/K of the product.
    return sum(jnp.sum(xs[w.shape[0]] @ w) for w in ws)

  tw = [torch.from_numpy(w) for w in weights]
  tx = {k: torch.from_numpy(v) for k, v in inputs.items()}

  def torch_step():
    with torch.inference_mode():
      return float(sum((tx[w.shape[0]] @ w).sum() for w in tw))

  xla_step(jx, jw).block_until_ready()
  torch_step()
  times = {"xla": [], "torch": []}
  for _ in range(FLAGS.repeats):
    t0 = time.perf_counter()
    xla_step(jx, jw).block_until_ready()
    times["xla"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    torch_step()
    times["torch"].append(time.perf_counter() - t0)
  flops = 2 * m * sum(k * n for k, n in shapes)
  out = dict(benchmark="decode_gemms", preset=FLAGS.preset, rows=m, matmuls=len(shapes),
             gflop=round(flops / 1e9, 2),
             weight_mb=round(sum(w.nbytes for w in weights) / 1e6, 1),
             torch_threads=torch.get_num_threads(), load_avg_1m=common.load_avg_1m())
  for side, ts in times.items():
    med = statistics.median(ts)
    out[f"{side}_ms"] = round(1e3 * med, 2)
    out[f"{side}_gflops"] = round(flops / med / 1e9, 1)
  out["xla_speedup_vs_torch"] = round(out["torch_ms"] / out["xla_ms"], 3)
  common.emit(out)


if __name__ == "__main__":
  app.run(main)
