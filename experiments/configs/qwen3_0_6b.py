"""qwen3-0.6b on an accelerator host or slice: real harnesses in Docker sandboxes, bf16 compute.

Point `model.checkpoint` at a Hugging Face directory of the model (weights are not fetched):

  python -m experiments.train --config=experiments/configs/qwen3_0_6b.py --workdir=gs://BUCKET/runs/x \\
      --config.model.checkpoint=/data/qwen3-0.6b

Mesh: data x fsdp x tensor over all devices (fsdp takes the rest); raise `mesh.tensor` for
long contexts. Harness CLIs: `python -m legorl_jax.harnesses.install NAME` on every host.
"""

from experiments.configs import common


def get_config():
  c = common.base_config()
  c.model.preset = "qwen3-0.6b"
  c.model.remat = True
  c.model.compute_dtype = "bfloat16"
  c.tasks.source = "synthetic"
  c.tasks.difficulty = "easy"
  c.harness.name = "mini-swe-agent"
  c.harness.max_turns = 30
  c.harness.timeout_s = 900.0
  c.sandbox.backend = "docker"
  c.sampling.max_tokens = 2048
  c.engine.max_batch = 64
  c.engine.max_len = 4096
  c.engine.prefill_buckets = (256, 1024, 4096)
  c.engine.decode_chunk = 32
  c.rollout.tasks_per_step = 16
  c.rollout.samples_per_task = 8
  c.rollout.concurrency = 64
  c.rollout.overlong = "penalty"
  c.rollout.overlong_buffer = 512
  c.rollout.max_sampled_tokens = 2048
  c.loss.is_correction = "tis"      # bf16 sampler vs learner mismatch
  c.trainer.mode = "async"
  c.trainer.max_staleness = 1
  c.trainer.steps = 200
  c.trainer.buckets = (4096, 4096)
  c.trainer.rows_per_batch = 64
  c.trainer.micro_batches = 8
  c.trainer.pack = True
  c.trainer.logprob_impl = None     # pallas on GPU, xla elsewhere
  c.optim.learning_rate = 1e-6
  c.optim.schedule = "warmup"
  c.optim.warmup_steps = 10
  c.sft.steps = 0
  c.eval.every = 20
  c.eval.samples = 4
  c.checkpoint.every = 10
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  return c
