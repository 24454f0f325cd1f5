r"""GRPO loss through the lm head, forward + backward: fused token_logprobs vs materialised logits.

Each (variant, N) runs in a fresh subprocess of this script so that its peak resident memory
(VmHWM, read from /proc/self/status in the child, reset once the inputs are on device)
is its own. Times are the median of
``--steps`` jitted steps after one compile-and-run step; each step's outputs are dropped
before the next runs, as a training loop consumes its gradients. The child also reports
XLA's compiled buffer sizes (``memory_analysis``). Prints one JSON line at the end.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.loss             # full (minutes)
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.loss --quick     # small shapes
"""

import os
import statistics
import sys
import time

from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_bool("quick", False, "Small shapes (smoke test).")
flags.DEFINE_integer("n", None, "Tokens for the fused-vs-materialised pair.")
flags.DEFINE_integer("n_large", None, "Tokens for the fused-only run (0: skip).")
flags.DEFINE_integer("d", None, "Hidden size.")
flags.DEFINE_integer("vocab", None,
                     "Vocabulary size (was --v before the absl flags: absl's -v is --verbosity).")
flags.DEFINE_list("variants", ["fused", "materialised"], "Variants of the pair.")
flags.DEFINE_integer("steps", 3, "Timed steps after the first.")
flags.DEFINE_integer("steps_large", 0,
                     "Timed steps of the --n_large run (0: report the first step's time).")
flags.DEFINE_integer("seq_len", 1024, "Tokens per sequence (rows).")
flags.DEFINE_integer("token_chunk", None, "token_logprobs token chunk (default: its own).")
flags.DEFINE_integer("vocab_chunk", None, "token_logprobs vocab chunk (default: its own).")
flags.DEFINE_bool("child", False, "Internal: run one variant in this process.")
flags.DEFINE_string("variant", "fused", "Internal: the child's variant.")
FLAGS = flags.FLAGS


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

  n, d, v = args.n, args.d, args.vocab
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


def main(argv):
  del argv
  args = FLAGS

  if args.child:
    common.emit(child(args))
    return

  quick = args.quick
  n = args.n or (512 if quick else 4096)
  n_large = (0 if quick else 32768) if args.n_large is None else args.n_large
  d = args.d or (128 if quick else 1024)
  v = args.vocab or (8192 if quick else 151936)
  runs = [(var, n, args.steps) for var in args.variants]
  if n_large:
    runs.append(("fused", n_large, args.steps_large))
  results = []
  for variant, nn, steps in runs:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--variant", variant,
           "--n", str(nn), "--d", str(d), "--vocab", str(v), "--steps", str(steps),
           "--seq_len", str(min(args.seq_len, nn))]
    for k in ("token_chunk", "vocab_chunk"):
      if getattr(args, k):
        cmd += [f"--{k}", str(getattr(args, k))]
    out, error = common.run_child(cmd, env=common.child_env(platform=None), tail=2000)
    results.append(out if error is None else {"variant": variant, "n": nn, "error": error})
    common.note(results[-1])

  summary = {"benchmark": "loss", "d": d, "v": v, "load_avg_1m": common.load_avg_1m(),
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
  common.emit(summary)


if __name__ == "__main__":
  app.run(main)
