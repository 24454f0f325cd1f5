"""Time of one sampler decode step by rows and attention window, and what it is bound by.

Runs the engine's compiled decode loop (``sampling.steps.decode_steps``, ``--decode_chunk``
steps per call) on a cache whose rows sit just below the end of each window, and prints the
median milliseconds per step with the bytes a step must read: the weights once, plus each
row's K/V window. The weights' share is what a one-row step costs at the smallest window; the
rest grows with the window. ``--baseline_head`` also times, alternating in the same process,
the tied output head computed through the transposed embedding (``x @ embed.T``, the previous
formulation; the current one contracts the embedding's own minor axis). ``--baseline_sampling``
likewise times the previous token sampler (``jnp.argmax``, and the inverse-CDF draw's passes over
the vocabulary run even when every row is greedy). ``--fused`` also times the step with
q|k|v and gate|up fused into one matmul each (``sampling.fused``; the engine's default is
separate kernels, which measured no slower here). ``--xla_options`` adds variants of the
current step compiled with XLA:CPU options (``name:option=value+option=value``, repeatable;
``jit(...).lower().compile(compiler_options=)``), timed alternating with the rest in the same
process. ``--shared G:P`` also times the shared-prompt attention (``sampling.shared_prefix``):
the rows in ``G`` groups whose prompts agree on their first ``P`` positions. Prints one JSON line.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --rows 1 --windows 256,1024,2048,4096
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --rows 16 --windows 512 --baseline_head
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --rows 16 --windows 128,256 --baseline_sampling
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --preset smollm2-135m --rows 32 \
      --windows 256,512,1024 --temperature 0.6
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --preset smollm2-135m --rows 32 \
      --windows 640 --temperature 0.6 --fused --repeats 20
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --preset smollm2-135m --rows 32 \
      --windows 640 --temperature 0.6 --shared 4:384
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.decode_step --preset smollm2-135m --rows 32 \
      --windows 640 --temperature 0.6 --xla_options onednn:xla_cpu_use_onednn=true \
      --xla_options ynn_dot:xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT
"""

from __future__ import annotations

import time

from absl import app, flags

from experiments.benchmarks import common
from experiments.benchmarks import op_profile

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from legorl_jax.models import create_model  # noqa: E402
from legorl_jax.models import decoder as decoder_lib  # noqa: E402
from legorl_jax.sampling import fused as fused_lib  # noqa: E402
from legorl_jax.sampling import sample as sample_lib  # noqa: E402
from legorl_jax.sampling import shared_prefix  # noqa: E402
from legorl_jax.sampling import steps  # noqa: E402
from legorl_jax.sampling.cache import SCRATCH, Cache  # noqa: E402

flags.DEFINE_string("preset", "small", "Model preset (random weights).")
flags.DEFINE_integer("rows", 1, "Rows decoded per step.")
flags.DEFINE_list("windows", ["256", "1024", "2048", "4096"], "Attention windows to time.")
flags.DEFINE_integer("decode_chunk", 16, "Decode steps per call.")
flags.DEFINE_float("temperature", 0.0, "Every row's sampling temperature (0: greedy; the RL "
                   "demo samples at 0.6, which draws from the full vocabulary).")
flags.DEFINE_integer("repeats", 10, "Timed calls per window and variant.")
flags.DEFINE_string("profile_dir", None, "Also run each window's current decode under "
                    "jax.profiler here and report where a step's op time goes (op_profile).")
flags.DEFINE_bool("baseline_head", False, "Also time the tied head through embed.T.")
flags.DEFINE_bool("baseline_sampling", False, "Also time the previous token sampler.")
flags.DEFINE_bool("fused", False, "Also time q|k|v and gate|up fused into one matmul each.")
flags.DEFINE_multi_string("xla_options", [], "A variant NAME:OPTION=VALUE+OPTION=VALUE of the "
                          "current step compiled with those XLA compiler options (repeatable).")
flags.DEFINE_string("shared", None, "G:P: also time shared-prompt attention, the rows in G "
                    "groups sharing positions [0, P) (a window size below each window).")
FLAGS = flags.FLAGS


def head_through_transpose(self, hidden):
  """The previous tied head: [..., D] @ embed.T [D, V] -> float32 [..., V]."""
  w = self.embed[...].T.astype(hidden.dtype)
  return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def previous_sample_tokens(logits, keys, temperature, top_p, top_k):
  """The previous sampler, for ``--baseline_sampling``: same ids and logprobs; XLA's variadic
  argmax reduction, and the draw computed for every batch."""
  logits = logits.astype(jnp.float32)
  greedy = temperature <= sample_lib.GREEDY_EPS
  scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
  logp_all = jax.nn.log_softmax(scaled, axis=-1)
  needs_trunc = jnp.any(~greedy & ((top_p < 1.0) | (top_k > 0)))
  allowed = jax.lax.cond(needs_trunc, lambda: sample_lib.truncation_mask(scaled, top_p, top_k),
                         lambda: jnp.ones(scaled.shape, bool))
  cdf = jnp.cumsum(jnp.where(allowed, jnp.exp(logp_all), 0.0), axis=-1)
  u = jax.vmap(lambda key: jax.random.uniform(key, dtype=jnp.float32))(keys) * cdf[:, -1]
  above = cdf > u[:, None]
  drawn = jnp.where(above[:, -1], jnp.argmax(above, axis=-1), jnp.argmax(scaled, axis=-1))
  ids = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
  logp = jnp.take_along_axis(logp_all, ids[:, None], axis=-1)[:, 0]
  return ids, logp


def decode_rows(n: int, position: int, temperature: float = 0.0) -> steps.DecodeRows:
  """n rows at one position with budget to spare, greedy or sampled at ``temperature``."""
  return steps.DecodeRows(
      tokens=jnp.full((n,), 5, jnp.int32), positions=jnp.full((n,), position, jnp.int32),
      remaining=jnp.full((n,), 1 << 20, jnp.int32), temperature=jnp.full((n,), temperature, jnp.float32),
      top_p=jnp.ones((n,), jnp.float32), top_k=jnp.zeros((n,), jnp.int32),
      seeds=jnp.arange(n, dtype=jnp.uint32), stop_ids=jnp.full((n, 4), -1, jnp.int32))


def compiled_decode(head, sampler):
  """A jit of the decode loop that traces with ``head`` as the Decoder's output head and
  ``sampler`` as its token sampler (its own function object, so no trace is shared between
  variants)."""
  def decode(*args, **kwargs):
    saved = decoder_lib.Decoder.logits_from_hidden, steps.sample_tokens
    decoder_lib.Decoder.logits_from_hidden, steps.sample_tokens = head, sampler
    try:
      return steps.decode_steps(*args, **kwargs)
    finally:
      decoder_lib.Decoder.logits_from_hidden, steps.sample_tokens = saved
  return jax.jit(decode, static_argnums=(0,),
                 static_argnames=("num_rows", "attn_len", "num_steps", "prefix_len"),
                 donate_argnums=(2,))


def shared_groups(rows: int, groups: int, prefix_len: int) -> dict:
  """``decode_steps`` keyword arguments for ``rows`` rows in ``groups`` equal groups."""
  prompts = [(r, np.full(prefix_len + 1, r % groups), prefix_len) for r in range(rows)]
  plan = shared_prefix.plan(prompts, rows, [prefix_len])
  assert plan.prefix_len == prefix_len
  return dict(groups=plan.groups, prefix_len=plan.prefix_len)


def _option_value(text: str):
  """A compiler option's value from the command line: a bool, an int, or the string."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  try:
    return int(text)
  except ValueError:
    return text


def main(argv):
  del argv
  args = FLAGS
  model = create_model(args.preset, seed=0)
  cfg = model.config
  graphdef, state = nnx.split(model)
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  current = (decoder_lib.Decoder.logits_from_hidden, steps.sample_tokens, None, {})
  variants = {"current": current}
  if args.baseline_head:
    variants["transposed_head"] = (head_through_transpose, current[1], None, {})
  if args.baseline_sampling:
    variants["previous_sampling"] = (current[0], previous_sample_tokens, None, {})
  if args.fused:
    variants["fused"] = (current[0], current[1], fused_lib.FUSE(graphdef, state), {})
  if args.shared:
    num_groups, prefix_len = (int(x) for x in args.shared.split(":"))
    variants["shared"] = (current[0], current[1], None,
                          shared_groups(args.rows, num_groups, prefix_len))
  options = {"current": None}
  for spec in args.xla_options:
    name, _, opts = spec.partition(":")
    variants[name] = current
    options[name] = {k: _option_value(v) for k, v in (o.split("=", 1) for o in opts.split("+"))}
  k, n = args.decode_chunk, args.rows
  rows_out = []
  for window in (int(w) for w in args.windows):
    position = window - k - 1  # the last position the window holds after k steps

    def call(run, window=window, position=position):
      """One decode call of ``run`` = [fn, cache, times, fused, kwargs], its cache carried over;
      waits."""
      kw = {x: y for x, y in run[4].items() if x != "prefix_len"}
      run[1], _, ids, _ = run[0](state, run[1], decode_rows(n, position, args.temperature),
                                 fused=run[3], **kw)
      jax.block_until_ready(ids)

    runs = {}
    for name, (head, sampler, kernels, extra) in variants.items():
      cache = Cache.zeros(cfg, n, window)
      fn = compiled_decode(head, sampler).lower(
          graphdef, state, cache, decode_rows(n, position, args.temperature), num_rows=n,
          attn_len=window, num_steps=k, fused=kernels, **extra).compile(
              compiler_options=options.get(name))
      runs[name] = [fn, cache, [], kernels, extra]
      call(runs[name])  # first call
    for _ in range(args.repeats):  # variants alternate, so load from elsewhere hits both alike
      for run in runs.values():
        t0 = time.perf_counter()
        call(run)
        run[2].append(time.perf_counter() - t0)
    kv_bytes = 2 * cfg.num_layers * n * cfg.num_kv_heads * cfg.head_dim * (SCRATCH + window) * 4
    row = dict(window=window, weight_mb=round(weight_bytes / 1e6, 1),
               kv_window_mb=round(kv_bytes / 1e6, 1))
    for name, (_, _, times, _, _) in runs.items():
      ms = float(np.median(times)) / k * 1e3
      row[f"{name}_ms_per_step"] = round(ms, 3)
      row[f"{name}_read_gb_s"] = round((weight_bytes + kv_bytes) / (ms / 1e3) / 1e9, 1)
    if args.baseline_head:
      row["speedup_vs_transposed_head"] = round(
          row["transposed_head_ms_per_step"] / row["current_ms_per_step"], 3)
    for name in options:
      if name != "current":
        row[f"speedup_{name}"] = round(row["current_ms_per_step"] / row[f"{name}_ms_per_step"], 3)
    if args.fused:
      row["speedup_fused"] = round(row["current_ms_per_step"] / row["fused_ms_per_step"], 3)
    if args.shared:
      row["speedup_shared"] = round(row["current_ms_per_step"] / row["shared_ms_per_step"], 3)
    if args.baseline_sampling:
      row["speedup_vs_previous_sampling"] = round(
          row["previous_sampling_ms_per_step"] / row["current_ms_per_step"], 3)
    if args.profile_dir:
      where = f"{args.profile_dir}/window_{window}"
      jax.profiler.start_trace(where)
      for _ in range(3):
        call(runs["current"])
      jax.profiler.stop_trace()
      row["op_profile"] = op_profile.op_breakdown(where, 3 * k)
    rows_out.append(row)
  common.emit(dict(benchmark="decode_step", preset=args.preset, rows=n, decode_chunk=k,
                   temperature=args.temperature, backend=jax.default_backend(), windows=rows_out))


if __name__ == "__main__":
  app.run(main)
