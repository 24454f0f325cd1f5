r"""GRPO learner-step throughput on CPU: legorl_jax vs google-tunix 0.1.7, and vs matmul peak.

Both sides train the same Qwen3-shaped model (preset ``small`` by default) in float32 on the
same fixed batch (``--batch`` rows of ``--prompt_len + --completion_len`` tokens, loss on the
completion) with AdamW + global-norm clipping; only the learner step is timed (forward,
GRPO loss, backward, optimizer update), never generation. Each side runs in its own
subprocess, one after the other, so they do not share thread pools:

* ours: ``legorl_jax.trainer.train_step.make_train_step`` jitted with the state donated, the
  lm head on the scored (completion) tokens only, as ``Learner.update`` runs it
  (``--lm_head_on_all`` to score every token); Tunix computes logits for the whole sequence
  and slices the completion out afterwards (its optimised HLO keeps the [B*T, V] dots);
* tunix: ``learner_tunix/run_tunix.py`` inside a virtualenv with ``google-tunix==0.1.7``
  (created on first use under ``--venv``; pip resolves Tunix's own jax / flax, CPU wheels),
  timing ``PeftTrainer._train_step`` with ``algo_core.grpo_loss_fn`` wired as GRPOLearner does.

Step time is the median of ``--steps`` steps after a compile-and-run step; tokens/s =
batch * seq_len / step time. The matmul peak is the median time of a jitted float32
``--matmul_n``-cubed ``jnp.dot``, measured in our process just before the learner runs.

Learner FLOPs per step (dense, as computed; the causal mask does not skip work):
  6 * N * B * T + 12 * L * H * Dh * B * T^2
with N the parameter count entering matmuls (N includes the tied embedding once, as the lm
head; norms are negligible), L layers, H query heads of width Dh. The second term is the
QK^T and PV matmuls, forward (x1) and backward (x2). Utilisation = (FLOPs / step time) / peak.

On a shared machine wall time mostly measures the scheduler, so every figure is also given
per CPU-second of the process (``time.process_time``): ``ratio_ours_over_tunix_cpu_time`` =
Tunix CPU-s per step / ours, and the CPU-time utilisation divides our FLOP per CPU-second by
the matmul's FLOP per CPU-second.

``--profile`` reruns a few steps of each side under ``jax.profiler`` and adds the share of XLA
op time spent in matmuls, layout copies, elementwise ops and loops (``op_breakdown``); on a
loaded machine those op times include descheduling, so only the shares are meaningful.

Ours is compiled with the learner's XLA options (``trainer.cpu_library_fusion``: on CPU, only
matmuls go to XLA's YNNPACK library; ``--cpu_library_fusion=xla_default`` turns that off).
Tunix runs as installed; ``--tunix_same_xla_options`` adds a Tunix run per round with the same
option through ``XLA_FLAGS``, reported as ``ratio_ours_over_tunix_same_xla_options``.

``--group K`` makes each K consecutive rows one GRPO group (their prompts equal, on both
sides); ours then computes each group's prompt once (``trainer.share_prompt`` rows) and also
runs the same batch on plain rows (``ours_unshared``) to show the sharing alone.

``--model`` (a preset such as ``smollm2-135m`` for random weights of that shape, a Hugging Face
directory, or a pretrained name such as ``smollm2-135m-instruct``, resolved by
``models.pretrained.resolve_pretrained``) switches to the parameter-efficient comparison: one
child process measures the matmul peak, then ``Learner``'s jitted step for each
``--trainables`` setting (``trainer.trainable``: all, top:K, lora) on the same batch, and
prints one JSON line (no Tunix). Its FLOPs are the useful work of each setting
(``trainable_step_flops``): the full forward, the backward through the trained blocks only,
and the weight gradients of what trains (LoRA merges its adapters into the kernels, so an
adapted kernel's full weight gradient is computed, then projected onto A and B).

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.learner --model=smollm2-135m-instruct
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.learner              # both sides
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.learner --group 4    # one group of 4
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.learner --skip_tunix # ours only
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

from experiments.benchmarks import common
from experiments.benchmarks.learner_flops import grouped_step_flops, step_flops, trainable_step_flops
from experiments.benchmarks.learner_inputs import grpo_batch, grpo_config
from experiments.benchmarks.learner_tunix.peak import matmul_peak
from experiments.benchmarks.op_profile import op_breakdown, profile_steps

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = common.REPO
TUNIX_SPEC = "google-tunix==0.1.7"
DEFAULT_VENV = os.path.expanduser("~/.cache/legorl_jax/bench/tunix-venv")

flags.DEFINE_string("preset", "small", "Model preset of both sides (random weights).")
flags.DEFINE_integer("batch", 4, "Rows of the fixed GRPO batch.")
flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per row.")
flags.DEFINE_integer("completion_len", 128, "Completion (scored) tokens per row.")
flags.DEFINE_integer("steps", 3, "Timed steps after the first.")
flags.DEFINE_string("aggregation", "seq-mean-token-mean",
                    "Ours; Tunix gets its equivalent sequence-mean-token-mean.")
flags.DEFINE_float("clip_eps", 0.2, "GRPO clip epsilon.")
flags.DEFINE_float("lr", 1e-6, "AdamW learning rate.")
flags.DEFINE_float("max_grad_norm", 1.0, "Global-norm clipping.")
flags.DEFINE_integer("micro_batches", 1, "Ours: micro-batches per step.")
flags.DEFINE_integer("group", 1,
                     "Completions per prompt (a GRPO group); > 1: both sides get the same prompt "
                     "repeated within each group, ours computes it once per group.")
flags.DEFINE_bool("unshared", False,
                  "Ours: plain rows even for groups (the prompt computed per completion).")
flags.DEFINE_bool("remat", False, "Ours: rematerialise each block.")
flags.DEFINE_integer("matmul_n", 2048, "Side of the matmul-peak measurement.")
flags.DEFINE_integer("matmul_repeats", 5, "Repeats of the matmul-peak measurement.")
flags.DEFINE_bool("lm_head_on_all", False,
                  "Ours: run the lm head on every token (default: scored tokens only, as the "
                  "Learner does).")
flags.DEFINE_bool("profile", False,
                  "Profile a few extra steps on each side and report the op-time breakdown.")
flags.DEFINE_integer("profile_steps", 2, "Steps profiled with --profile.")
flags.DEFINE_string("profile_dir", None, "Internal: a child's profile directory.")
flags.DEFINE_bool("skip_tunix", False, "Ours only.")
flags.DEFINE_enum("cpu_library_fusion", "dot", ["dot", "xla_default"],
                  "Ours: trainer.cpu_library_fusion (which fusions XLA:CPU hands to YNNPACK).")
flags.DEFINE_bool("tunix_same_xla_options", False,
                  "Each round also runs Tunix with our learner's XLA:CPU option (through "
                  "XLA_FLAGS), to separate that option from the rest of the difference.")
flags.DEFINE_integer("rounds", 1,
                     "Repeat all sides this many times; ratios are medians of per-round ratios.")
flags.DEFINE_string("venv", DEFAULT_VENV, "Virtualenv for google-tunix (created on first use).")
flags.DEFINE_string("model", None,
                    "Parameter-efficient comparison on this model: a preset (random weights), an "
                    "HF directory or a pretrained name (e.g. smollm2-135m-instruct).")
flags.DEFINE_list("trainables", ["all", "top:4", "top:8", "lora"],
                  "With --model: trainer.trainable settings to time.")
flags.DEFINE_bool("child", False, "Internal: run our side in this process.")
flags.DEFINE_bool("child_trainables", False, "Internal: run the --model comparison here.")
FLAGS = flags.FLAGS


def run_ours(args) -> dict:
  """Our learner step in this process (called with --child)."""
  import jax
  import jax.numpy as jnp
  from legorl_jax.models import create_model, get_preset
  from legorl_jax.models.params import split_model
  from legorl_jax.trainer import compile_options
  from legorl_jax.trainer import optimizer as opt_lib
  from legorl_jax.trainer import state as state_lib
  from legorl_jax.trainer import train_step as ts

  peak, peak_cpu = matmul_peak(args.matmul_n, args.matmul_repeats)
  mcfg = get_preset(args.preset, remat=args.remat)
  cfg = grpo_config(args.micro_batches, aggregation=args.aggregation, clip_eps=args.clip_eps,
                    lr=args.lr, max_grad_norm=args.max_grad_norm,
                    cpu_library_fusion=args.cpu_library_fusion)
  model_def, params = split_model(create_model(mcfg, seed=0))
  optimizer = opt_lib.make_optimizer(cfg.optim)
  state = state_lib.create_train_state(params, optimizer)
  # As ``Learner`` jits it, with the learner's XLA compile options.
  xla_options = compile_options.learner_compiler_options(cfg.trainer)
  step = jax.jit(ts.make_train_step(model_def, optimizer, cfg), donate_argnums=(0,),
                 static_argnames=("scored_cap", "shared_prefix"), compiler_options=xla_options)

  batch, layout = grpo_batch(mcfg.vocab_size, args.batch, args.prompt_len, args.completion_len,
                             args.group, share=args.group > 1 and not args.unshared)
  # As ``Learner.update`` does: the lm head runs only on the scored (completion) tokens.
  cap = None if args.lm_head_on_all else ts.scored_cap_for(batch, args.micro_batches)
  batch = jax.tree.map(jnp.asarray, batch)
  run = lambda state: jax.block_until_ready(step(state, batch, scored_cap=cap, shared_prefix=layout))

  with common.Timer() as t:
    state, metrics = run(state)
  first = t.wall
  times, cpu = [], []
  for _ in range(args.steps):
    with common.Timer() as t:
      state, metrics = run(state)
    times.append(t.wall)
    cpu.append(t.cpu)
  step_s = statistics.median(times)
  if args.profile_dir:
    state = profile_steps(run, state, args.profile_dir, args.profile_steps)
  return {"side": "ours", "jax_version": jax.__version__, "n_params": mcfg.num_params(),
          "loss": float(metrics["loss/policy"]), "grad_norm": float(metrics["grad_norm"]),
          "compile_and_first_s": round(first, 3), "step_s_median": round(step_s, 4),
          "step_s_all": [round(x, 4) for x in times],
          "tokens_per_s": round(args.batch * (args.prompt_len + args.completion_len) / step_s, 1),
          "matmul_peak_gflops": round(peak / 1e9, 2),
          "cpu_s_median": round(statistics.median(cpu), 4),
          "matmul_gflop_per_cpu_s": round(peak_cpu / 1e9, 2),
          "scored_cap": cap, "shared_prefix": layout, "compiler_options": xla_options,
          "row_shape": list(batch["input_ids"].shape)}


def load_model(name: str):
  """(Decoder, what was loaded): a preset (random weights), an HF directory or a pretrained
  name / .gguf file (``models.pretrained.resolve_pretrained``)."""
  from legorl_jax.models import PRESETS, create_model, from_pretrained
  if name.lower() in PRESETS:
    return create_model(name.lower(), seed=0), f"preset {name} (random weights)"
  from legorl_jax.models import pretrained
  path = pretrained.resolve_pretrained(name)
  return from_pretrained(str(path)), str(path)


def run_trainables(args) -> dict:
  """``Learner``'s jitted step for each of ``args.trainables`` on one GRPO batch (child)."""
  import gc

  import jax
  import ml_collections
  from experiments.configs import common as configs
  from legorl_jax.trainer import train_step as ts
  from legorl_jax.trainer.learner import Learner

  peak, peak_cpu = matmul_peak(args.matmul_n, args.matmul_repeats)
  model, loaded = load_model(args.model)
  mcfg = model.config
  batch, layout = grpo_batch(mcfg.vocab_size, args.batch, args.prompt_len, args.completion_len,
                             1, share=False)
  cap = None if args.lm_head_on_all else ts.scored_cap_for(batch, args.micro_batches)
  if args.lm_head_on_all:
    raise SystemExit("--lm_head_on_all is not available with --model (Learner.update decides)")
  scored = args.batch * args.completion_len
  lora_cfg = configs.base_config().trainer
  out = {}
  for trainable in args.trainables:
    cfg = configs.base_config()
    del cfg.mesh
    cfg.loss = ml_collections.ConfigDict(dict(
        name="grpo", temperature=1.0, aggregation=args.aggregation, clip_eps_low=args.clip_eps,
        clip_eps_high=args.clip_eps, vf_coef=0.0, kl_coef=0.0))
    cfg.trainer.micro_batches, cfg.trainer.trainable = args.micro_batches, trainable
    cfg.trainer.cpu_library_fusion = args.cpu_library_fusion
    cfg.optim.learning_rate, cfg.optim.max_grad_norm = args.lr, args.max_grad_norm
    learner = Learner(model, cfg)
    run = lambda: learner.update([batch])  # noqa: E731 -- as the loops call it (metrics synced)
    with common.Timer() as t:
      m = run()
    first = t.wall
    times, cpu = [], []
    for _ in range(args.steps):
      with common.Timer() as t:
        m = run()
      times.append(t.wall)
      cpu.append(t.cpu)
    step_s, cpu_s = statistics.median(times), statistics.median(cpu)
    fl = trainable_step_flops(mcfg, learner.plan, args.batch, args.prompt_len + args.completion_len, scored)
    n_train = sum(int(x.size) for x in jax.tree.leaves(learner.state.params))
    out[trainable] = {
        "tokens_per_s": round(args.batch * (args.prompt_len + args.completion_len) / step_s, 1),
        "step_s_median": round(step_s, 4), "step_s_all": [round(x, 4) for x in times],
        "cpu_s_median": round(cpu_s, 4), "compile_and_first_s": round(first, 2),
        "trainable_params": n_train, "step_gflops": round(fl["total"] / 1e9, 2),
        "utilisation_of_matmul_peak": round(fl["total"] / step_s / peak, 4),
        "utilisation_of_matmul_peak_cpu_time": round(fl["total"] / cpu_s / peak_cpu, 4),
        "loss": float(m["loss/policy"]), "grad_norm": float(m["grad_norm"])}
    common.note({trainable: out[trainable]})
    del learner, run, m
    gc.collect()
  base = out.get("all", {}).get("tokens_per_s")
  return {"benchmark": "learner_trainable", "model": args.model, "loaded": loaded,
          "n_params": mcfg.num_params(), "num_layers": mcfg.num_layers,
          "batch": args.batch, "seq_len": args.prompt_len + args.completion_len,
          "prompt_len": args.prompt_len, "completion_len": args.completion_len,
          "steps": args.steps, "dtype": "float32", "scored_cap": cap,
          "lora": {"rank": lora_cfg.lora_rank, "alpha": lora_cfg.lora_alpha,
                   "targets": list(lora_cfg.lora_targets)},
          "matmul_peak_gflops": round(peak / 1e9, 2), "matmul_gflop_per_cpu_s": round(peak_cpu / 1e9, 2),
          "matmul_n": args.matmul_n, "jax_version": jax.__version__,
          "tokens_per_s": {k: v["tokens_per_s"] for k, v in out.items()},
          "speedup_over_all": ({k: round(v["tokens_per_s"] / base, 3) for k, v in out.items()}
                               if base else None),
          # CPU-seconds per step are steadier than wall time on a shared host.
          "speedup_over_all_cpu_time": ({k: round(out["all"]["cpu_s_median"] / v["cpu_s_median"], 3)
                                         for k, v in out.items()} if base else None),
          "utilisation_of_matmul_peak": {k: v["utilisation_of_matmul_peak"] for k, v in out.items()},
          "runs": out}


# ``trainer.cpu_library_fusion`` as an XLA_FLAGS entry, for the Tunix child.
TUNIX_SAME_XLA_FLAGS = {"dot": "--xla_cpu_experimental_ynn_fusion_type=dot", "xla_default": None}


def ensure_venv(venv: str) -> str:
  """Creates (once) a virtualenv holding google-tunix 0.1.7 with CPU jax; returns its python."""
  py = os.path.join(venv, "bin", "python")
  probe = [py, "-c", "import importlib.metadata as m; print(m.version('google-tunix'))"]
  if os.path.exists(py):
    out = subprocess.run(probe, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip() == TUNIX_SPEC.split("==")[1]:
      return py
  print(f"creating {venv} with {TUNIX_SPEC} (several minutes, once)", file=sys.stderr, flush=True)
  subprocess.run([sys.executable, "-m", "venv", venv], check=True)
  # jax[cpu] keeps pip on CPU wheels (no CUDA plugins); Tunix's own pins decide the versions.
  subprocess.run([py, "-m", "pip", "install", "-q", TUNIX_SPEC, "jax[cpu]"], check=True)
  return py


def _child_json(cmd, env) -> dict:
  out, error = common.run_child(cmd, env=env, cwd=REPO, tail=3000)
  return out if error is None else {"error": error}


def main(argv):
  del argv
  args = FLAGS

  if args.child:
    common.emit(run_ours(args))
    return
  if args.child_trainables:
    common.emit(run_trainables(args))
    return
  if args.model:
    env = common.child_env()
    load_before = common.load_avg_1m()
    cmd = [sys.executable, os.path.abspath(__file__), "--child_trainables", *sys.argv[1:]]
    out = _child_json(cmd, env)
    out.update(load_avg_1m_before=load_before, load_avg_1m_after=common.load_avg_1m(),
               cpus=os.cpu_count())
    common.emit(out)
    return

  sys.path.insert(0, REPO)
  from legorl_jax.models.config import get_preset
  mcfg = get_preset(args.preset)
  shape = {k: getattr(mcfg, k) for k in (
      "num_layers", "vocab_size", "hidden_size", "intermediate_size", "num_heads",
      "num_kv_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings")}
  seq_len = args.prompt_len + args.completion_len
  env = common.child_env()
  load_before = common.load_avg_1m()

  shared_args = ["--batch", str(args.batch), "--prompt_len", str(args.prompt_len),
            "--completion_len", str(args.completion_len), "--steps", str(args.steps),
            "--lr", str(args.lr), "--max_grad_norm", str(args.max_grad_norm),
            "--clip_eps", str(args.clip_eps), "--matmul_n", str(args.matmul_n),
            "--matmul_repeats", str(args.matmul_repeats), "--group", str(args.group)]
  prof_root = tempfile.mkdtemp(prefix="learner_prof_") if args.profile else None
  prof = lambda side: (["--profile_dir", os.path.join(prof_root, side), "--profile_steps",
                        str(args.profile_steps)] if prof_root else [])
  ours_cmd = [sys.executable, os.path.abspath(__file__), "--child", "--preset", args.preset,
              "--aggregation", args.aggregation, "--micro_batches", str(args.micro_batches),
              "--cpu_library_fusion", args.cpu_library_fusion,
              *(["--remat"] if args.remat else []), *(["--lm_head_on_all"] if args.lm_head_on_all
                                                       else []), *prof("ours"), *shared_args]
  def one_round():
    ours = _child_json(ours_cmd + (["--unshared"] if args.unshared else []), env)
    common.note(ours)
    ours_unshared = None
    if args.group > 1 and not args.unshared:  # the same batch in plain rows, for the ablation
      ours_unshared = _child_json(ours_cmd + ["--unshared"], env)
      common.note(ours_unshared)
    def run_tunix(xla_flags=None, profile=()):
      try:
        py = ensure_venv(args.venv)
        agg = {"seq-mean-token-mean": "sequence-mean-token-mean"}.get(args.aggregation,
                                                                        args.aggregation)
        tenv = dict(env)
        tenv.pop("PYTHONPATH", None)
        if xla_flags:
          tenv["XLA_FLAGS"] = (tenv.get("XLA_FLAGS", "") + " " + xla_flags).strip()
        out = _child_json([py, os.path.join(HERE, "learner_tunix", "run_tunix.py"),
                           "--shape", json.dumps(shape), "--aggregation", agg, *profile,
                           *shared_args], tenv)
      except subprocess.CalledProcessError as e:
        out = {"error": f"virtualenv setup failed: {e}"}
      common.note(out)
      return out
    tunix = tunix_same = None
    if not args.skip_tunix:
      tunix = run_tunix(profile=prof("tunix"))
      if args.tunix_same_xla_options:
        tunix_same = run_tunix(TUNIX_SAME_XLA_FLAGS.get(args.cpu_library_fusion))
    return ours, ours_unshared, tunix, tunix_same

  # Several rounds of all sides back to back: the machine's speed drifts by 2x over minutes,
  # so each round's ratio is taken within the round and the median over rounds reported.
  rounds = [one_round() for _ in range(max(1, args.rounds))]
  ours, ours_unshared, tunix, tunix_same = rounds[-1]
  ok = lambda r: bool(r) and "error" not in r
  flops = step_flops(shape, args.batch, seq_len)  # as the batch is written (Tunix computes this)
  ours_flops = flops
  if ok(ours) and ours.get("shared_prefix"):
    (p_len, b_len), (rows_, width) = ours["shared_prefix"], ours["row_shape"]
    ours_flops = grouped_step_flops(shape, rows_, p_len, b_len, (width - p_len) // b_len)
  peak = ours.get("matmul_peak_gflops")
  util = util_cpu = ratio = ratio_cpu = None
  if ok(ours):
    util = round(ours_flops / ours["step_s_median"] / (peak * 1e9), 4)
    util_cpu = round(ours_flops / ours["cpu_s_median"] / (ours["matmul_gflop_per_cpu_s"] * 1e9), 4)
  per_round = []
  for o, u, t, ts_ in rounds:
    if ok(o) and ok(t):
      per_round.append({"ours_s": o["step_s_median"], "tunix_s": t["step_s_median"],
                        "ours_unshared_s": u["step_s_median"] if ok(u) else None,
                        "ratio_wall": round(t["step_s_median"] / o["step_s_median"], 3),
                        "ratio_cpu": round(t["cpu_s_median"] / o["cpu_s_median"], 3)})
      if ok(ts_):
        per_round[-1].update(
            tunix_same_options_s=ts_["step_s_median"],
            ratio_wall_same_options=round(ts_["step_s_median"] / o["step_s_median"], 3),
            ratio_cpu_same_options=round(ts_["cpu_s_median"] / o["cpu_s_median"], 3))
  if per_round:
    ratio = round(statistics.median(r["ratio_wall"] for r in per_round), 3)
    ratio_cpu = round(statistics.median(r["ratio_cpu"] for r in per_round), 3)
  same = [r for r in per_round if "ratio_cpu_same_options" in r]
  ratio_same = ratio_cpu_same = None
  if same:
    ratio_same = round(statistics.median(r["ratio_wall_same_options"] for r in same), 3)
    ratio_cpu_same = round(statistics.median(r["ratio_cpu_same_options"] for r in same), 3)
  sharing = None
  if ok(ours) and ok(ours_unshared):
    sharing = {"ratio_shared_over_unshared": round(ours["tokens_per_s"] / ours_unshared["tokens_per_s"], 3),
               "ratio_shared_over_unshared_cpu_time": round(ours_unshared["cpu_s_median"] / ours["cpu_s_median"], 3)}
    if ok(tunix):
      sharing["ratio_unshared_over_tunix_cpu_time"] = round(tunix["cpu_s_median"] / ours_unshared["cpu_s_median"], 3)

  rows = [("side", "step s", "tokens/s", "GFLOP/s", "peak GFLOP/s", "step cpu-s",
           "GFLOP/cpu-s", "peak GFLOP/cpu-s")]
  for name, r in (("legorl_jax", ours), ("legorl_jax, plain rows", ours_unshared),
                  ("tunix 0.1.7", tunix), ("tunix 0.1.7, our XLA option", tunix_same)):
    if r is None:
      continue
    if not ok(r):
      rows.append((name, "error") + ("-",) * 6)
      continue
    rows.append((name, f"{r['step_s_median']:.3f}", f"{r['tokens_per_s']:.0f}",
                 f"{flops / r['step_s_median'] / 1e9:.1f}", f"{r['matmul_peak_gflops']:.1f}",
                 f"{r['cpu_s_median']:.3f}", f"{flops / r['cpu_s_median'] / 1e9:.1f}",
                 f"{r['matmul_gflop_per_cpu_s']:.1f}"))
  widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
  for row in rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))

  summary = {
      "benchmark": "learner", "preset": args.preset, "model_shape": shape,
      "batch": args.batch, "seq_len": seq_len, "prompt_len": args.prompt_len,
      "completion_len": args.completion_len, "group": args.group, "dtype": "float32",
      "steps": args.steps,
      "step_gflops": round(flops / 1e9, 2), "ours_step_gflops": round(ours_flops / 1e9, 2),
      "ours_tokens_per_s": ours.get("tokens_per_s"),
      "tunix_tokens_per_s": tunix.get("tokens_per_s") if tunix else None,
      "ratio_ours_over_tunix": ratio,
      "ratio_ours_over_tunix_cpu_time": ratio_cpu,
      "ratio_ours_over_tunix_same_xla_options": ratio_same,
      "ratio_ours_over_tunix_same_xla_options_cpu_time": ratio_cpu_same,
      "rounds": per_round,  # ratios above: medians over these (the table: the last round)
      "matmul_peak_gflops": peak, "matmul_n": args.matmul_n,
      "ours_utilisation_of_matmul_peak": util,
      "ours_utilisation_of_matmul_peak_cpu_time": util_cpu,
      "tunix_timed": tunix.get("timed") if tunix else None,
      "ours_timed": "legorl_jax.trainer.train_step.make_train_step -> jax.jit(donate_argnums=0, "
                    "compiler_options=learner_compiler_options(trainer))",
      "prompt_sharing": sharing, "ours": ours, "ours_unshared": ours_unshared, "tunix": tunix,
      "tunix_same_xla_options": tunix_same,
      "op_breakdown": ({side: op_breakdown(os.path.join(prof_root, side), args.profile_steps)
                        for side in ("ours", "tunix")} if prof_root else None),
      "load_avg_1m_before": load_before, "load_avg_1m_after": common.load_avg_1m(),
      "cpus": os.cpu_count(),
  }
  common.emit(summary)


if __name__ == "__main__":
  app.run(main)
