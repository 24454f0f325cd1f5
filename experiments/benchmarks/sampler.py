"""Decode throughput of the sampling engine vs ``transformers`` ``generate`` on the same weights.

Creates a random ``small`` policy and saves it as a HF checkpoint (or takes ``--model``: a
preset, an HF directory, a pretrained name such as ``smollm2-135m-instruct``, or a .gguf file),
loads that checkpoint in PyTorch (fp32, CPU), and times greedy generation of the same prompts
with both, at each batch size (end to end: prefill + decode, requests sent from one thread
each; neither side stops early: no stop ids, no eos). Both sides get a warm-up run first; our
engine compiles its bucket shapes before timing. Prints one JSON line with tokens/s and the
ratio per batch size, and how often both picked the same greedy token.

With ``--matmul_peak_n`` (default 2048) it also measures this host's fp32 matmul peak in the same
process and gives, per batch size, the engine's decode-only tokens/s (decoded tokens over the
device thread's seconds in decode calls, from the engine's counters) and the share of the peak
that decoding reached (dense-matmul FLOPs per decoded token: every kernel and the lm head,
plus attention over the context).

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sampler
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sampler --batches 1,16 --new_tokens 128
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sampler --repeats 3 --join_window_s 0
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sampler --model=smollm2-135m-instruct
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sampler --model=smollm2-135m-instruct \
      --batches 1,16,32 --repeats 3 --torch_threads 2

With ``--group G`` it times the GRPO shape instead (``sampler_group``): ``--prompts`` prompts of
``--prompt_len`` tokens, ``G`` samples each at ``--temperature``, all decoded together, against
``generate(num_return_sequences=G)``; ``--attn_steps 128,0`` times the fill-following windows
and the previous power-of-two ones (0) side by side, ``--share_prefix 0,1`` the shared-prompt
decode attention off and on:

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.sampler --model=smollm2-135m-instruct \
      --group 8 --prompts 4 --prompt_len 448 --new_tokens 192 --repeats 3 --torch_threads 2
"""

from __future__ import annotations

import tempfile
import threading
import time

from absl import app, flags

from experiments.benchmarks import common, sampler_group
from experiments.benchmarks.learner_flops import block_matmul_weights
from experiments.benchmarks.learner_tunix.peak import matmul_peak

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models import PRESETS, create_model, from_pretrained, hf_io, pretrained  # noqa: E402
from legorl_jax.sampling import Engine, SamplingParams  # noqa: E402

flags.DEFINE_string("preset", "small", "Same as --model=PRESET.")
flags.DEFINE_string("model", None,
                    "Preset, HF directory, pretrained name or .gguf (default: --preset).")
flags.DEFINE_list("batches", ["1", "16"], "Batch sizes (concurrent requests).")
flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per request.")
flags.DEFINE_integer("new_tokens", 128, "Greedy tokens per request.")
flags.DEFINE_integer("decode_chunk", 16, "Engine decode steps per call.")
flags.DEFINE_integer("repeats", 1, "Alternating timed runs per side (each keeps its best).")
flags.DEFINE_integer("torch_threads", 0, "0: PyTorch's default.")
flags.DEFINE_integer("matmul_peak_n", 2048, "Side of the matmul-peak measurement; 0: none.")
flags.DEFINE_float("join_window_s", None,
                   "Engine(join_window_s=...); default: the engine's; 0: no join window.")
flags.DEFINE_integer("group", 0, "GRPO shape: samples per prompt (0: the plain shape).")
flags.DEFINE_integer("prompts", 4, "GRPO shape: prompts (rows = prompts x group).")
flags.DEFINE_float("temperature", 0.6, "GRPO shape: sampling temperature (no top-k/top-p).")
flags.DEFINE_integer("max_len", 1024, "GRPO shape: engine cache slots per row (the demo's).")
flags.DEFINE_list("attn_steps", ["128"], "GRPO shape: engine window steps to time side by "
                  "side (0: power-of-two windows).")
flags.DEFINE_list("share_prefix", ["0"], "GRPO shape: shared-prompt decode attention off (0) "
                  "and/or on (1), each with every --attn_steps entry, side by side.")
FLAGS = flags.FLAGS


def _engine_run(engine: Engine, prompts, new_tokens: int) -> tuple[float, list]:
  params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
  out = [None] * len(prompts)

  def one(i):
    out[i] = engine.generate(prompts[i], params)

  threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
  t0 = time.perf_counter()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return time.perf_counter() - t0, out


def _hf_run(hf_model, prompts, new_tokens: int) -> tuple[float, np.ndarray]:
  import torch
  ids = torch.tensor(prompts, dtype=torch.long)
  t0 = time.perf_counter()
  with torch.inference_mode():
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                            pad_token_id=0)
  return time.perf_counter() - t0, out[:, ids.shape[1]:].numpy()


def decode_token_flops(mcfg, context: float) -> float | None:
  """Dense-matmul FLOPs of decoding one token at ``context`` tokens of attention: q/k/v/o and
  the MLP of every block, the lm head, and QK^T + PV. None for a MoE policy (its active
  experts vary)."""
  if any(mcfg.is_moe_layer(i) for i in range(mcfg.num_layers)):
    return None
  d, f, v = mcfg.hidden_size, mcfg.intermediate_size, mcfg.vocab_size
  h, hkv, dh, nl = mcfg.num_heads, mcfg.num_kv_heads, mcfg.head_dim, mcfg.num_layers
  return 2.0 * (nl * block_matmul_weights(d, f, h, hkv, dh) + d * v) + 4.0 * nl * h * dh * context


def _load(name: str, seed: int = 0):
  """(our model, the same weights in transformers, what was loaded) for a preset / dir / name."""
  import torch
  from transformers import AutoModelForCausalLM
  if name.lower() in PRESETS:
    model = create_model(name, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
      hf_io.save_pretrained(model, tmp)
      hf_model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    return model, hf_model, f"preset {name} (random weights)"
  path = pretrained.resolve_pretrained(name)
  hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
  return from_pretrained(path), hf_model, str(path)


def main(argv):
  del argv
  args = FLAGS
  import torch
  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)

  batches = [int(b) for b in args.batches]
  model, hf_model, loaded = _load(args.model or args.preset)
  hf_model.generation_config.eos_token_id = None  # generate all new_tokens, as the engine does
  if args.group:
    name = args.model or args.preset
    result = dict(benchmark="sampler", model=name, loaded=loaded,
                  params=model.config.num_params(), torch_threads=torch.get_num_threads(),
                  backend=jax.default_backend())
    result.update(sampler_group.run(
        model, hf_model, prompts=args.prompts, group=args.group, prompt_len=args.prompt_len,
        new_tokens=args.new_tokens, temperature=args.temperature, repeats=args.repeats,
        max_len=args.max_len, attn_steps=[int(s) for s in args.attn_steps],
        decode_chunk=args.decode_chunk,
        share_prefix=tuple(bool(int(s)) for s in args.share_prefix)))
    result["load_avg_1m"] = common.load_avg_1m()
    common.emit(result)
    return

  max_len = 1 << (args.prompt_len + args.new_tokens - 1).bit_length()
  engine = Engine(model, max_batch=max(batches), max_len=max_len,
                  prefill_buckets=(args.prompt_len,), prefill_rows=(1, 4),
                  decode_chunk=args.decode_chunk,
                  **({} if args.join_window_s is None else dict(join_window_s=args.join_window_s)))
  rng = np.random.default_rng(0)
  name = args.model or args.preset
  result = dict(benchmark="sampler", preset=name if name.lower() in PRESETS else None,
                model=name, loaded=loaded,
                params=model.config.num_params(), prompt_len=args.prompt_len,
                new_tokens=args.new_tokens, decode_chunk=args.decode_chunk,
                torch_threads=torch.get_num_threads(), backend=jax.default_backend(),
                join_window_s=engine.join_window_s)
  peak = matmul_peak(args.matmul_peak_n, 5)[0] if args.matmul_peak_n else None
  if peak:
    result["matmul_peak_gflops"] = round(peak / 1e9, 2)
  # Decoding attends to the prompt plus half the new tokens, on average.
  flops_tok = decode_token_flops(model.config, args.prompt_len + args.new_tokens / 2)
  agree = []
  engine.warmup()  # compiles every bucket shape up front
  reused = 0
  with engine:
    for b in batches:
      def fresh():  # new prompts each run: nothing of a timed prompt is cached beforehand
        return rng.integers(0, model.config.vocab_size, (b, args.prompt_len)).tolist()
      warm = fresh()
      _engine_run(engine, warm, 8)  # warm-up runs
      _hf_run(hf_model, warm, 8)
      runs, hf_runs, decode_rates = [], [], []
      for _ in range(args.repeats):  # alternate, so that other load hits both sides alike
        prompts = fresh()
        before = engine.stats()
        ours, outs = _engine_run(engine, prompts, args.new_tokens)
        after = engine.stats()
        reused += after["reused_tokens"] - before["reused_tokens"]
        decode_rates.append((after["decoded_tokens"] - before["decoded_tokens"])
                            / max(after["decode_s"] - before["decode_s"], 1e-9))
        theirs, ref = _hf_run(hf_model, prompts, args.new_tokens)
        runs.append(ours)
        hf_runs.append(theirs)
        agree.append(float(np.mean(np.array([o.token_ids for o in outs]) == ref)))
      ours, theirs = min(runs), min(hf_runs)
      n = b * args.new_tokens
      result[f"b{b}_tok_s"] = round(n / ours, 1)
      result[f"b{b}_hf_tok_s"] = round(n / theirs, 1)
      result[f"b{b}_speedup"] = round(theirs / ours, 2)
      result[f"b{b}_decode_tok_s"] = round(max(decode_rates), 1)
      if peak and flops_tok:
        result[f"b{b}_decode_frac_of_matmul_peak"] = round(max(decode_rates) * flops_tok / peak, 4)
  result["greedy_token_agreement"] = round(min(agree), 4)
  result["compilations"] = engine.stats()["compilations"]
  result["reused_prompt_tokens_timed"] = reused  # 0: every timed prompt was prefilled in full
  result["load_avg_1m"] = common.load_avg_1m()
  common.emit(result)


if __name__ == "__main__":
  app.run(main)
