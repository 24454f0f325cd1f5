r"""The learner step with each ``trainer.cpu_library_fusion`` choice, interleaved in one process.

XLA:CPU can hand fusions to its YNNPACK library; ``dot`` gives it matmuls only, ``xla_default``
leaves XLA's own choice (which also routes elementwise fusions and reductions there). One
process compiles the same GRPO train step both ways (``jax.jit(...).lower().compile(
compiler_options=...)``), each with its own copy of the state, and alternates their steps, so
the machine's drift hits both alike. Prints one JSON line: median wall and CPU seconds per
step for each choice, their ratios, and the largest parameter difference after the steps.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.cpu_library_fusion                 # small, one GRPO group of 4
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.cpu_library_fusion --group 1      # plain rows
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.cpu_library_fusion --preset tiny \
      --batch 40 --prompt_len 300 --completion_len 724 --micro_batches 2 --group 1    # the demo's RL rows
"""

from __future__ import annotations

import os

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments.benchmarks.learner_inputs import grpo_batch, grpo_config  # noqa: E402
from legorl_jax.models import create_model, get_preset  # noqa: E402
from legorl_jax.models.params import split_model  # noqa: E402
from legorl_jax.trainer import compile_options  # noqa: E402
from legorl_jax.trainer import optimizer as opt_lib  # noqa: E402
from legorl_jax.trainer import state as state_lib  # noqa: E402
from legorl_jax.trainer import train_step as ts  # noqa: E402

flags.DEFINE_string("preset", "small", "Model preset (random weights).")
flags.DEFINE_integer("batch", 4, "Rows of the GRPO batch.")
flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per row.")
flags.DEFINE_integer("completion_len", 128, "Completion tokens per row.")
flags.DEFINE_integer("group", 4, "Completions per prompt (> 1: shared-prompt rows).")
flags.DEFINE_integer("micro_batches", 1, "Micro-batches per step.")
flags.DEFINE_integer("steps", 8, "Timed steps per choice (after one).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  args = FLAGS

  mcfg = get_preset(args.preset)
  cfg = grpo_config(args.micro_batches)  # the learner benchmark's defaults
  model_def, params = split_model(create_model(mcfg, seed=0))
  optimizer = opt_lib.make_optimizer(cfg.optim)
  batch, layout = grpo_batch(mcfg.vocab_size, args.batch, args.prompt_len, args.completion_len,
                             args.group, share=args.group > 1)
  cap = ts.scored_cap_for(batch, args.micro_batches)
  batch = jax.tree.map(jnp.asarray, batch)
  step = jax.jit(ts.make_train_step(model_def, optimizer, cfg), donate_argnums=(0,),
                 static_argnames=("scored_cap", "shared_prefix"))

  runs = {}
  for choice in compile_options.CPU_LIBRARY_FUSIONS:
    cfg.trainer.cpu_library_fusion = choice
    opts = compile_options.learner_compiler_options(cfg.trainer)
    state = state_lib.create_train_state(jax.tree.map(jnp.copy, params), optimizer)
    compiled = step.lower(state, batch, scored_cap=cap, shared_prefix=layout).compile(
        compiler_options=opts)
    runs[choice] = {"fn": compiled, "state": state, "wall": [], "cpu": []}
  for i in range(args.steps + 1):
    for r in runs.values():
      with common.Timer() as t:
        r["state"], metrics = r["fn"](r["state"], batch)
        jax.block_until_ready(metrics)
      if i:  # the first call of each runs once untimed
        r["wall"].append(t.wall)
        r["cpu"].append(t.cpu)
  med = {c: (common.median(r["wall"]), common.median(r["cpu"])) for c, r in runs.items()}
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(runs["dot"]["state"].params),
      jax.tree.leaves(runs["xla_default"]["state"].params)))
  common.emit({
      "benchmark": "cpu_library_fusion", "preset": args.preset, "batch": args.batch,
      "prompt_len": args.prompt_len, "completion_len": args.completion_len, "group": args.group,
      "micro_batches": args.micro_batches, "steps": args.steps,
      "row_shape": list(batch["input_ids"].shape),
      "step_s": {c: round(m[0], 4) for c, m in med.items()},
      "cpu_s": {c: round(m[1], 4) for c, m in med.items()},
      "speedup_dot_over_default_wall": round(med["xla_default"][0] / med["dot"][0], 3),
      "speedup_dot_over_default_cpu": round(med["xla_default"][1] / med["dot"][1], 3),
      "max_abs_param_diff": diff, "load_avg_1m": common.load_avg_1m(),
      "cpus": os.cpu_count()})


if __name__ == "__main__":
  app.run(main)
