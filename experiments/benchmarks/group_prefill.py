"""Group prefill: one RL step's rollout requests with the prefix cache on and off, in one run.

The demo configuration's step (``experiments/configs/demo.py``): 8 tasks x 8 samples in the
built-in harness. Every trial's first request is the harness's own (its system prompt, its
tool schemas and the task's instruction, rendered by the proxy's chat renderer with the
model's tokenizer), sampled with the demo's engine settings (``engine.max_batch`` rows,
``prefill_chunk`` 64, ``sampling.max_tokens``, temperature 1, one seed per trial). The 64
requests are submitted together from 64 threads, as the rollout's concurrent trials send
them. The policy is the model itself (``--model``: a preset, an HF directory or a pretrained
name). Later turns are each trial's own (one session per trial) and gain nothing from the
cache across trials, so the step's first turn is what is measured. An untimed pass compiles
every shape first (``compilations_during_timing`` must be 0); the two timed passes use other
seeds. Prints one JSON line.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.group_prefill                # tiny
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.group_prefill --model=smollm2-135m-instruct
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import time

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402

from experiments.configs import demo  # noqa: E402
from legorl_jax.harnesses.builtin_agent import SYSTEM_PROMPT, TOOLS  # noqa: E402
from legorl_jax.models import create_model, from_pretrained  # noqa: E402
from legorl_jax.models.config import PRESETS  # noqa: E402
from legorl_jax.models.tokenizer import load_tokenizer  # noqa: E402
from legorl_jax.proxy import openai_chat  # noqa: E402
from legorl_jax.proxy.render import ChatRenderer  # noqa: E402
from legorl_jax.sampling import Engine, SamplingParams, steps  # noqa: E402
from legorl_jax.taskgen import synthetic  # noqa: E402
from legorl_jax.models import tokenizer as tokenization  # noqa: E402

flags.DEFINE_string("model", "tiny", "Preset, HF directory or pretrained name.")
flags.DEFINE_integer("max_tokens", None, "Sampled tokens per request (default: the demo's).")
FLAGS = flags.FLAGS


def load(name: str):
  """(model, tokenizer) for a preset, an HF directory or a pretrained name."""
  if name in PRESETS:
    return create_model(name, seed=0), load_tokenizer(None)
  path = pathlib.Path(name).expanduser()
  if not path.is_dir():
    from legorl_jax.models.pretrained import resolve_pretrained
    path = resolve_pretrained(name)
  return from_pretrained(path), load_tokenizer(path)


def prompts(cfg, tokenizer) -> list[list[int]]:
  """The first request of each of the step's tasks, as the proxy renders it."""
  tasks = synthetic.generate_tasks(int(cfg.rollout.tasks_per_step), seed=int(cfg.seed),
                                   difficulty=cfg.tasks.difficulty, split="train",
                                   variants=int(cfg.tasks.variants))
  renderer = ChatRenderer(tokenizer)
  out = []
  for task in tasks:
    body = {"model": "policy", "tools": TOOLS, "max_tokens": int(cfg.sampling.max_tokens),
            "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": task.instruction}]}
    out.append(renderer.render(openai_chat.parse(body)))
  return out


def rollout(engine, reqs) -> tuple[float, list]:
  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
    comps = list(pool.map(lambda r: engine.generate(*r, timeout=3600), reqs))
  return time.perf_counter() - t0, comps


def main(argv):
  del argv
  args = FLAGS
  cfg = demo.get_config()
  model, tokenizer = load(args.model)
  n = int(cfg.rollout.samples_per_task)
  special = tokenization.special_token_ids(tokenizer)
  stop = tuple(sorted({t for t in (special["im_end"], special["eos"]) if t is not None}))
  max_tokens = args.max_tokens or int(cfg.sampling.max_tokens)
  task_prompts = prompts(cfg, tokenizer)

  def requests(seed0):
    return [(p, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed0 + 100 * g + s,
                               stop_token_ids=stop))
            for g, p in enumerate(task_prompts) for s in range(n)]

  kw = dict(max_batch=int(cfg.engine.max_batch), max_len=int(cfg.engine.max_len),
            prefill_chunk=min(cfg.engine.prefill_buckets),
            decode_chunk=int(cfg.engine.decode_chunk),
            max_stop_ids=8)
  result = dict(benchmark="group_prefill", model=args.model, tasks=len(task_prompts),
                samples_per_task=n, prompt_tokens=[len(p) for p in task_prompts],
                max_tokens=max_tokens, max_batch=kw["max_batch"], backend=jax.default_backend())
  with Engine(model, prefix_reuse=True, **kw) as on, Engine(model, prefix_reuse=False, **kw) as off:
    rollout(on, requests(10_000))  # compiles what the timed passes use
    rollout(off, requests(20_000))
    compiled = sum(steps.COMPILATIONS.values())
    timed = {}
    for tag, eng in (("off", off), ("on", on)):
      before = eng.stats()
      secs, comps = rollout(eng, requests(0))
      after = eng.stats()
      timed[tag] = comps
      result[f"{tag}_rollout_s"] = round(secs, 2)
      result[f"{tag}_prefill_tokens"] = after["prefill_tokens"] - before["prefill_tokens"]
      result[f"{tag}_cached_prompt_tokens"] = after["reused_tokens"] - before["reused_tokens"]
      result[f"{tag}_decoded_tokens"] = after["decoded_tokens"] - before["decoded_tokens"]
  result["compilations_during_timing"] = sum(steps.COMPILATIONS.values()) - compiled
  # Decode shapes (rows x window) follow the batching, which the cache changes; XLA's decode
  # results differ in the last bits between shapes, so equality is reported, not assumed.
  pairs = list(zip(timed["on"], timed["off"]))
  result["bit_identical"] = all(a.token_ids == b.token_ids and a.logprobs == b.logprobs
                                for a, b in pairs)
  result["token_ids_identical"] = sum(a.token_ids == b.token_ids for a, b in pairs)
  result["max_abs_dlogp_same_ids"] = max(
      (abs(x - y) for a, b in pairs if a.token_ids == b.token_ids
       for x, y in zip(a.logprobs, b.logprobs)), default=0.0)
  result["fewer_prefilled_x"] = round(result["off_prefill_tokens"]
                                      / max(1, result["on_prefill_tokens"]), 2)
  result["speedup"] = round(result["off_rollout_s"] / result["on_rollout_s"], 2)
  result["load_avg_1m"] = common.load_avg_1m()
  common.emit(result)


if __name__ == "__main__":
  app.run(main)
