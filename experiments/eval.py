r"""Evaluates a policy inside native harnesses on a task set.

  python -m experiments.eval --config=experiments/configs/eval.py --workdir=/tmp/eval \
      --config.harness=builtin --config.policy=scripted --config.sandbox=local \
      --config.tasks=synthetic:4 --config.concurrency=2

With ``--config.backend=ray`` the trials run as Ray tasks (a local cluster, or the one named by
``--config.ray_address=auto|ray://HOST:10001``) while the policy and its proxy stay here; each
``trials.jsonl`` line then names the Ray ``node`` it ran on.

Writes ``WORKDIR/trials.jsonl`` (one line per trial attempt: task, harness, status, reward,
turns, tokens, durations, log paths; ``final`` marks the counted attempt),
``WORKDIR/summary.json`` (``solve_rate``, ``n_trials``, counts by status and harness) and one
directory per trial with the harness logs and the recorded trajectory. Prints the summary
as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Eval config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.", required=True)


def load_tasks(spec: str, *, difficulty: str = "easy", split: str = "validation", seed: int = 0,
               limit: int = 0):
  """``synthetic:N`` | a task JSONL file | a TFDS task dataset directory -> list[Task]."""
  from legorl_jax import errors
  if spec.startswith("synthetic"):
    from legorl_jax.taskgen.synthetic import generate_tasks
    _, _, n = spec.partition(":")
    try:
      n = int(n or 4)
    except ValueError:
      raise errors.ConfigError(f"tasks={spec!r}: write synthetic:N with an integer N.") from None
    tasks = generate_tasks(n, seed=seed, difficulty=difficulty, split=split)
  elif os.path.isfile(spec):
    from legorl_jax.tasks.jsonl import load_tasks_jsonl
    tasks, bad = load_tasks_jsonl(spec)
    for e in bad:
      logging.warning("skipping task: %s", e)
  elif os.path.isdir(spec):
    from legorl_jax.tasks.tfds_builder import open_task_source, record_to_task
    source = open_task_source(spec, split)
    tasks = [record_to_task(source[i]) for i in range(len(source))]
  else:
    raise errors.ConfigError(
        f"tasks={spec!r} is neither synthetic:N, a task JSONL file nor a task dataset directory.")
  if limit:
    tasks = tasks[:limit]
  if not tasks:
    raise errors.ConfigError(f"tasks={spec!r} gave no tasks.")
  return tasks


def make_backend(config, tasks):
  """(backend, tokenizer, proxy config, stop callable) for ``config.policy``."""
  from legorl_jax.harnesses.scripted import ScriptedPolicy, patches_by_instruction
  from legorl_jax.models import create_model, from_pretrained, get_preset
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.proxy import EngineBackend, ProxyConfig, ScriptedBackend
  from legorl_jax.sampling import Engine

  policy = config.policy
  if policy == "scripted":
    tokenizer = tok_lib.load_tokenizer(config.tokenizer or None)
    backend = ScriptedBackend(tokenizer, ScriptedPolicy(patches_by_instruction(tasks)).reply)
    return backend, tokenizer, ProxyConfig(model_name="policy"), lambda: None
  if os.path.isdir(policy):
    model = from_pretrained(policy)
    tokenizer = tok_lib.load_tokenizer(config.tokenizer or policy)
  else:
    cfg = get_preset(policy)
    if cfg.max_position_embeddings < config.engine.max_len:
      cfg = cfg.replace(max_position_embeddings=config.engine.max_len)
    model = create_model(cfg, seed=config.seed)
    tokenizer = tok_lib.load_tokenizer(config.tokenizer or None)
  max_len = min(config.engine.max_len, model.config.max_position_embeddings)
  engine = Engine(model, max_batch=config.engine.max_batch, max_len=max_len,
                  prefill_buckets=tuple(config.engine.prefill_buckets),
                  decode_chunk=config.engine.decode_chunk, seed=config.seed, decode_fn=tokenizer)
  engine.start()
  proxy_config = ProxyConfig(model_name="policy", force_temperature=config.temperature,
                             max_tokens_cap=config.max_tokens)
  return EngineBackend(engine), tokenizer, proxy_config, engine.stop


def make_trial_backend(config):
  """None (trials on this process's threads) or a ``RayTrialBackend`` for ``backend=ray``."""
  from legorl_jax import errors
  if config.backend == "threads":
    return None
  if config.backend != "ray":
    raise errors.ConfigError(f"backend={config.backend!r}: choose 'threads' or 'ray'.")
  from legorl_jax.rollout.ray_backend import RayOptions, RayTrialBackend
  return RayTrialBackend(RayOptions(
      address=config.ray_address, local_num_cpus=config.ray_num_cpus or config.concurrency,
      trial_cpus=config.ray_trial_cpus, trial_memory_mb=config.ray_trial_memory_mb,
      advertise_host=config.advertise_host, advertise_port=config.advertise_port))


def main(argv):
  del argv
  config = _CONFIG.value
  workdir = _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)

  from legorl_jax.harnesses.registry import HarnessChooser, get_adapter
  from legorl_jax.proxy import ProxyServer
  from legorl_jax.rollout.runner import TrialJob, run_trials
  from legorl_jax.rollout.trial import TrialConfig
  from legorl_jax.sandbox import SandboxConfig

  tasks = load_tasks(config.tasks, difficulty=config.difficulty, split=config.split,
                     seed=config.seed, limit=config.num_tasks)
  chooser = HarnessChooser.from_spec(config.harness)
  rng = np.random.default_rng(config.seed)
  adapters = {}
  jobs = []
  for group, task in enumerate(tasks):
    for _ in range(config.samples_per_task):
      name = chooser.choose(task, rng)
      if name not in adapters:
        adapters[name] = get_adapter(name)
        adapters[name].check_installed()
      jobs.append(TrialJob(task, adapters[name], group=group))

  trial_backend = make_trial_backend(config)
  backend, tokenizer, proxy_config, stop_backend = make_backend(config, tasks)
  sock_dir = tempfile.mkdtemp(prefix="lgev-", dir="/tmp")  # short path: Unix socket limit
  os.chmod(sock_dir, 0o755)
  uds = os.path.join(sock_dir, "proxy.sock")
  proxy = ProxyServer(backend, tokenizer, proxy_config, port=None, uds=uds).start()
  os.chmod(uds, 0o666)  # the sandbox's unprivileged user connects to it
  try:
    trial_config = TrialConfig(harness_timeout_s=config.harness_timeout_s,
                               max_turns=config.max_turns,
                               sandbox=SandboxConfig(backend=config.sandbox),
                               backend=trial_backend)
    logging.info("running %d trials (%s) on %d tasks", len(jobs), sorted(adapters), len(tasks))
    run_trials(jobs, proxy, trial_config, workdir, concurrency=config.concurrency,
               max_retries=config.max_retries,
               extra_summary={"harness": config.harness, "policy": config.policy,
                              "sandbox": config.sandbox, "tasks": config.tasks,
                              "backend": config.backend,
                              "trial_config": {k: v for k, v in dataclasses.asdict(
                                  dataclasses.replace(trial_config, backend=None)).items()
                                  if k not in ("sandbox", "backend")}})
  finally:
    if trial_backend is not None:
      trial_backend.close()
    proxy.stop()
    stop_backend()
    shutil.rmtree(sock_dir, ignore_errors=True)
  with open(os.path.join(workdir, "summary.json")) as f:
    print(json.dumps(json.load(f), sort_keys=True))


if __name__ == "__main__":
  app.run(main)
