"""One evaluation pool: every trial of an evaluation (each held-out set, sampled and greedy) in
one ``run_trials`` pool gives what one pool per set and mode gave, trial for trial (same seeds,
so the common-random-numbers pairing stays)."""

import json

import pytest

from legorl_jax.taskgen.synthetic.generator import bug_key
from legorl_jax.trainer import multihost
from legorl_jax.rewards import status as st


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _sampled_ids(trajectory_path):
  with open(trajectory_path) as f:
    traj = json.load(f)
  return [t for seg in traj["segments"] for t, m in zip(seg["token_ids"], seg["loss_mask"]) if m]


def _trial(r):
  path = r["trajectory_path"] if isinstance(r, dict) else r.trajectory_path
  status = r["status"] if isinstance(r, dict) else r.status
  return status, _sampled_ids(path)


@pytest.mark.slow
def test_one_pool_gives_the_figures_and_trials_of_one_pool_per_set_and_mode(tmp_path):
  from experiments.configs import demo_tiny as demo
  from legorl_jax.harnesses import registry
  from legorl_jax.models import create_model, get_preset
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.proxy.service import derive_seed
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig
  from legorl_jax.trainer import pipeline, rl_loop
  from legorl_jax.trainer.policy_service import PolicyService

  cfg = demo.get_config()
  cfg.tasks.num_val, cfg.eval.samples, cfg.eval.greedy = 2, 2, True
  cfg.tasks.also_held_out = ("templates",)
  cfg.sampling.max_tokens, cfg.harness.max_turns, cfg.engine.max_batch = 24, 1, 4
  cfg.rollout.concurrency = 4
  tasks, extra = pipeline.held_out_tasks(cfg), pipeline.extra_held_out_sets(cfg)
  assert set(extra) == {"templates"}
  adapter = registry.get_adapter("builtin")
  service = PolicyService(create_model(get_preset("tiny"), seed=0), tok_lib.load_tokenizer(), cfg,
                          str(tmp_path / "sockets"))
  trial_cfg = TrialConfig(harness_timeout_s=60.0, max_turns=1, sandbox=SandboxConfig(backend="local"))
  n = int(cfg.eval.samples)
  try:
    # four pools, one per (set, mode): the evaluation as it was
    want, want_trials = {}, {}
    for mode, ts in (("", tasks), ("templates", extra["templates"])):
      for name, temp, k in (("sample", float(cfg.sampling.temperature), n), ("greedy", 0.0, 1)):
        res = multihost.run_shared_trials(
            ts, [adapter] * len(ts), k, service.proxy(name, temp), trial_cfg,
            str(tmp_path / "four" / f"{mode}_{name}"), concurrency=4, max_retries=1,
            seed_of=lambda g, s, ts=ts: derive_seed("eval", int(cfg.seed), ts[g].id, s))
        p = f"{mode}/" if mode else ""
        if name == "greedy":
          want[f"{p}greedy_solve_rate"] = rl_loop.solve_stats(res)["solve_rate"]
        else:
          stats = rl_loop.solve_stats(res, k_values=[1, n])
          want.update({f"{p}solve_rate": stats["solve_rate"], f"{p}pass@{n}": stats[f"pass@{n}"],
                       f"{p}n_trials": stats["n_trials"],
                       f"{p}solve_rate_se": stats["solve_rate_se"],
                       f"{p}n_tasks_mixed": stats["n_tasks_mixed"]})
          outcomes = {}
          for r in res:  # policy outcomes per task, in trial order, for the paired comparison
            if r.status not in st.INFRASTRUCTURE_STATUSES:
              outcomes.setdefault(r.task_id, []).append(int(r.status == st.SOLVED))
          want.setdefault("outcomes", {})[mode] = outcomes
        want_trials[(mode, name)] = [(r.task_id, *_trial(r)) for r in res]
    # one pool
    trials = tmp_path / "trials.jsonl"
    got = pipeline.evaluate_held_out(service, tasks, extra, adapter, trial_cfg, cfg,
                                     str(tmp_path / "one"), trials_path=str(trials), phase="ev")
  finally:
    service.close()
  # Each set's tasks by bug: the clusters of its standard errors (one task per bug here).
  assert got.pop("clusters") == {m: {t.id: bug_key(t) for t in ts}
                                 for m, ts in (("", tasks), ("templates", extra["templates"]))}
  assert got == want
  lines = _lines(trials)
  assert [(l["phase"], l["temperature"]) for l in lines] == (
      [("ev", cfg.sampling.temperature)] * 4 + [("ev", 0.0)] * 2
      + [("ev_templates", cfg.sampling.temperature)] * 4 + [("ev_templates", 0.0)] * 2)
  got_trials = {}
  for l in lines:
    mode = "templates" if l["phase"] == "ev_templates" else ""
    got_trials.setdefault((mode, "greedy" if l["temperature"] == 0.0 else "sample"), []).append(
        (l["task_id"], *_trial(l)))
  assert got_trials == want_trials
  sampled = [ids for (_, name), v in want_trials.items() if name == "sample" for _, _, ids in v]
  assert len({tuple(s) for s in sampled}) > 1  # the samples differ from one another
  assert (tmp_path / "one" / "trials.jsonl").exists()  # the pool's own record
  assert any((tmp_path / "one_templates" / "greedy").iterdir())  # trial directories as before
