"""The learner benchmarks' fixed GRPO batch and learner config (``learner.py``,
``cpu_library_fusion.py``): one copy, in a module without flags, so each script defines its own.
"""


def grpo_batch(vocab: int, b: int, prompt_len: int, completion_len: int, group: int,
               share: bool):
  """The benchmark's fixed GRPO batch: ``b`` rows of random tokens, loss on the completion,
  each ``group`` consecutive rows sharing their prompt. With ``share``, laid out as the learner
  receives a GRPO batch with ``trainer.share_prompt``: one row per group, the prompt once.

  Returns (numpy batch of ``[rows, width]`` arrays, ``shared_prefix`` layout or None).
  """
  import numpy as np
  from legorl_jax.trainer import batching
  rng = np.random.default_rng(0)
  t, tp = prompt_len + completion_len, prompt_len
  ids = rng.integers(2, vocab, (b, t)).astype(np.int32)
  ids[:, :tp] = ids[(np.arange(b) // group) * group, :tp]  # a group shares its prompt
  adv = np.repeat(rng.standard_normal((b, 1)), t, 1).astype(np.float32)
  batch = {"input_ids": ids, "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)),
           "segment_ids": np.ones((b, t), np.int32),
           "loss_mask": (np.arange(t)[None, :] >= tp).repeat(b, 0).astype(np.float32),
           "advantages": adv, "rollout_logp": np.zeros((b, t), np.float32)}
  if not share:
    return batch, None
  seqs = [batching.TrainSequence(list(ids[i]), list(batch["loss_mask"][i].astype(int)),
                                 [0.0] * t, float(adv[i, 0])) for i in range(b)]
  grouped, rest, _ = batching.make_grouped_batches(
      seqs, prefix_len=tp - 1, branch_len=completion_len + 1, branches=group,
      rows_per_batch=b // group)
  assert len(grouped) == 1 and not rest
  return batching.split_layout(grouped[0])


def grpo_config(micro_batches: int, *, aggregation: str = "seq-mean-token-mean",
                clip_eps: float = 0.2, lr: float = 1e-6, max_grad_norm: float = 1.0,
                cpu_library_fusion: str = "dot"):
  """The learner config our side runs: GRPO loss, AdamW at a constant rate, fused lm head."""
  import ml_collections
  cfg = ml_collections.ConfigDict()
  cfg.loss = ml_collections.ConfigDict(dict(
      name="grpo", temperature=1.0, aggregation=aggregation, clip_eps_low=clip_eps,
      clip_eps_high=clip_eps, vf_coef=0.0))
  cfg.trainer = ml_collections.ConfigDict(dict(micro_batches=micro_batches, logprob_impl="xla",
                                               cpu_library_fusion=cpu_library_fusion))
  cfg.optim = ml_collections.ConfigDict(dict(learning_rate=lr, schedule="constant",
                                             max_grad_norm=max_grad_norm))
  return cfg
