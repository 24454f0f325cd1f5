"""Shared defaults of every training config; files override what differs."""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny"      # a preset name, or
  c.model.checkpoint = ""      # a Hugging Face checkpoint directory (overrides preset)
  c.model.pretrained = ""      # or "smollm2-135m-instruct" / a .gguf file (models.pretrained)
  c.model.tokenizer = ""       # default: the checkpoint's, or the bundled one for presets
  c.model.remat = False
  c.model.compute_dtype = "float32"  # params stay float32; "bfloat16" on accelerators

  c.tasks = ml_collections.ConfigDict()
  c.tasks.source = "synthetic"  # "synthetic" or a TFDS task dataset directory
  c.tasks.difficulty = "hinted"
  c.tasks.num_train = 160
  c.tasks.num_val = 48
  c.tasks.variants = 1          # renamed copies per synthetic training task (1: original names)
  c.tasks.held_out = "templates"  # synthetic validation: unseen "templates" or unseen "names"
  c.tasks.also_held_out = ()      # more held-out sets evaluated beside it, e.g. ("templates",)
  # Percent of synthetic training bugs kept for RL only (no demonstrations; RL draws only from
  # them; held-out sets "names_rl" and "names_demo" need it). 0: every bug has demonstrations.
  c.tasks.rl_bugs_percent = 0
  # Held-out "names*" sets: at most one task per bug (num_val distinct bugs) instead of
  # num_val tasks that may repeat a bug under two names (issue 44: a 32-bug main set).
  c.tasks.held_out_distinct_bugs = False

  c.harness = ml_collections.ConfigDict()
  c.harness.name = "builtin"
  c.harness.eval_name = ""      # validation harness (default: harness.name)
  c.harness.max_turns = 4
  c.harness.timeout_s = 120.0

  c.sandbox = ml_collections.ConfigDict()
  c.sandbox.backend = "local"

  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 1.0
  c.sampling.max_tokens = 128

  c.engine = ml_collections.ConfigDict()
  c.engine.max_batch = 16
  c.engine.max_len = 1024
  c.engine.prefill_buckets = (64, 256, 512)  # prefill chunk: the smallest (fixed, aligned)
  c.engine.decode_chunk = 16
  c.engine.attn_step = 128  # attention windows: multiples of 128 slots (8 per doubling past 1k)
  c.engine.prefix_cache = True    # prompt prefixes shared across requests (a group's prompt)
  c.engine.prefix_cache_gb = 0.5  # LRU store for prefixes evicted from the engine's rows
  # Shared-prompt decode attention: a group's common prompt K/V read once per decode step, not
  # once per row (sampling.shared_prefix).
  c.engine.share_prefix = False

  c.rollout = ml_collections.ConfigDict()
  c.rollout.tasks_per_step = 8
  c.rollout.samples_per_task = 8
  c.rollout.concurrency = 16
  c.rollout.max_retries = 2
  # Where trials run: "threads" (this process) or "ray" (a Ray cluster: rollout.ray_backend).
  # ray_address "" starts a local cluster; "auto" or "ray://HOST:10001" joins one. Each trial
  # declares ray_trial_cpus CPUs and ray_trial_memory_mb MiB (0: undeclared); ray_num_cpus
  # sizes a local cluster (0: as many as rollout.concurrency).
  c.rollout.backend = "threads"
  c.rollout.ray_address = ""
  c.rollout.ray_trial_cpus = 1.0
  c.rollout.ray_trial_memory_mb = 0
  c.rollout.ray_num_cpus = 0
  # Where Ray workers reach the proxy ("": this node's IP as Ray sees it; 0: a free port).
  c.proxy = ml_collections.ConfigDict()
  c.proxy.advertise_host = ""
  c.proxy.advertise_port = 0
  c.rollout.overlong = "keep"
  c.rollout.overlong_penalty = 1.0
  c.rollout.overlong_buffer = 0
  c.rollout.max_sampled_tokens = 0
  c.rollout.drop_zero_variance = False
  # Dynamic sampling: up to this many draw rounds per step, until tasks_per_step groups have
  # mixed rewards (1: one draw of tasks_per_step tasks); draw_tasks per round (0: tasks_per_step).
  c.rollout.max_draw_rounds = 1
  c.rollout.draw_tasks = 0
  # Pass over drawn tasks whose last difficulty_window groups were all solved or all failed,
  # at most difficulty_max_skips times in a row (trainer.task_filter).
  c.rollout.difficulty_filter = False
  c.rollout.difficulty_window = 2
  c.rollout.difficulty_max_skips = 2
  c.rollout.mask_broken_groups = True
  # How RL draws tasks: "loader" (the shuffled pool in epochs) or "pass_rate" (bugs weighted by
  # the chance their group is mixed, "mixed", or p (1 - p), "variance", + epsilon; p an EMA of
  # each bug's solve rate: trainer.pass_rate_sampler; replaces the difficulty filter).
  # priors: a screen JSON (experiments.screen) with per-bug rates. near_zero > 0: bugs whose
  # estimate is below it get groups of near_zero_samples trials.
  c.rollout.sampler = "loader"
  c.rollout.pass_rate = ml_collections.ConfigDict(
      {"weight": "mixed", "prior": 0.5, "prior_groups": 1.0, "ema": 0.3, "epsilon": 0.02,
       "priors": "", "priors_temperature": 0.0, "near_zero": 0.0, "near_zero_samples": 16})

  c.advantage = ml_collections.ConfigDict()
  c.advantage.name = "grpo"

  c.loss = ml_collections.ConfigDict()
  c.loss.name = "grpo"
  c.loss.temperature = 1.0       # must equal sampling.temperature (checked)
  c.loss.clip_eps_low = 0.2
  c.loss.clip_eps_high = 0.28
  c.loss.aggregation = "token-mean"
  c.loss.is_correction = "none"  # "tis" in async mode
  c.loss.tis_cap = 2.0
  c.loss.kl_coef = 0.0
  # Mixture-of-experts policies: weight of the router's load-balancing loss, in SFT and RL alike
  # (0: none; the model's own router_aux_loss_coef, e.g. 0.001, is the usual choice).
  c.loss.router_aux_coef = 0.0
  c.loss.entropy_coef = 0.0
  c.loss.vf_coef = 0.0
  # Demonstration replay (issue 44): each RL step also trains on demo_replay_seqs SFT
  # demonstration sequences with weight * their token-mean NLL, against forgetting (0: off).
  c.loss.demo_replay_weight = 0.0
  c.loss.demo_replay_seqs = 4

  c.trainer = ml_collections.ConfigDict()
  c.trainer.mode = "sync"        # "sync" | "async"
  c.trainer.max_staleness = 1
  c.trainer.steps = 12
  c.trainer.micro_batches = 8    # bounds activation memory: rows_per_batch / 8 rows at a time
  # False: one optimizer update per batch of rows_per_batch rows. True: one update per step
  # over every batch (the exact gradient of the step's whole loss).
  c.trainer.accumulate = False
  # top:K: a step that scores and updates a batch several times (updates_per_batch > 1, or
  # several batches) computes the frozen trunk's states once per batch (exact).
  c.trainer.reuse_trunk = True
  # Mixture-of-experts policies: the learner replays the experts the sampler routed each token to
  # (recorded by the engine) instead of recomputing top-k, so the logprob invariant holds.
  c.trainer.routing_replay = False
  c.trainer.updates_per_batch = 1  # mu: passes over a step's batches, ratios vs the step start
  c.trainer.logprob_impl = "xla"
  c.trainer.cpu_library_fusion = "dot"  # XLA:CPU's YNNPACK runs matmuls only ("xla_default": all)
  c.trainer.buckets = (512, 1024)
  c.trainer.rows_per_batch = 64
  c.trainer.pack = False
  # Shared-prompt rows: (prefix_len, branch_len, branches, rows_per_batch); () = plain rows.
  # A GRPO group's samples share their prompt: it is computed once per row (see
  # batching.make_grouped_batches); trajectories that do not fit go to plain rows.
  c.trainer.share_prompt = ()
  # What trains, in SFT and RL alike: "all", "top:K" (the top K blocks and the final norm; the
  # embedding, so a tied lm head, stays frozen) or "lora" (adapters of rank lora_rank, scaled by
  # lora_alpha / lora_rank, on the lora_targets projections of every block). Only trainable
  # parameters get gradients, optimizer state and checkpoints; the sampler serves merged weights.
  c.trainer.trainable = "all"
  c.trainer.lora_rank = 8
  c.trainer.lora_alpha = 16.0
  c.trainer.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")
  # Stop RL with an error once the KL to the start policy (kl_to_start_k3, else kl_ref) passes
  # this bound (None: never).
  c.trainer.max_kl = ml_collections.config_dict.placeholder(float)

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 2e-4
  c.optim.schedule = "constant"
  c.optim.warmup_steps = 0
  c.optim.total_steps = 0
  c.optim.max_grad_norm = 1.0
  c.optim.weight_decay = 0.0

  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 300
  c.sft.num_demos = 160
  c.sft.learning_rate = 3e-3
  c.sft.b2 = 0.999
  c.sft.max_grad_norm = 1.0       # <= 0: no clipping
  c.sft.rows_per_batch = 16
  c.sft.buckets = ()             # sequence buckets of SFT rows (default: trainer.buckets)
  c.sft.micro_batches = 1
  c.sft.check_demos = 0          # demonstrations held out of SFT for the imitation check
  c.sft.check_every = 50
  c.sft.minimal_edits = False    # demonstrations edit the fewest tokens that are unique in the file
  c.sft.short_context_steps = 0  # first steps without the shared system prompt (more demos per step)
  # Stop SFT once this fraction of held-out demos is reproduced (None: never). A typed
  # placeholder, so --config.sft.stop_at_greedy_exact=0.25 works from the command line.
  c.sft.stop_at_greedy_exact = ml_collections.config_dict.placeholder(float)
  c.sft.demos = ""               # a demos.jsonl to train on instead of collecting
  c.sft.share_prompt = ()        # as trainer.share_prompt, for SFT steps (demos share the system prompt)
  # Host memory (MB, float32) for the frozen blocks' output per demonstration (top:K): SFT runs
  # them once per demonstration, then only the trained blocks; past the bound, as without. 0: off.
  c.sft.trunk_cache_mb = 2048
  # SFT steps after which the policy is saved to WORKDIR/sft_checkpoints/step_N (the screen's
  # candidates, experiments.screen), e.g. (20, 40, 80, 160).
  c.sft.save_at = ()

  c.eval = ml_collections.ConfigDict()
  c.eval.before_after = True     # held-out evaluation before and after RL
  c.eval.every = 0               # also every N RL steps (0: never)
  c.eval.samples = 4             # samples per task at the sampling temperature (pass@k)
  c.eval.greedy = True
  c.eval.every_all_sets = False  # eval.every evaluates every held-out set, not only the main one

  # experiments.screen: SFT checkpoints scored on RL-pool bugs under training names.
  c.screen = ml_collections.ConfigDict()
  c.screen.temperatures = (0.6, 0.8, 1.0)
  c.screen.samples = 16          # per bug and temperature (pass@16)
  c.screen.bugs = 32             # RL-pool bugs, one task each
  c.screen.checkpoints = ()      # default: every WORKDIR/sft_checkpoints/step_N

  # experiments.sweep: short RL arms from one SFT start ("NAME key=value ...", trainer.sweep).
  c.sweep = ml_collections.ConfigDict()
  c.sweep.arms = ()
  c.sweep.steps = 10

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 4
  c.checkpoint.keep = 2

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  return c


def accelerator_config(preset: str, *, tasks_per_step: int, samples_per_task: int,
                       max_len: int) -> ml_collections.ConfigDict:
  """An accelerator host or slice: real harnesses in Docker sandboxes, bf16 compute, async RL
  with TIS against the sampler's logprobs, packed rows. Weights come from ``model.checkpoint``."""
  c = base_config()
  c.model.preset = preset
  c.model.remat = True
  c.model.compute_dtype = "bfloat16"
  c.tasks.difficulty = "easy"
  c.harness.name = "mini-swe-agent"
  c.harness.max_turns = 30
  c.harness.timeout_s = 900.0
  c.sandbox.backend = "docker"
  c.sampling.max_tokens = 2048
  c.engine.max_batch = 64
  c.engine.max_len = max_len
  c.engine.prefill_buckets = (256, 1024, 4096)
  c.engine.decode_chunk = 32
  c.rollout.tasks_per_step = tasks_per_step
  c.rollout.samples_per_task = samples_per_task
  c.rollout.concurrency = 64
  c.rollout.overlong = "penalty"
  c.rollout.overlong_buffer = 512
  c.rollout.max_sampled_tokens = 2048
  c.loss.is_correction = "tis"      # bf16 sampler vs learner mismatch
  c.trainer.mode = "async"
  c.trainer.max_staleness = 1
  c.trainer.steps = 200
  c.trainer.buckets = (4096, max_len)
  c.trainer.rows_per_batch = 64
  c.trainer.micro_batches = 8
  c.trainer.pack = True
  c.trainer.logprob_impl = ml_collections.config_dict.placeholder(str)  # None: xla ("pallas" opt-in)
  c.optim.learning_rate = 1e-6
  c.optim.schedule = "warmup"
  c.optim.warmup_steps = 10
  c.sft.steps = 0
  c.eval.every = 20
  c.eval.samples = 4
  c.checkpoint.every = 10
  return c
