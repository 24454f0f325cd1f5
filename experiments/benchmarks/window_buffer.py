"""One engine decode call with and without a kept window buffer (CPU page faults).

A decode call slices its attention window out of the cache (rows ``[0, R)``, positions
``[0, W)``) and writes it back. Without a buffer XLA allocates the window afresh on every call,
and on CPU a fresh allocation of tens of MB is new pages from the kernel. With one, the window
is built in the donated buffer the previous call handed back (what ``sampling.Engine`` does on
one CPU device). For each shape this times the call with every row live (``--decode_chunk``
steps) and with no row live (the loop exits at once: what is left is the window's way in and
out), alternating the two variants in one process, and counts the process's minor page faults
per call. Prints one JSON line.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.window_buffer
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from experiments.benchmarks.decode_step import decode_rows  # noqa: E402
from legorl_jax.models import create_model  # noqa: E402
from legorl_jax.sampling import steps  # noqa: E402
from legorl_jax.sampling.cache import Cache  # noqa: E402

# (rows decoded, window, cache rows, cache slots): the sampler benchmark's batch of 16 early on,
# and the prefix-reuse benchmark's single session at half its cache.
SHAPES = ((16, 128, 16, 256), (1, 2048, 1, 4096), (1, 1024, 16, 4096))


def _minor_faults() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="small")
  ap.add_argument("--decode_chunk", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=10)
  args = ap.parse_args()
  model = create_model(args.preset, seed=0)
  graphdef, state = nnx.split(model)
  k = args.decode_chunk
  out = []
  for rows, window, cache_rows, slots in SHAPES:
    for live in (True, False):
      state_by_variant = {}
      for variant in ("buffer", "no_buffer"):
        cache = Cache.zeros(model.config, cache_rows, slots)
        shapes = steps.decode_window_shapes(cache, rows, window)
        buf = (jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
               if variant == "buffer" else None)
        state_by_variant[variant] = [cache, buf, [], 0]
      r = decode_rows(rows, window - k - 1)
      if not live:
        r = r._replace(positions=jnp.full((rows,), -1, jnp.int32))
      for i in range(args.repeats + 2):  # two warm-up rounds (compilation, first allocations)
        for variant, st in state_by_variant.items():
          cache, buf, times, _ = st
          f0, t0 = _minor_faults(), time.perf_counter()
          res = steps.DECODE(graphdef, state, cache, r, num_rows=rows, attn_len=window,
                             num_steps=k, window_buffer=buf)
          jax.block_until_ready(res)
          dt, df = time.perf_counter() - t0, _minor_faults() - f0
          st[0], st[1] = res[0], (res[4] if buf is not None else None)
          if i >= 2:
            times.append(dt)
            st[3] += df
      row = dict(rows=rows, window=window, cache_rows=cache_rows, cache_slots=slots,
                 steps=k if live else 0)
      for variant, (_, _, times, faults) in state_by_variant.items():
        row[f"{variant}_ms"] = round(float(np.median(times)) * 1e3, 2)
        row[f"{variant}_faults_per_call"] = faults // args.repeats
      row["speedup"] = round(row["no_buffer_ms"] / row["buffer_ms"], 2)
      out.append(row)
  print(json.dumps(dict(benchmark="window_buffer", preset=args.preset, backend=jax.default_backend(),
                        calls=out)))


if __name__ == "__main__":
  main()
