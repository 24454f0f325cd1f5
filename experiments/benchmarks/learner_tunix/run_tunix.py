r"""Times google-tunix's GRPO learner step on a fixed batch; runs inside the Tunix virtualenv.

Called by ``experiments/benchmarks/learner.py`` with the venv's python; imports nothing from
legorl_jax (that package is not installed there). The step is wired the way
``tunix.rl.grpo.grpo_learner.GRPOLearner.__init__`` wires its actor trainer:

* model: ``tunix.models.qwen3.model.Qwen3`` with a ``ModelConfig`` of the requested shape,
  random init, float32, no remat, dense (non-flash) attention;
* trainer: ``tunix.rl.trainer.Trainer`` (a ``PeftTrainer``) with the given optax optimizer;
* loss: ``function_registry.get_policy_loss_fn("grpo")`` (= ``algo_core.grpo_loss_fn``),
  wrapped in the same lambda as GRPOLearner, via ``with_loss_fn(..., has_aux=True)`` and
  ``with_gen_model_input_fn``;
* timed: the jitted ``PeftTrainer._train_step`` returned by
  ``Trainer.jit_train_and_eval_step(cache_nnx_graph=True)`` (the same call ``PeftTrainer.train``
  makes), called on one pre-built ``grpo_learner.TrainExample`` — forward, GRPO loss,
  backward, global-norm and the optax update; no generation, reference or old-policy passes.

Prints one JSON line.
"""

import argparse
import json
import statistics
import time

from peak import matmul_peak  # beside this script, which runs outside the package


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shape", required=True, help="JSON: num_layers, vocab_size, hidden_size, "
                 "intermediate_size, num_heads, num_kv_heads, head_dim, rope_theta, rms_norm_eps")
  p.add_argument("--batch", type=int, required=True)
  p.add_argument("--prompt_len", type=int, required=True)
  p.add_argument("--completion_len", type=int, required=True)
  p.add_argument("--group", type=int, default=1, help="completions per prompt (GRPO group)")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--lr", type=float, default=1e-6)
  p.add_argument("--max_grad_norm", type=float, default=1.0)
  p.add_argument("--clip_eps", type=float, default=0.2)
  p.add_argument("--aggregation", default="sequence-mean-token-mean")
  p.add_argument("--matmul_n", type=int, default=2048)
  p.add_argument("--matmul_repeats", type=int, default=5)
  p.add_argument("--profile_dir", default=None, help="profile extra steps into this directory")
  p.add_argument("--profile_steps", type=int, default=2)
  args = p.parse_args()

  import importlib.metadata as md
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx
  from tunix.models.qwen3 import model as qwen3
  from tunix.rl import function_registry
  from tunix.rl import trainer as rl_trainer
  from tunix.rl.grpo import grpo_learner
  from tunix.sft import peft_trainer

  peak, peak_cpu = matmul_peak(args.matmul_n, args.matmul_repeats)

  s = json.loads(args.shape)
  cfg = qwen3.ModelConfig(
      num_layers=s["num_layers"], vocab_size=s["vocab_size"], embed_dim=s["hidden_size"],
      hidden_dim=s["intermediate_size"], num_heads=s["num_heads"], head_dim=s["head_dim"],
      num_kv_heads=s["num_kv_heads"], rope_theta=int(s["rope_theta"]),
      norm_eps=float(s["rms_norm_eps"]), use_tied_embedding=bool(s["tie_word_embeddings"]),
      remat_config=qwen3.RematConfig.NONE, dtype=jnp.float32, param_dtype=jnp.float32,
      use_flash_attention=False)
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

  pad_id, eos_id = 0, 1
  algo = grpo_learner.GRPOConfig(num_generations=2, num_iterations=1, beta=0.0,
                                 epsilon=args.clip_eps, loss_agg_mode=args.aggregation)
  algo.temperature = 1.0  # GRPOLearner copies the rollout temperature here.
  policy_loss_fn = function_registry.get_policy_loss_fn(algo.policy_loss_fn)
  loss_fn = lambda model, train_example, algo_config: policy_loss_fn(
      model, train_example, algo_config=algo, pad_id=pad_id, eos_id=eos_id)

  parts = [optax.clip_by_global_norm(args.max_grad_norm)] if args.max_grad_norm > 0 else []
  optimizer = optax.chain(*parts, optax.adamw(args.lr, b1=0.9, b2=0.999, eps=1e-8,
                                              weight_decay=0.0))
  trainer = rl_trainer.Trainer(
      model=model, optimizer=optimizer,
      training_config=peft_trainer.TrainingConfig(eval_every_n_steps=10**9,
                                                  max_steps=args.steps + 10),
      custom_checkpoint_metadata_fn=lambda: {})
  trainer.with_loss_fn(loss_fn, has_aux=True)
  trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo})
  train_step, _ = trainer.jit_train_and_eval_step(skip_jit=False, cache_nnx_graph=True)

  # Same token ids / advantages recipe as the legorl side: ids in [2, V), no padding.
  rng = np.random.default_rng(0)
  b, tp, tc = args.batch, args.prompt_len, args.completion_len
  ids = rng.integers(2, s["vocab_size"], (b, tp + tc)).astype(np.int32)
  ids[:, :tp] = ids[(np.arange(b) // args.group) * args.group, :tp]  # a group shares its prompt
  adv = rng.standard_normal(b).astype(np.float32)
  example = grpo_learner.TrainExample(
      prompt_ids=jnp.asarray(ids[:, :tp]), prompt_mask=jnp.ones((b, tp), bool),
      completion_ids=jnp.asarray(ids[:, tp:]), completion_mask=jnp.ones((b, tc), jnp.int32),
      ref_per_token_logps=None, advantages=jnp.asarray(adv), old_per_token_logps=None)

  t0 = time.perf_counter()
  loss, aux, grad_norm = jax.block_until_ready(train_step(example))
  first = time.perf_counter() - t0
  times, cpu = [], []
  for _ in range(args.steps):
    c0, t0 = time.process_time(), time.perf_counter()
    loss, aux, grad_norm = jax.block_until_ready(train_step(example))
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  step_s = statistics.median(times)
  if args.profile_dir:
    jax.profiler.start_trace(args.profile_dir)
    for _ in range(args.profile_steps):
      jax.block_until_ready(train_step(example))
    jax.profiler.stop_trace()
  print(json.dumps({
      "side": "tunix", "tunix_version": md.version("google-tunix"),
      "jax_version": jax.__version__, "flax_version": md.version("flax"),
      "timed": "tunix.sft.peft_trainer.PeftTrainer._train_step (nnx.jit via "
               "tunix.rl.trainer.Trainer.jit_train_and_eval_step, cache_nnx_graph=True) with "
               "loss tunix.rl.algo_core.grpo_loss_fn (registry 'grpo'), wired as GRPOLearner",
      "n_params": n_params, "loss": float(loss), "grad_norm": float(grad_norm),
      "compile_and_first_s": round(first, 3), "step_s_median": round(step_s, 4),
      "step_s_all": [round(t, 4) for t in times],
      "tokens_per_s": round(b * (tp + tc) / step_s, 1),
      "matmul_peak_gflops": round(peak / 1e9, 2),
      "cpu_s_median": round(statistics.median(cpu), 4),
      "matmul_gflop_per_cpu_s": round(peak_cpu / 1e9, 2)}), flush=True)


if __name__ == "__main__":
  main()
