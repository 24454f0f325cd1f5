"""The machine's measured matmul peak, the denominator of the learner benchmark's MFU.

One copy for both sides of the comparison: ``learner.py`` imports it, and ``run_tunix.py``
(which runs inside the Tunix virtualenv, where legorl_jax is not installed) imports it from its
own directory, so the module needs nothing but jax.
"""

import statistics
import time


def matmul_peak(n: int, repeats: int) -> tuple[float, float]:
  """FLOP/s of a jitted float32 [n, n] @ [n, n] (median of ``repeats`` after a warm-up), per
  wall second and per CPU second of this process."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.dot)
  jax.block_until_ready(f(a, b))
  ts, cs = [], []
  for _ in range(repeats):
    c0, t0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(f(a, b))
    ts.append(time.perf_counter() - t0)
    cs.append(time.process_time() - c0)
  return 2.0 * n ** 3 / statistics.median(ts), 2.0 * n ** 3 / statistics.median(cs)
