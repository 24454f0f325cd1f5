"""Supervised warm start from recorded trajectories (e.g. scripted demonstrations).

Demonstrations are collected through the real harness and proxy, so the policy learns the
exact token sequences the harness will show it. The loss is the token-mean negative
log-likelihood of the sampled (loss-mask 1) tokens: REINFORCE with advantage 1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Callable, Sequence

import numpy as np

from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
from legorl_jax.rewards import status as st
from legorl_jax.trainer import batching
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.trainer import config_check, rl_loop
from legorl_jax.trainer.policy_service import scripted_proxy
from legorl_jax.trainer.trunk_cache import TrunkCache

log = logging.getLogger(__name__)


def collect_demonstrations(tasks: Sequence, adapter_for: Callable, tokenizer,
                           trial_cfg: TrialConfig, out_dir: str, socket_dir: str,
                           concurrency: int = 2, minimal_edits: bool = False) -> list[Trajectory]:
  """Runs the scripted gold-patch policy through ``adapter_for(task)`` on ``tasks``; returns the
  trajectories of solved trials (and writes them to ``out_dir/demos.jsonl``). With
  ``minimal_edits`` its edit-tool calls name only the changed tokens and enough context to be
  unique in the file (``scripted.minimal_edit``) instead of whole lines."""
  policy = ScriptedPolicy(patches_by_instruction(tasks), minimal_edits=minimal_edits)
  proxy = scripted_proxy(tokenizer, policy.reply, socket_dir, name="demos")
  try:
    results = run_trials([TrialJob(t, adapter_for(t), group=i) for i, t in enumerate(tasks)], proxy,
                         trial_cfg, out_dir, concurrency=concurrency, max_retries=2)
  finally:
    proxy.stop()
  demos = [r.trajectory for r in results if r.status == st.SOLVED and r.trajectory]
  with open(os.path.join(out_dir, "demos.jsonl"), "w") as f:
    for d in demos:
      f.write(json.dumps(d.demonstration_json()) + "\n")
  log.info("collected %d/%d solved demonstrations", len(demos), len(results))
  return demos


def load_demonstrations(path: str) -> list[Trajectory]:
  """Trajectories from a ``demos.jsonl`` (one ``{"segments": [...]}`` per line)."""
  with open(path) as f:
    return [Trajectory.from_json(json.loads(line), f"{path} line {i + 1}")
            for i, line in enumerate(f) if line.strip()]


def imitation_check(learner, demos: Sequence[Trajectory], cfg) -> dict[str, float]:
  """How well the policy reproduces demonstrations it was not trained on.

  Probabilities are the learner's, at ``loss.temperature`` (the temperature rollouts sample
  at, which SFT also fits: see ``pipeline.sft_config``). ``greedy_exact``: fraction of
  demonstrations whose every token has probability > 1/2 (so it is the argmax, and greedy
  decoding reproduces them exactly); ``p_exact``: mean probability that sampling at
  ``loss.temperature`` reproduces one exactly; ``nll``: token NLL at that temperature. On renamed task variants this says
  whether the policy copies names from the prompt (what transfers to new tasks), as opposed to
  recalling training tasks.
  """
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, advantage=1.0)]
  batches, _ = batching.make_batches(seqs, buckets=tuple(cfg.trainer.buckets),
                                     rows_per_batch=int(cfg.trainer.rows_per_batch))
  seq_logp, exact, n_tok = [], [], 0
  for b in batches:
    logp, _ = learner.logprobs(b)
    for row in range(logp.shape[0]):
      m = b["loss_mask"][row] > 0
      if m.any():
        seq_logp.append(float(logp[row][m].sum()))
        exact.append(bool((logp[row][m] > np.log(0.5)).all()))
        n_tok += int(m.sum())
  if not seq_logp:
    return {}
  return {"greedy_exact": float(np.mean(exact)), "p_exact": float(np.mean(np.exp(seq_logp))),
          "nll": -float(np.sum(seq_logp)) / max(n_tok, 1)}


def without_shared_prefix(seqs: Sequence[batching.TrainSequence]) -> list[batching.TrainSequence]:
  """``seqs`` with the prompt prefix they all share (the harness's system prompt and tool list)
  cut off, back to the start of the message it ends in (a token equal to each sequence's first,
  the chat template's message-start token). Positions restart at 0 in training rows; attention
  (RoPE) only sees relative positions, so what is learned about the rest carries over."""
  if len(seqs) < 2:
    return list(seqs)
  first = seqs[0].token_ids
  n = min(len(s.token_ids) for s in seqs)
  common = 0
  while (common < n and all(s.token_ids[common] == first[common] and not s.loss_mask[common] for s in seqs)):
    common += 1
  cut = max((i for i in range(1, common) if first[i] == first[0]), default=0)
  return [dataclasses.replace(s, token_ids=s.token_ids[cut:], loss_mask=s.loss_mask[cut:],
                              logprobs=s.logprobs[cut:],
                              routes=None if s.routes is None else s.routes[cut:]) for s in seqs]


def _bucketed(seqs, buckets) -> tuple[list[list], np.ndarray]:
  """(the sequences of each bucket that holds any, in bucket order; their shares of the draws)."""
  by_bucket: dict[int, list] = {}
  for s in seqs:
    by_bucket.setdefault(next((b for b in buckets if len(s.token_ids) <= b), buckets[-1]), []).append(s)
  pools = [by_bucket[b] for b in sorted(by_bucket)]
  sizes = np.array([len(p) for p in pools], np.float64)
  return pools, sizes / sizes.sum()


def _trunk_cache(learner, seqs, cfg, shared, plain_phase, budget_mb) -> TrunkCache | None:
  """A filled ``TrunkCache`` of ``seqs`` (each distinct one once, laid out as the training
  steps lay them out, so the trunk compiles for their shapes only), or None when it is off or
  nothing below the trained blocks is frozen."""
  if budget_mb is None:
    budget_mb = float((cfg.get("sft", None) or {}).get("trunk_cache_mb", 0) or 0)
  if budget_mb <= 0:
    return None
  if not hasattr(learner, "trunk_states") or learner.trunk_layer <= 0:
    log.info("SFT trunk cache off: %s", "no frozen blocks below the trained ones"
             if hasattr(learner, "trunk_states") else "the learner is sharded over a mesh")
    return None
  distinct = list({tuple(s.token_ids): s for s in seqs}.values())
  if shared is not None:
    batches, _ = rl_loop.grouped_then_plain(distinct, cfg)
  else:
    _, rows, buckets = plain_phase
    batches, _ = batching.make_batches(distinct, buckets=buckets, rows_per_batch=rows,
                                       pack=bool(cfg.trainer.get("pack", False)))
  cache = TrunkCache(learner.trunk_states, budget_mb)
  cache.fill(batches)
  log.info("SFT trunk cache: %d of %d distinct sequences (%.0f MB, below block %d) in %.1f s",
           cache.sequences, len(distinct), cache.bytes / 2**20, learner.trunk_layer, cache.fill_s)
  if cache.over_budget:
    log.warning("SFT trunk cache: %d sequences past sft.trunk_cache_mb=%g are not stored; steps "
                "that draw them run the frozen blocks as without the cache (exact, slower)",
                cache.over_budget, budget_mb)
  return cache


def run_sft(learner, demos: Sequence[Trajectory], cfg, *, steps: int, seed: int = 0,
            on_step: Callable[[int, dict], None] | None = None,
            max_seconds: float | None = None, check_demos: Sequence[Trajectory] = (),
            check_every: int = 50, stop_at_greedy_exact: float | None = None,
            short_context_steps: int = 0, trunk_cache_mb: float | None = None) -> dict:
  """``steps`` updates on demonstration sequences sampled (seeded) with replacement, or fewer
  when ``max_seconds`` of wall time run out first (for equal-time baselines).

  With ``check_demos``, every ``check_every`` steps (and at the end) ``imitation_check`` runs on
  them (reported as ``check/...``); training stops early once ``greedy_exact`` reaches
  ``stop_at_greedy_exact``. ``learner`` must be built with ``loss.name = "reinforce"`` (NLL at
  advantage 1).

  The first ``short_context_steps`` steps train on the sequences without their shared prompt
  prefix (``without_shared_prefix``), in rows a power of two long, with proportionally more
  rows per step (about the same tokens per step). With a long fixed system prompt that means
  several times more demonstrations per step: a small policy learns to copy names from the
  instruction only after it has seen enough of them (a sudden drop of the loss on copied
  tokens, after a number of examples rather than of tokens).

  With ``trainer.share_prompt`` (``sft.share_prompt`` in a run config), every later step draws
  ``branches * rows_per_batch`` sequences and lays them out as rows of one shared system
  prompt and ``branches`` demonstrations (``batching.make_grouped_batches``), the prompt
  computed once per row.

  With ``trunk_cache_mb`` > 0 (default: ``sft.trunk_cache_mb`` of ``cfg``, else 0) and a
  frozen trunk (``trainer.trainable = "top:K"``), the frozen blocks run once per distinct
  demonstration sequence before the first step and later steps run only the trained blocks
  and the head on the stored states (``trunk_cache``): the same losses, faster. Sequences past
  the bound are not stored; a batch that holds one trains as without the cache.
  """
  seqs = [s for d in demos for s in batching.sequences_from_trajectory(d, advantage=1.0)]
  if not seqs:
    raise ValueError("no demonstration sequences to train on (did every demo trial fail?)")
  rng = np.random.default_rng(seed)
  rows = int(cfg.trainer.rows_per_batch)
  buckets = sorted(int(b) for b in cfg.trainer.buckets)
  shared = config_check.share_prompt_layout(cfg.trainer.get("share_prompt", ()), "sft.share_prompt")
  short_phase = plain_phase = None  # (pools, their shares of the draws), rows, buckets
  if short_context_steps > 0:
    short = without_shared_prefix(seqs)
    short_len = 1 << max(int(np.ceil(np.log2(max(len(s.token_ids) for s in short)))), 4)
    micro = int(cfg.trainer.get("micro_batches", 1))
    short_rows = max(micro, rows * buckets[0] // short_len // micro * micro)
    short_phase = (_bucketed(short, [short_len]), short_rows, (short_len,))
  if shared is None:
    # One bucket per step, drawn in proportion to its sequences: every update is one full batch
    # of one shape (no padding rows of a second, longer bucket).
    plain_phase = (_bucketed(seqs, buckets), rows, tuple(buckets))
  last = {}
  t0 = time.perf_counter()
  cache = _trunk_cache(learner, seqs, cfg, shared, plain_phase, trunk_cache_mb)
  for step in range(steps):
    if max_seconds is not None and time.perf_counter() - t0 >= max_seconds:
      break
    if step >= short_context_steps and shared is not None:
      # rows of one system prompt and ``branches`` demonstrations each
      pick = [seqs[i] for i in rng.integers(0, len(seqs), shared[2] * shared[3])]
      batches, _ = rl_loop.grouped_then_plain(pick, cfg)
    else:
      (pools, shares), n_rows, phase_buckets = short_phase if step < short_context_steps else plain_phase
      pool = pools[rng.choice(len(pools), p=shares)]
      pick = [pool[i] for i in rng.integers(0, len(pool), n_rows)]
      batches, _ = batching.make_batches(pick, buckets=phase_buckets, rows_per_batch=n_rows,
                                         pack=bool(cfg.trainer.get("pack", False)))
    if cache is not None:
      batches = [cache.attach(b) or b for b in batches]
    last = learner.update(batches)
    if cache is not None:
      last.update(cache.metrics())
    last["nll"] = last.get("loss/policy", 0.0)  # REINFORCE at advantage 1 is the token NLL
    last["sft_step"] = step + 1
    done = step == steps - 1
    if check_demos and ((step + 1) % max(1, int(check_every)) == 0 or done):
      last.update({f"check/{k}": v for k, v in imitation_check(learner, check_demos, cfg).items()})
      if stop_at_greedy_exact is not None and last.get("check/greedy_exact", 0.0) >= stop_at_greedy_exact:
        done = True
    if on_step is not None:
      on_step(step, last)
    if done:
      break
  return last
