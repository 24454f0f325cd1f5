r"""When does the tiny policy learn to copy a renamed path from the instruction?

The demo's held-out tasks are solved only by copying names (package, module, variables) from
the prompt into the edit call. This measures that one skill in isolation: the ``tiny`` preset,
from random weights, is trained with token NLL on short sequences that are the demo's own
format cut to the part that matters: a built-in harness instruction naming
``pkg_word/module.py`` and the start of the assistant's ``edit`` call, the loss on the path only.
Package pairs are split by a hash into train and held-out pairs, so a held-out exact match
means copying, not recall.

Output: one JSON line with, per learning rate, the held-out exact-match curve and the first
step at which half the held-out paths are copied exactly. The curve is flat, then jumps (the
copy circuit forms after a number of examples, not gradually).

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.copy_phase --lrs=3e-3,1e-2 --steps=600

``--save=DIR`` keeps each run's final policy as a Hugging Face checkpoint (a starting point
for ``experiments.train --config.model.checkpoint=DIR/lr0.01``).
"""

import random
import time
import zlib

import numpy as np
from absl import app, flags

from experiments.benchmarks import common

flags.DEFINE_string("preset", "tiny", "Model preset, from random weights.")
flags.DEFINE_list("lrs", ["3e-3", "1e-2"], "Learning rates, one run each.")
flags.DEFINE_float("b2", 0.98, "AdamW b2.")
flags.DEFINE_integer("steps", 600, "Training steps per run.")
flags.DEFINE_integer("batch", 32, "Examples per step.")
flags.DEFINE_integer("length", 80, "Tokens per example.")
flags.DEFINE_integer("eval_every", 50, "Steps between held-out evaluations.")
flags.DEFINE_integer("eval_examples", 256, "Held-out examples.")
flags.DEFINE_integer("seed", 0, "Model and data seed.")
flags.DEFINE_float("stop_at_exact", 0.0,
                   "Stop a run once its held-out exact match reaches this (0: never).")
flags.DEFINE_string("save", "", "Write each run's final model (HF format) to SAVE/lrLR.")
FLAGS = flags.FLAGS

FUNCS = ("polygon_area", "apply_discount", "matmul", "median", "parse_row", "clamp", "merge",
         "running_total", "days_between", "word_count")


def example(rng: random.Random, held_out: bool, tok, package_words, modules):
  """(token ids, loss mask) of one instruction + path-copy example from the wanted split."""
  while True:
    w1, w2 = rng.choice(package_words), rng.choice(package_words)
    if (zlib.crc32(f"{w1}_{w2}".encode()) % 5 == 0) == held_out:
      break
  path = f"{w1}_{w2}/{rng.choice(modules)}.py"
  func = rng.choice(FUNCS)
  a, b = rng.randint(0, 9), rng.randint(10, 99)
  prompt = (f"<|im_start|>user\nThe function `{func}` in `{path}` is wrong.\n"
            f"`{func}({a}, {b})` returns `{a}` but it should return `{b}`.<|im_end|>\n"
            '<|im_start|>assistant\n<tool_call>\n{"name": "edit", "arguments": {"path": "')
  p, q = tok.encode(prompt), tok.encode(path + '"')
  return p + q, [0] * len(p) + [1] * len(q)


def batch(rng, n, length, held_out, tok, package_words, modules):
  ids = np.zeros((n, length), np.int32)
  mask = np.zeros((n, length), np.float32)
  for i in range(n):
    x, m = example(rng, held_out, tok, package_words, modules)
    ids[i, :len(x)], mask[i, :len(m)] = x[:length], m[:length]
  return ids, mask


def run(lr: float, args, tok):
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx
  from legorl_jax.models import create_model
  from legorl_jax.taskgen.synthetic.rename import MODULES, PACKAGES

  model = create_model(args.preset, seed=args.seed)
  opt = nnx.Optimizer(model, optax.adamw(lr, b2=args.b2), wrt=nnx.Param)

  def nll(model, ids, mask):
    """ids, mask: [B, T]; per-token NLL of the masked targets, [B, T-1]."""
    logp = jax.nn.log_softmax(model(ids)[:, :-1], axis=-1)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0] * mask[:, 1:]

  @nnx.jit
  def train_step(model, opt, ids, mask):
    loss, grads = nnx.value_and_grad(lambda m: nll(m, ids, mask).sum() / mask.sum())(model)
    opt.update(model, grads)
    return loss

  @nnx.jit
  def held_out(model, ids, mask):
    logits = model(ids)[:, :-1]
    hit = (jnp.argmax(logits, -1) == ids[:, 1:]) | (mask[:, 1:] == 0)
    return hit.all(-1).mean(), nll(model, ids, mask).sum() / mask.sum()

  train_rng, eval_rng = random.Random(args.seed), random.Random(args.seed + 1)
  eval_ids, eval_mask = batch(eval_rng, args.eval_examples, args.length, True, tok, PACKAGES, MODULES)
  curve, first_half, t0 = [], None, time.perf_counter()
  for step in range(1, args.steps + 1):
    ids, mask = batch(train_rng, args.batch, args.length, False, tok, PACKAGES, MODULES)
    train_step(model, opt, jnp.asarray(ids), jnp.asarray(mask))
    if step % args.eval_every == 0:
      exact, loss = held_out(model, jnp.asarray(eval_ids), jnp.asarray(eval_mask))
      curve.append({"step": step, "held_out_exact": round(float(exact), 3),
                    "held_out_nll_per_token": round(float(loss), 3)})
      if first_half is None and float(exact) >= 0.5:
        first_half = step
      if args.stop_at_exact and float(exact) >= args.stop_at_exact:
        break
  if args.save:
    from legorl_jax.models import save_pretrained
    save_pretrained(model, f"{args.save}/lr{lr:g}", tokenizer=tok)
  return {"lr": lr, "first_step_half_exact": first_half, "curve": curve,
          "seconds": round(time.perf_counter() - t0, 1)}


def main(argv):
  del argv
  args = FLAGS
  from legorl_jax.models.tokenizer import bundled_tokenizer_dir, load_tokenizer
  tok = load_tokenizer(bundled_tokenizer_dir())
  runs = [run(float(lr), args, tok) for lr in args.lrs]
  common.emit({"benchmark": "copy_phase", "preset": args.preset, "batch": args.batch,
               "steps": args.steps, "b2": args.b2, "runs": runs})


if __name__ == "__main__":
  app.run(main)
