"""Evaluation of a policy inside a native harness.

  python -m experiments.eval --config=experiments/configs/eval.py --workdir=/tmp/eval \\
      --config.harness=mini-swe-agent --config.policy=scripted --config.tasks=synthetic:4

harness: one name (``builtin``, ``mini-swe-agent``, ``aider``, ``openhands``, ``opencode``,
  ``codex``, ``claude-code``) or weights ``"builtin:1,mini-swe-agent:1"`` (each trial draws
  its harness; a task's ``metadata["harness"]`` wins).
policy: ``scripted`` (gold patches, for plumbing checks and demonstrations), a model preset
  (``tiny``: random weights from ``seed``) or a Hugging Face checkpoint directory.
tasks: ``synthetic:N``, a task JSONL file, or a TFDS task dataset directory.
backend: ``threads`` or ``ray`` (``--config.backend=ray --config.ray_address=auto``: trials on
  the Ray cluster this machine belongs to; see the README's "More machines").
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.harness = "builtin"
  c.policy = "scripted"
  c.sandbox = "local"
  c.tasks = "synthetic:4"
  c.difficulty = "easy"      # synthetic tasks only
  c.split = "validation"     # synthetic split / TFDS split
  c.num_tasks = 0            # 0 = all tasks of the source
  c.samples_per_task = 1
  c.seed = 0

  c.concurrency = 2
  c.max_retries = 1          # for infrastructure failures only
  # Where trials run: "threads" (this process) or "ray" (a Ray cluster). ray_address "" starts
  # a local cluster (ray_num_cpus logical CPUs, 0: as many as concurrency); "auto" or
  # "ray://HOST:10001" joins one. Workers reach the proxy at advertise_host:advertise_port
  # ("": this node's IP as Ray sees it; 0: a free port).
  c.backend = "threads"
  c.ray_address = ""
  c.ray_num_cpus = 0
  c.ray_trial_cpus = 1.0
  c.ray_trial_memory_mb = 0
  c.advertise_host = ""
  c.advertise_port = 0
  c.harness_timeout_s = 300.0
  c.max_turns = 8
  c.temperature = 1.0        # forced for neural policies (recorded per call)
  c.max_tokens = 512         # cap per call
  c.tokenizer = ""           # default: the checkpoint's, or the bundled one

  c.engine = ml_collections.ConfigDict()
  c.engine.max_len = 8192    # context; larger prompts end the trial as overlong
  c.engine.max_batch = 4
  c.engine.prefill_buckets = (512, 2048)
  c.engine.decode_chunk = 16
  return c
