r"""GRPO loss through the lm head, forward + backward: fused token_logprobs vs materialised logits.

Each (variant, N) runs in a fresh subprocess of this script so that its peak resident memory
(VmHWM, read from /proc/self/status in the child, reset once the inputs are on device)
is its own. Times are the median of
``--steps`` jitted steps after one compile-and-run step; each step's outputs are dropped
before the next runs, as a training loop consumes its gradients. The child also reports
XLA's compiled buffer sizes (``memory_analysis``). Prints one JSON line at the end.

  JAX_PLATFORMS=cpu python experiments/benchmarks/loss.py             # full (minutes)
  JAX_PLATFORMS=cpu python experiments/benchmarks/loss.py --quick     # small shapes
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _vm_kib(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  return -1


def _reset_peak():
  """Resets VmHWM to the current RSS (Linux >= 4.0); harmless where unsupported."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass


def child(args) -> dict:
  """Runs one variant in this process and returns its figures."""
  import jax
  import jax.numpy as jnp
  from legorl_jax import rl

  n, d, v = args.n, args.d, args.v
  rows = max(1, n // args.seq_len)

  @jax.jit
  def make_inputs(key):
    k = jax.random.split(key, 5)
    hidden = jax.random.normal(k[0], (n, d), jnp.float32)
    lm_head = jax.random.normal(k[1], (d, v), jnp.float32) * (d ** -0.5)
    targets = jax.random.randint(k[2], (n,), 0, v, jnp.int32)
    adv = jnp.repeat(jax.random.normal(k[3], (rows, 1)), n // rows, axis=1)
    noise = jax.random.normal(k[4], (rows, n // rows)) * 0.05
    return hidden, lm_head, targets, adv, noise

  hidden, lm_head, targets, adv, noise = jax.block_until_ready(
      make_inputs(jax.random.key(0)))
  mask = jnp.ones((rows, n // rows), jnp.float32)
  cfg = rl.LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, entropy_coef=1e-3)
  impl = "xla" if args.variant == "fused" else "reference"

  def loss_fn(h, w):
    logp, ent = rl.token_logprobs(h, w, targets, impl=impl, token_chunk=args.token_chunk,
                                  vocab_chunk=args.vocab_chunk)
    logp, ent = logp.reshape(rows, -1), ent.reshape(rows, -1)
    batch = {"logp": logp, "old_logp": jax.lax.stop_gradient(logp) + noise,
             "advantages": adv, "loss_mask": mask, "entropy": ent}
    s, den, _ = rl.policy_loss("grpo", batch, cfg)
    return s / den

  step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
  base_kib = _vm_kib("VmRSS")
  _reset_peak()  # Count the step (compile included), not the input set-up.
  t0 = time.perf_counter()
  out = jax.block_until_ready(step(hidden, lm_head))
  first = time.perf_counter() - t0
  first_peak_kib = _vm_kib("VmHWM")
  times = []
  for _ in range(args.steps):
    # A training loop consumes the gradients before the next step: drop the previous
    # step's outputs so two d(lm_head) buffers are never live at once.
    del out
    t0 = time.perf_counter()
    out = jax.block_until_ready(step(hidden, lm_head))
    times.append(time.perf_counter() - t0)
  peak_kib = _vm_kib("VmHWM")
  loss, grad_w_norm = float(out[0]), float(jnp.linalg.norm(out[1][1]))
  del out
  # XLA's own accounting of the step's buffers (a second compile, after the peak is read).
  mem = step.lower(hidden, lm_head).compile().memory_analysis()
  compiled = None if mem is None else {
      k: round(getattr(mem, k + "_size_in_bytes") / 2**30, 4)
      for k in ("argument", "output", "temp", "alias")}
  return {"variant": args.variant, "n": n, "d": d, "v": v, "loss": loss,
          "grad_w_norm": grad_w_norm, "compiled_memory_gib": compiled,
          "peak_rss_first_step_gib": round(first_peak_kib / 2**20, 3),
          "compile_and_first_s": round(first, 3),
          "step_s_median": round(statistics.median(times or [first]), 3),
          "step_s_all": [round(t, 3) for t in times],
          "peak_rss_gib": round(peak_kib / 2**20, 3),
          "inputs_rss_gib": round(base_kib / 2**20, 3),
          "token_chunk": args.token_chunk, "vocab_chunk": args.vocab_chunk}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="small shapes (smoke test)")
  p.add_argument("--n", type=int, default=None, help="tokens for the fused-vs-materialised pair")
  p.add_argument("--n_large", type=int, default=None,
                 help="tokens for the fused-only run (0: skip)")
  p.add_argument("--d", type=int, default=None)
  p.add_argument("--v", type=int, default=None)
  p.add_argument("--variants", default="fused,materialised")
  p.add_argument("--steps", type=int, default=3, help="timed steps after the first")
  p.add_argument("--steps_large", type=int, default=0,
                 help="timed steps of the --n_large run (0: report the first step's time)")
  p.add_argument("--seq_len", type=int, default=1024, help="tokens per sequence (rows)")
  p.add_argument("--token_chunk", type=int, default=None)
  p.add_argument("--vocab_chunk", type=int, default=None)
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--variant", default="fused", help=argparse.SUPPRESS)
  args = p.parse_args()

  if args.child:
    print(json.dumps(child(args)), flush=True)
    return

  quick = args.quick
  n = args.n or (512 if quick else 4096)
  n_large = (0 if quick else 32768) if args.n_large is None else args.n_large
  d = args.d or (128 if quick else 1024)
  v = args.v or (8192 if quick else 151936)
  runs = [(var, n, args.steps) for var in args.variants.split(",")]
  if n_large:
    runs.append(("fused", n_large, args.steps_large))
  results = []
  for variant, nn, steps in runs:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--variant", variant,
           "--n", str(nn), "--d", str(d), "--v", str(v), "--steps", str(steps),
           "--seq_len", str(min(args.seq_len, nn))]
    for k in ("token_chunk", "vocab_chunk"):
      if getattr(args, k):
        cmd += [f"--{k}", str(getattr(args, k))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
      results.append({"variant": variant, "n": nn, "error": proc.stderr[-2000:]})
    else:
      results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps(results[-1]), file=sys.stderr, flush=True)

  summary = {"benchmark": "loss", "d": d, "v": v, "load_avg_1m": round(os.getloadavg()[0], 2),
             "cpus": os.cpu_count(), "runs": results}
  pair = {r["variant"]: r for r in results if r.get("n") == n and "error" not in r}
  if "fused" in pair and "materialised" in pair:
    f, m = pair["fused"], pair["materialised"]
    summary["peak_ratio_fused_over_materialised"] = round(f["peak_rss_gib"] / m["peak_rss_gib"], 4)
    # Same ratio for the memory above what the process held once the inputs were live.
    summary["extra_peak_ratio_fused_over_materialised"] = round(
        (f["peak_rss_gib"] - f["inputs_rss_gib"]) / (m["peak_rss_gib"] - m["inputs_rss_gib"]), 4)
    summary["time_ratio_fused_over_materialised"] = round(
        f["step_s_median"] / m["step_s_median"], 4)
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
