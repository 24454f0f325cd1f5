"""The training run, top to bottom: tasks -> policy -> SFT warm start -> eval -> RL -> eval.

Every phase writes into ``workdir``: ``metrics.jsonl`` (+ TensorBoard), ``trials.jsonl`` per
phase directory (``sft_demos/``, ``eval/<name>/``, ``rollouts/``), orbax checkpoints in
``checkpoints/`` and ``summary.json``. Starting again with the same ``workdir`` resumes from
the latest checkpoint (after SFT: the SFT phase is not repeated; during RL: the step, optimizer,
RNG and task position continue).

Multi-host (``jax.process_count() > 1``): every process runs this same function; each runs
its share of every phase's trials (``trainer.multihost``), process 0 writes the run-level
files, orbax writes the checkpoints from all of them. ``workdir`` may be ``gs://...``: run
files go through ``utils.paths``, trial directories and sockets stay on the host's disk
(``distributed.host_local_dir``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import jax.numpy as jnp
import ml_collections
import numpy as np

from legorl_jax import errors
from legorl_jax.harnesses import registry as harness_registry
from legorl_jax.metrics.progress import PhaseProgress
from legorl_jax.metrics.writer import MetricsWriter
from legorl_jax.models import create_model, from_pretrained, get_preset, save_pretrained
from legorl_jax.models import tokenizer as tok_lib
from legorl_jax.proxy.service import derive_seed
from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.ray_backend import backend_from_config
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sandbox import SandboxConfig
from legorl_jax.sharding import distributed
from legorl_jax.trainer import config_check, eval_stats, multihost, rl_loop, sft as sft_lib
from legorl_jax.trainer import demo_replay, kl_guard, screen, task_filter
# Re-exported: the experiments and benchmarks take the run's task sets from here.
from legorl_jax.trainer.task_sets import (HELD_OUT_MODES, extra_held_out_sets,  # noqa: F401
                                          held_out_tasks, load_tasks)
from legorl_jax.trainer.checkpoint import Checkpointer
from legorl_jax.trainer.learner import Learner
from legorl_jax.trainer.policy_service import PolicyService
from legorl_jax.trainer.run_state import BEFORE_RL_RESULT, RunState
from legorl_jax.trainer.step_profile import StepProfile
from legorl_jax.utils import cpu_time, paths

log = logging.getLogger(__name__)


def build_policy(cfg):
  """(model, tokenizer) from ``cfg.model``."""
  compute = cfg.model.get("compute_dtype", "float32")
  checkpoint = cfg.model.checkpoint
  if cfg.model.get("pretrained", ""):  # a named model or .gguf: fetched/converted once, cached
    from legorl_jax.models import pretrained  # pylint: disable=import-outside-toplevel
    if checkpoint:
      raise errors.ConfigError("config model.pretrained and model.checkpoint are both set; "
                               "set one of them.")
    checkpoint = str(pretrained.resolve_pretrained(cfg.model.pretrained))
  if checkpoint:
    model = from_pretrained(checkpoint, compute_dtype=jnp.dtype(compute),
                            remat=bool(cfg.model.remat))
    tokenizer = tok_lib.load_tokenizer(cfg.model.tokenizer or checkpoint)
  else:
    model = create_model(get_preset(cfg.model.preset, remat=bool(cfg.model.remat), dtype=compute),
                         seed=int(cfg.seed))
    tokenizer = tok_lib.load_tokenizer(cfg.model.tokenizer or None)
  return model, tokenizer


def from_sft_policy(cfg, workdir: str):
  """A copy of a finished run's config that starts from the run's warm-started policy
  (``WORKDIR/sft_policy``, saved with its tokenizer) instead of what the run started from (a
  preset or a pretrained model's name): what an SFT continuation of the run loads."""
  cfg = cfg.copy_and_resolve_references()
  cfg.model.checkpoint = os.path.join(workdir, "sft_policy")
  if "pretrained" in cfg.model:
    cfg.model.pretrained = ""
  return cfg


def _with(cfg, **sections):
  """A copy of ``cfg`` with some sections' fields replaced."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  for section, fields in sections.items():
    for k, v in fields.items():
      c[section][k] = v
  return c


def sft_config(cfg):
  """The learner config of the SFT phase: token NLL (REINFORCE at advantage 1), SFT optimizer.
  ``trainer.trainable`` (and the LoRA settings) carry over: the same parameters train in SFT
  and RL, and RL continues from the SFT phase's trainables (``Learner.with_config``).
  ``loss.temperature`` carries over too, on purpose: SFT fits softmax(z / T) to the
  demonstrations, so the policy RL samples from at T is the one the demonstrations shaped."""
  return _with(cfg, loss={"name": "reinforce", "is_correction": "none", "kl_coef": 0.0,
                          "entropy_coef": 0.0},
               optim={"learning_rate": float(cfg.sft.learning_rate), "schedule": "constant",
                      **{k: float(cfg.sft[k]) for k in ("b2", "max_grad_norm") if k in cfg.sft}},
               trainer={"rows_per_batch": int(cfg.sft.rows_per_batch),
                        "micro_batches": int(cfg.sft.get("micro_batches", 1)),
                        "buckets": tuple(cfg.sft.get("buckets") or cfg.trainer.buckets),
                        "pack": False, "share_prompt": tuple(cfg.sft.get("share_prompt", ()))})


def evaluate(service, tasks, adapter, trial_cfg, cfg, out_dir, *, trials_path=None, step=0,
             phase="eval") -> dict:
  """Validation solve rate at the sampling temperature (``eval.samples`` per task, pass@k)
  and, optionally, greedy. Trials are also appended to ``trials_path`` when given."""
  return evaluate_held_out(service, tasks, {}, adapter, trial_cfg, cfg, out_dir,
                           trials_path=trials_path, step=step, phase=phase)


def evaluate_held_out(service, tasks, extra_sets, adapter, trial_cfg, cfg, out_dir, *,
                      trials_path=None, step=0, phase="eval") -> dict:
  """``evaluate`` on the main held-out tasks and on each extra set (``extra_held_out_sets``),
  whose results join the main ones under ``MODE/KEY`` (e.g. ``templates/solve_rate``).

  Every trial of the evaluation (each set, sampled and greedy) runs in one ``run_trials``
  pool on the one engine, so no set's or mode's tail waits with a partly empty batch and the
  prefix cache serves them all. Each trial's seed is what it was with one pool per set and
  mode (``_eval_seed``), so the figures are the same; ``trials_path`` gets them in the same
  order (set by set, sampled then greedy). Trial directories: ``OUT_DIR[_MODE]/{sampled,greedy}``
  as before; the pool's ``trials.jsonl`` and ``summary.json`` are in ``OUT_DIR``."""
  n = int(cfg.eval.samples)
  sets = [("", tasks, out_dir, phase)] + [(mode, extra, f"{out_dir}_{mode}", f"{phase}_{mode}")
                                           for mode, extra in extra_sets.items()]
  parts = []  # (set index, samples, proxy name, temperature, directory)
  for i, (_, _, d, _) in enumerate(sets):
    parts.append((i, n, "sample", float(cfg.sampling.temperature), os.path.join(d, "sampled")))
    if cfg.eval.greedy:
      parts.append((i, 1, "greedy", 0.0, os.path.join(d, "greedy")))
  results = _eval_pool([(sets[i][1], adapter, k, service.proxy(name, temp), d)
                        for i, k, name, temp, d in parts], trial_cfg, cfg, out_dir, label=phase)
  # Standard errors are clustered by bug (a synthetic bug under several names is one cluster).
  clusters = {mode: {t.id: task_filter.task_key(t) for t in set_tasks}
              for mode, set_tasks, _, _ in sets}
  out: dict = {"outcomes": {}, "clusters": clusters}
  for (i, k, name, temp, _), res in zip(parts, results):
    mode, _, _, set_phase = sets[i]
    if trials_path:  # each record with its task's cluster (bug), for experiments.report
      rl_loop.append_records(trials_path, [dict(r.record(), cluster=clusters[mode].get(r.task_id))
                                           for r in res], step=step, phase=set_phase,
                             temperature=temp)
    out.update(eval_stats.set_figures(res, greedy=name == "greedy", samples=k,
                                      prefix=f"{mode}/" if mode else "", cluster_of=clusters[mode]))
    if name != "greedy":  # per-task outcomes, for the paired before/after comparison
      out["outcomes"][mode] = eval_stats.outcomes_by_task(res)
  return out


def scalars(figures: dict) -> dict:
  """An evaluation's figures without its per-task ``outcomes`` and ``clusters``: what the
  metrics get."""
  return {k: v for k, v in figures.items() if k not in ("outcomes", "clusters")}


def policy_name(cfg) -> str:
  """What the run started from, as a person would name it: a pretrained model's name, a
  checkpoint directory, or a preset."""
  return (cfg.model.get("pretrained", "") or cfg.model.checkpoint or f"preset:{cfg.model.preset}")


def _eval_seed(cfg, task, sample: int) -> int:
  """Sample ``sample`` of ``task`` samples with the same seed at every evaluation of the run,
  so the before/after-RL comparison is paired (common random numbers) and a rerun reproduces
  it."""
  return derive_seed("eval", int(cfg.seed), task.id, sample)


def _eval_pool(parts, trial_cfg, cfg, out_dir, label: str = "eval") -> list[list]:
  """One ``run_trials`` pool for ``parts``, each ``(tasks, adapter, samples, proxy,
  directory)``: ``samples`` trials of each task in this host's share, through ``proxy``, into
  ``directory`` (group ids: the tasks' positions in their part). Returns every host's results
  of each part, in job order. Prints ``label``'s progress (n/N trials, ETA) as trials end."""
  jobs, owner = [], []
  for i, (tasks, adapter, n, proxy, part_dir) in enumerate(parts):
    for g in distributed.host_share(len(tasks)):
      for s in range(n):
        jobs.append(TrialJob(tasks[g], adapter, group=g, seed=_eval_seed(cfg, tasks[g], s),
                             proxy=proxy, out_dir=part_dir))
        owner.append(i)
  progress = PhaseProgress(label, len(jobs), unit="trials", every=max(1, len(jobs) // 10))
  solved, lock = [0], threading.Lock()

  def on_result(r):  # on the trial's worker thread
    with lock:
      solved[0] += r.status == st.SOLVED
      progress.step(f"solved {solved[0]}")

  res = run_trials(jobs, None, trial_cfg, out_dir, concurrency=int(cfg.rollout.concurrency),
                   max_retries=int(cfg.rollout.max_retries), on_result=on_result)
  progress.finish(f"solved {solved[0]}")
  return [multihost.gather_results([r for r, o in zip(res, owner) if o == i])
          for i in range(len(parts))]


def _sampler_model(learner):
  """The policy for this host's sampling engine (a full local copy on multi-host runs)."""
  return learner.model_def.merge(multihost.local_params(learner.params_copy()))


def _sft_target(learner):
  """What ``run_sft`` updates: the learner, or its global-batch updater on a mesh (SFT
  batches are the same on every host: the demonstrations are gathered)."""
  if learner.mesh is None:
    return learner
  return multihost.ReplicatedUpdates(multihost.GlobalUpdater(learner))


def _collect_demos(demo_tasks, adapter_for, tokenizer, trial_cfg, out_dir, sockets, cfg):
  """Scripted demonstrations: each host collects its share, every host gets them all."""
  minimal = bool(cfg.sft.get("minimal_edits", False))
  if not multihost.multi_process():
    return sft_lib.collect_demonstrations(demo_tasks, adapter_for, tokenizer, trial_cfg, out_dir,
                                          sockets, concurrency=int(cfg.rollout.concurrency),
                                          minimal_edits=minimal)
  chosen = [adapter_for(t) for t in demo_tasks]  # the chooser's draws, as on one host
  mine = list(distributed.host_share(len(demo_tasks)))
  by_task = {id(demo_tasks[i]): chosen[i] for i in mine}
  demos = sft_lib.collect_demonstrations([demo_tasks[i] for i in mine], lambda t: by_task[id(t)],
                                         tokenizer, trial_cfg, out_dir, sockets,
                                         concurrency=int(cfg.rollout.concurrency),
                                         minimal_edits=minimal)
  return [d for host in multihost.gather_objects(demos) for d in host]


def run(cfg, workdir: str) -> dict:
  config_check.validate(cfg)
  if multihost.multi_process() and (cfg.trainer.get("share_prompt") or cfg.sft.get("share_prompt")):
    raise errors.ConfigError("config trainer.share_prompt / sft.share_prompt are single-process "
                             "only for now; set them to () on a multi-host run.")
  primary = distributed.is_coordinator()
  paths.makedirs(workdir)
  if primary:
    paths.write_text(paths.join(workdir, "config.json"), cfg.to_json(indent=2))
  writer = MetricsWriter(workdir, primary=primary)
  t_start = time.perf_counter()
  wall: dict[str, float] = {}  # seconds per phase, this process's run (a resumed run: from here)
  model, tokenizer = build_policy(cfg)
  loader, val_tasks, train_tasks = load_tasks(cfg)
  extra_sets = extra_held_out_sets(cfg)
  chooser = harness_registry.HarnessChooser.from_spec(cfg.harness.name,
                                                     validation=cfg.harness.eval_name or None)
  adapters = {name: harness_registry.get_adapter(name) for name in chooser.harnesses}
  for a in adapters.values():
    a.check_installed()
  rng = np.random.default_rng(int(cfg.seed))
  adapter_for = lambda task, rng=rng: adapters[chooser.choose(task, rng)]  # noqa: E731
  eval_adapter = adapters[chooser.validation]
  trial_cfg = TrialConfig(harness_timeout_s=float(cfg.harness.timeout_s),
                          max_turns=int(cfg.harness.max_turns),
                          sandbox=SandboxConfig(backend=cfg.sandbox.backend),
                          backend=backend_from_config(cfg))  # rollout.backend: threads | ray
  sockets = distributed.host_local_dir(workdir, "sockets")
  trials_path = paths.join(workdir, "trials.jsonl") if primary else None  # process 0 writes
  rl_cfg = cfg
  ckpt = Checkpointer(distributed.checkpoint_dir(workdir), keep=int(cfg.checkpoint.keep))
  learner = Learner(model, rl_cfg, seed=int(cfg.seed))
  run_state = RunState(loader=loader.state_dict())
  if ckpt.latest_step() is not None:
    learner.state, saved, _ = ckpt.restore(learner.state)
    run_state = RunState.from_json(saved)
    loader.load_state_dict(run_state.loader)
    log.info("resumed at phase %s, RL step %d", run_state.phase, run_state.rl_step)
    print(f"Resumed {workdir} at phase {run_state.phase}, RL step {run_state.rl_step}.", flush=True)

  summary: dict = {}
  # -- SFT warm start -------------------------------------------------------------------------
  if run_state.phase == "sft":
    if int(cfg.sft.steps) > 0:
      t0 = time.perf_counter()
      n_check = int(cfg.sft.get("check_demos", 0))
      if cfg.sft.demos:
        demos = sft_lib.load_demonstrations(cfg.sft.demos)
      else:
        n_demo_tasks = int(cfg.sft.num_demos) + n_check
        demo_tasks = (train_tasks or loader.next_batch(n_demo_tasks))[:n_demo_tasks]
        demo_progress = PhaseProgress("demonstrations", len(demo_tasks), unit="scripted trials")
        demos = _collect_demos(demo_tasks, adapter_for, tokenizer, trial_cfg,
                               distributed.host_local_dir(workdir, "sft_demos"), sockets, cfg)
        demo_progress.finish(f"{len(demos)} solved demonstrations", done=len(demo_tasks))
      # The last ``check_demos`` demonstrations are held out of SFT: the imitation check runs on them.
      check_demos = demos[-n_check:] if 0 < n_check < len(demos) else []
      demos = demos[:len(demos) - len(check_demos)]
      t_demo = time.perf_counter() - t0
      sft_cfg = sft_config(cfg)
      sft_learner = learner.with_config(sft_cfg, seed=int(cfg.seed))
      sft_progress = PhaseProgress("sft", int(cfg.sft.steps), unit="steps")
      screen.save_at_steps(cfg)  # a malformed sft.save_at fails before the first step
      save_here = distributed.is_coordinator() and not paths.is_remote(workdir)

      def on_step(step, m):
        if save_here:  # the policy along the way (sft.save_at): the screen's candidates
          screen.save_if_due(sft_learner, step + 1, cfg, workdir, tokenizer)
        checked = "check/greedy_exact" in m
        if step % 10 == 0 or step == int(cfg.sft.steps) - 1 or checked:
          writer.write(step, m, phase="sft")
          check = (f" | held-out demos: greedy exact {m['check/greedy_exact']:.2f}, "
                   f"p(exact) {m['check/p_exact']:.3f}, nll {m['check/nll']:.3f}") if checked else ""
          sft_progress.step(f"nll {m['nll']:.4f} ({m['learner_tokens_per_s']:.0f} tok/s){check}",
                            done=step + 1, force=True)

      stop_at = cfg.sft.get("stop_at_greedy_exact", None)
      last = sft_lib.run_sft(_sft_target(sft_learner), demos, sft_cfg, steps=int(cfg.sft.steps),
                             seed=int(cfg.seed), on_step=on_step, check_demos=check_demos,
                             check_every=int(cfg.sft.get("check_every", 50)),
                             stop_at_greedy_exact=None if stop_at is None else float(stop_at),
                             short_context_steps=int(cfg.sft.get("short_context_steps", 0)))
      sft_progress.finish(f"final nll {last.get('nll', float('nan')):.4f}")
      learner = sft_learner.with_config(rl_cfg, seed=int(cfg.seed))
      # The warm-started policy as a Hugging Face checkpoint: the starting point of RL, and of
      # the equal-time SFT-continuation baseline (experiments/benchmarks/rl_vs_sft.py).
      if distributed.is_coordinator() and not paths.is_remote(workdir):
        save_pretrained(learner.model(), os.path.join(workdir, "sft_policy"), tokenizer=tokenizer)
      summary.update({k.replace("check/", "sft_check_"): v for k, v in last.items() if k.startswith("check/")})
      summary.update(sft_demos=len(demos), sft_steps=last.get("sft_step"), sft_final_nll=last.get("nll"),
                     sft_demo_collection_s=t_demo, sft_s=time.perf_counter() - t0)
      wall.update(sft_demos=t_demo, sft=time.perf_counter() - t0 - t_demo)
      run_state.phase_s.update(sft_demos=wall["sft_demos"], sft=wall["sft"])
    run_state.phase = "eval_before"
    ckpt.save(0, learner.state, host=run_state.to_json(), force=True)
    ckpt.wait()

  wall["setup"] = time.perf_counter() - t_start - wall.get("sft_demos", 0.0) - wall.get("sft", 0.0)
  run_state.phase_s["setup"] = run_state.phase_s.get("setup", 0.0) + wall["setup"]
  service = PolicyService(_sampler_model(learner), tokenizer, cfg, sockets)
  try:
    if run_state.phase == "eval_before" and not cfg.eval.before_after:
      run_state.phase, run_state.before = "rl", {}
    if run_state.phase == "eval_before":
      # Its result lives beside the step-0 checkpoint, so a resumed run does not redo it.
      before_path = paths.join(workdir, *BEFORE_RL_RESULT)
      if paths.exists(before_path):
        before = json.loads(paths.read_text(before_path))
        run_state.phase_s.setdefault("eval_before", float(before.get("eval_s", 0.0)))
      else:
        t0 = time.perf_counter()
        before = evaluate_held_out(service, val_tasks, extra_sets, eval_adapter, trial_cfg, cfg,
                                   distributed.host_local_dir(workdir, "eval/before_rl"),
                                   trials_path=trials_path, step=0, phase="eval_before_rl")
        before["eval_s"] = wall["eval_before"] = time.perf_counter() - t0
        run_state.phase_s["eval_before"] = wall["eval_before"]
        writer.write(0, scalars(before), phase="eval")
        if primary:
          paths.write_text(before_path, json.dumps(before))
      print(f"[eval before RL] {json.dumps(scalars(before))}", flush=True)
      run_state.phase, run_state.before = "rl", before

    # -- RL -----------------------------------------------------------------------------------
    rl_summary = _rl(cfg=cfg, learner=learner, service=service, loader=loader,
                     adapter_for=adapter_for, trial_cfg=trial_cfg, writer=writer, ckpt=ckpt,
                     run_state=run_state, workdir=workdir, val_tasks=val_tasks,
                     eval_adapter=eval_adapter, trials_path=trials_path, extra_sets=extra_sets)
    summary.update(rl_summary)
    if "rl_s" in rl_summary:
      wall["rl"] = rl_summary["rl_s"]

    after = {}
    if cfg.eval.before_after:
      t0 = time.perf_counter()
      after = evaluate_held_out(service, val_tasks, extra_sets, eval_adapter, trial_cfg, cfg,
                                distributed.host_local_dir(workdir, "eval/after_rl"),
                                trials_path=trials_path, step=run_state.rl_step, phase="eval_after_rl")
      wall["eval_after"] = run_state.phase_s["eval_after"] = time.perf_counter() - t0
      writer.write(run_state.rl_step, scalars(after), phase="eval")
      print(f"[eval after RL] {json.dumps(scalars(after))}", flush=True)
  finally:
    service.close()
    ckpt.close()
    writer.close()
    if trial_cfg.backend is not None:
      trial_cfg.backend.close()

  before = run_state.before or {}
  n = int(cfg.eval.samples)
  summary.update(eval_stats.summary_fields(before, after, tuple(extra_sets), n))
  summary.update({
      "val_tasks": len(val_tasks), "eval_samples_per_task": n,
      "rl_steps": run_state.rl_step, "mode": cfg.trainer.mode,
      "wall_s": time.perf_counter() - t_start,
      "wall_s_by_phase": wall,  # this process's seconds; a resumed run's start is its restart
      "wall_s_by_phase_all_runs": dict(run_state.phase_s),  # every process, to its last checkpoint
      "wall_s_all_runs": sum(run_state.phase_s.values()),
      "policy": policy_name(cfg),
      "trainable": str(cfg.trainer.get("trainable", "all")),
  })
  for mode, extra in extra_sets.items():
    summary[f"val_{mode}_tasks"] = len(extra)
  if primary:
    paths.write_text(paths.join(workdir, "summary.json"), json.dumps(summary, indent=2, sort_keys=True))
  return summary


def _rl(*, cfg, learner, service, loader, adapter_for, trial_cfg, writer, ckpt,
        run_state: RunState, workdir: str, val_tasks, eval_adapter, trials_path,
        extra_sets=None) -> dict:
  """The RL phase from ``run_state.rl_step`` to ``trainer.steps``; updates ``run_state`` after
  every step and checkpoints it with the weights. Returns the phase's wall and CPU seconds.

  Every ``eval.every`` steps the main held-out set (every set with ``eval.every_all_sets``) is
  evaluated with the seeds of the evaluation before RL, and its paired gain over it
  (``eval_stats.paired_figures``) joins the step's ``eval`` metrics."""
  from legorl_jax.metrics.progress import TrialProgress

  steps = int(cfg.trainer.steps)
  if run_state.rl_step >= steps:
    return {}
  if service.params_version < run_state.version:
    service.update_params(multihost.local_params(learner.params_copy()), version=run_state.version)
  # This host's rows of every global batch, and how updates reach the (sharded) state.
  rows = multihost.local_rows_per_batch(int(cfg.trainer.rows_per_batch), learner.mesh)
  local_cfg = cfg if rows == int(cfg.trainer.rows_per_batch) else _with(cfg, trainer={"rows_per_batch": rows})
  update = multihost.update_fn(learner)
  proxy = service.proxy("sample", float(cfg.sampling.temperature))
  # Trials a step runs (its first draw round; refill rounds add more).
  per_step = rl_loop.first_draw_tasks(cfg) * int(cfg.rollout.samples_per_task)
  progress = TrialProgress(total=steps * per_step, initial=run_state.rl_step * per_step,
                           queue_depth=lambda: service.engine.stats().get("queued", 0))
  source = rl_loop.RolloutSource(loader, adapter_for, proxy, trial_cfg, cfg,
                                 distributed.host_local_dir(workdir, "rollouts"), progress=progress.update,
                                 trials_path=trials_path)
  source.next_step = run_state.rl_step + 1
  source.load_state_dict(run_state.loader)  # the loader's position and the difficulty filter's memory
  probe = rl_loop.KLProbe(os.path.join(distributed.host_local_dir(workdir, "rollouts"), "kl_probe.npz"))
  kl_guard.check_available(cfg, probe_runs=learner.mesh is None)
  replay = demo_replay.from_config(cfg, distributed.host_local_dir(workdir, "sft_demos"))
  producer = rl_loop.AsyncRollouts(source) if cfg.trainer.mode == "async" else None
  t0, cpu0 = time.perf_counter(), cpu_time.process_tree_cpu_s()
  rl_s_before = run_state.phase_s.get("rl", 0.0)  # earlier processes' RL seconds (a resumed run)
  busy = 0.0
  rl_progress = PhaseProgress("rl", steps, unit="steps", done=run_state.rl_step)
  profile = StepProfile(service.engine.stats)  # cores busy and who used them, per step
  profile.start()
  try:
    while run_state.rl_step < steps:
      step = run_state.rl_step + 1
      got = producer.get() if producer else source.collect()
      profile.rollout_done()
      local, wall, position_after = got.results, got.wall_s, got.position
      results = multihost.gather_results(local)  # every host's records (this host's trajectories)
      wall = max(multihost.gather_objects(wall))
      if trials_path:
        rl_loop.append_trials(trials_path, results, step=step, phase="rl")
      batches, bm = rl_loop.build_batches(local, local_cfg, service.params_version,
                                          replay=replay.draw(step) if replay else (),
                                          group_sizes=got.group_sizes)
      batches = multihost.align_batches(batches, cfg.trainer.buckets, rows)
      bm = multihost.reduce_batch_metrics(bm, len(batches))
      t1 = time.perf_counter()
      if learner.mesh is None:
        probe.ensure(learner, batches)
      lm = update(batches) if batches else {}
      # Only what the update changed (trained blocks, or merged LoRA kernels) goes to the sampler.
      version = service.update_params(multihost.local_params(learner.sync_params()))
      busy += time.perf_counter() - t1
      kl = probe.measure(learner) if learner.mesh is None else {}
      prof = profile.update_done()
      log.info("RL step %d: %s", step, StepProfile.summary(prof))
      metrics = {**rl_loop.rollout_metrics(results, wall), **bm, **lm, **got.metrics, **kl, **prof,
                 "params_version": version,
                 "learner_utilisation": busy / max(time.perf_counter() - t0, 1e-9)}
      writer.write(step, metrics, phase="train")
      rl_progress.step(f"solve {metrics['solve_rate']:.3f} reward {bm['reward_mean']:.3f} "
                       f"loss {lm.get('loss/policy', float('nan')):.4f} "
                       f"trials/h {metrics['trials_per_hour']:.0f} "
                       f"|dlogp| {lm.get('rollout_abs_dlogp', float('nan')):.2e}", done=step, force=True)
      kl_guard.check(step, metrics, cfg)  # after the step's metrics are written
      run_state.rl_step, run_state.loader, run_state.version = step, position_after, version
      run_state.phase_s["rl"] = rl_s_before + time.perf_counter() - t0
      if step % max(1, int(cfg.checkpoint.every)) == 0 or step == steps:
        ckpt.save(step, learner.state, host=run_state.to_json(), metrics={"solve_rate": metrics["solve_rate"]})
      if int(cfg.eval.every) and step % int(cfg.eval.every) == 0 and step != steps:
        sets = (extra_sets or {}) if cfg.eval.get("every_all_sets", False) else {}
        ev = evaluate_held_out(service, val_tasks, sets, eval_adapter, trial_cfg, cfg,
                               distributed.host_local_dir(workdir, f"eval/step_{step}"),
                               trials_path=trials_path, step=step, phase="eval")
        gain = eval_stats.paired_figures(run_state.before or {}, ev, ("", *sets))
        writer.write(step, {**scalars(ev), **gain}, phase="eval")
      profile.start()
  finally:
    if producer is not None:
      producer.close()
    progress.close()
  elapsed = time.perf_counter() - t0
  run_state.phase_s["rl"] = rl_s_before + elapsed
  # CPU seconds of this process and its reaped trial processes: with ``rl_s`` and the core
  # count, how much of the machine the RL phase kept busy.
  return {"rl_s": elapsed, "rl_cpu_s": cpu_time.process_tree_cpu_s() - cpu0,
          "learner_utilisation": busy / max(elapsed, 1e-9)}
