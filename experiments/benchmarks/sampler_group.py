"""The GRPO shape of ``experiments.benchmarks.sampler``: groups of samples behind one prompt.

An RL step samples ``G`` completions of each task prompt at the rollout temperature; the
engine prefills each prompt once (its prefix cache) and decodes all ``P x G`` rows together.
``transformers`` gets the same job as ``generate(num_return_sequences=G, do_sample=True)``
on the same weights and prompts, with the same temperature and no truncation (top-k and
top-p off). Neither side stops early. Repeats alternate the two sides on fresh prompts, so
load from elsewhere hits both alike, and medians are reported. The engine's first run (its
compiles included) is timed apart as the first-call cost, with the count of shapes compiled.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from legorl_jax.sampling import Engine, SamplingParams
from legorl_jax.sampling.buckets import geometric
from legorl_jax.sampling.steps import COMPILATIONS


def make_engine(model, rows: int, max_len: int, attn_step: int, decode_chunk: int,
                prefill_chunk: int = 64, share_prefix: bool = False) -> Engine:
  """The demo's engine layout (``experiments/configs/demo.py``): ``rows`` cache rows,
  ``max_len`` slots, a 64-token prefill chunk, the prefix cache on. ``attn_step=0`` gives the
  previous power-of-two windows (the baseline of the window change); ``share_prefix`` the
  shared-prompt decode attention (``sampling.shared_prefix``)."""
  windows = None if attn_step else geometric(min(128, max_len), max_len, 2)
  return Engine(model, max_batch=rows, max_len=max_len, prefill_chunk=prefill_chunk,
                decode_chunk=decode_chunk, attn_buckets=windows, attn_step=attn_step or 128,
                seed=0, share_prefix=share_prefix)


def engine_run(engine: Engine, prompts: list[list[int]], group: int, new_tokens: int,
               temperature: float, seed: int) -> dict:
  """Samples ``group`` completions of each prompt at once; wall time and the engine's
  decode/prefill counters over the run."""
  before = engine.stats()
  t0 = time.perf_counter()
  futures = []
  for p, prompt in enumerate(prompts):
    for g in range(group):
      sp = SamplingParams(temperature=temperature, max_tokens=new_tokens,
                          seed=seed * 100_003 + p * group + g)
      futures.append(engine.submit(prompt, sp))
  outs = [f.result() for f in futures]
  wall = time.perf_counter() - t0
  after = engine.stats()
  d = {k: after[k] - before[k] for k in ("decode_s", "prefill_s", "decoded_tokens",
                                         "live_row_steps", "prefill_tokens", "reused_tokens")}
  rows = len(futures)
  assert all(len(o.token_ids) == new_tokens for o in outs), "a row stopped early"
  # Steps of the decode loop: every row lives for new_tokens steps, all rows together.
  steps = d["live_row_steps"] / rows
  return dict(wall_s=wall, decode_s=d["decode_s"], prefill_s=d["prefill_s"],
              decode_steps=steps, decoded_tokens=d["decoded_tokens"],
              prefill_tokens=d["prefill_tokens"], reused_tokens=d["reused_tokens"],
              token_ids=np.array([o.token_ids for o in outs]))


def hf_run(hf_model, prompts: list[list[int]], group: int, new_tokens: int,
           temperature: float, seed: int) -> dict:
  """``generate`` with ``num_return_sequences=group``: transformers copies each prompt ``group``
  times before its prefill, then samples every row."""
  import torch
  torch.manual_seed(seed)
  ids = torch.tensor(prompts, dtype=torch.long)
  t0 = time.perf_counter()
  with torch.inference_mode():
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                            temperature=temperature, top_k=0, top_p=1.0,
                            num_return_sequences=group, max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, pad_token_id=0)
  wall = time.perf_counter() - t0
  assert out.shape == (len(prompts) * group, ids.shape[1] + new_tokens)
  return dict(wall_s=wall)


def run(model, hf_model, *, prompts: int, group: int, prompt_len: int, new_tokens: int,
        temperature: float, repeats: int, max_len: int, attn_steps: list[int],
        decode_chunk: int, share_prefix: tuple[bool, ...] = (False,)) -> dict:
  """Times each engine variant (one per ``attn_steps`` x ``share_prefix`` pair) and
  ``generate``, alternating; returns the JSON fields (medians)."""
  rows = prompts * group
  if prompt_len + new_tokens > max_len:
    raise ValueError(f"--prompt_len + --new_tokens must fit --max_len={max_len}.")
  rng = np.random.default_rng(0)
  vocab = model.config.vocab_size

  def fresh():  # new prompts every run: nothing of a timed prompt is cached beforehand
    return rng.integers(0, vocab, (prompts, prompt_len)).tolist()

  out = dict(shape="group", prompts=prompts, group=group, rows=rows, prompt_len=prompt_len,
             new_tokens=new_tokens, temperature=temperature, max_len=max_len,
             decode_chunk=decode_chunk, repeats=repeats)
  engines = {}
  for step, share in ((a, s) for s in share_prefix for a in attn_steps):
    eng = make_engine(model, rows, max_len, step, decode_chunk, share_prefix=share).start()
    before, t0 = sum(COMPILATIONS.values()), time.perf_counter()
    engine_run(eng, fresh(), group, new_tokens, temperature, seed=1)  # cold: compiles
    tag = (f"attn{step}" if step else "attn_pow2") + ("_shared" if share else "")
    out[f"{tag}_windows"] = list(eng.attn_buckets)
    out[f"{tag}_first_call_s"] = round(time.perf_counter() - t0, 2)
    out[f"{tag}_compiled_shapes"] = sum(COMPILATIONS.values()) - before
    engines[tag] = eng
  hf_run(hf_model, fresh()[:1], group, 8, temperature, seed=1)  # warm-up
  runs: dict[str, list[dict]] = {tag: [] for tag in [*engines, "hf"]}
  before = sum(COMPILATIONS.values())
  for r in range(repeats):
    batch = fresh()
    for tag, eng in engines.items():
      runs[tag].append(engine_run(eng, batch, group, new_tokens, temperature, seed=2 + r))
    runs["hf"].append(hf_run(hf_model, batch, group, new_tokens, temperature, seed=2 + r))
  for eng in engines.values():
    eng.stop()
  # Shapes first met in a timed run (a different admission order than the cold run's).
  out["compiled_while_timed"] = sum(COMPILATIONS.values()) - before

  med = lambda xs: statistics.median(xs)  # noqa: E731
  hf_wall = med([x["wall_s"] for x in runs["hf"]])
  n = rows * new_tokens
  out["hf_tok_s"] = round(n / hf_wall, 1)
  out["hf_ms_per_step"] = round(1000 * hf_wall / new_tokens, 1)  # prefill included
  for tag in engines:
    rs = runs[tag]
    wall = med([x["wall_s"] for x in rs])
    out[f"{tag}_tok_s"] = round(n / wall, 1)
    out[f"{tag}_speedup_vs_hf"] = round(hf_wall / wall, 2)
    out[f"{tag}_decode_ms_per_step"] = round(
        1000 * med([x["decode_s"] / x["decode_steps"] for x in rs]), 1)
    out[f"{tag}_decode_tok_s"] = round(med([x["decoded_tokens"] / x["decode_s"] for x in rs]), 1)
    out[f"{tag}_prefill_s"] = round(med([x["prefill_s"] for x in rs]), 2)
    out[f"{tag}_prefilled_tokens"] = int(med([x["prefill_tokens"] for x in rs]))
    out[f"{tag}_walls_s"] = [round(x["wall_s"], 2) for x in rs]
  out["hf_walls_s"] = [round(x["wall_s"], 2) for x in runs["hf"]]
  if len(engines) > 1:  # the variants sample the same tokens (same seeds, same positions)
    a, b = (runs[t] for t in list(engines)[:2])
    out["variants_same_tokens"] = round(float(np.mean(
        [np.mean(x["token_ids"] == y["token_ids"]) for x, y in zip(a, b)])), 4)
  return out
