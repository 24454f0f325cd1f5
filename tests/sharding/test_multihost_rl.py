"""Multi-host RL end to end: two ``jax.distributed`` processes on this machine run
``pipeline.run`` (evaluation, one RL step with the built-in harness in local sandboxes, the
tiny policy), each running its share of the trials; the update over the global batch must
equal a single-device ``Learner.update`` on the same rows, rebuilt here from the recorded
trajectories (loss, entropy and every parameter)."""

import collections
import json

import numpy as np
import pytest

from legorl_jax.rollout.trajectory import Trajectory
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.sharding import distributed
from legorl_jax.trainer import pipeline, rl_loop
from legorl_jax.trainer.checkpoint import Checkpointer
from legorl_jax.trainer.learner import Learner
from tests.sharding import multihost_rl_worker as worker
from tests.sharding import two_processes



def _lines(path):
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


def _reference_batches(results, cfg, hosts=2):
  """The global batches as one process holding every host's rows would see them: host h's
  batches from its own groups (``rows_per_batch / hosts`` rows each), equal counts per length
  (missing ones all padding), host blocks stacked in process order."""
  local_cfg = pipeline._with(cfg, trainer={"rows_per_batch": int(cfg.trainer.rows_per_batch) // hosts})
  per_host = []
  for h in range(hosts):
    share = set(distributed.host_share(int(cfg.rollout.tasks_per_step), h, hosts))
    batches, _ = rl_loop.build_batches([r for r in results if r.group in share], local_cfg, 0)
    by_len = collections.defaultdict(list)
    for b in batches:
      by_len[b["input_ids"].shape[1]].append(b)
    per_host.append(by_len)
  out = []
  for t in sorted({t for d in per_host for t in d}):
    template = next(d[t][0] for d in per_host if d[t])
    for i in range(max(len(d[t]) for d in per_host)):
      blocks = [d[t][i] if i < len(d[t]) else {k: np.zeros_like(v) for k, v in template.items()}
                for d in per_host]
      out.append({k: np.concatenate([b[k] for b in blocks]) for k in template})
  return out


@pytest.mark.slow
def test_two_hosts_share_trials_and_update_like_one(tmp_path):
  workdir = tmp_path / "run"
  two_processes.run("tests.sharding.multihost_rl_worker", workdir, timeout=600)
  check_run(workdir)


def check_run(workdir):
  cfg = worker.config()
  # Process 0 wrote every host's trial records; each host ran whole groups in its own dir.
  trials = _lines(workdir / "trials.jsonl")
  rl = [t for t in trials if t["phase"] == "rl"]
  assert len(rl) == 4 and collections.Counter(t["group"] for t in rl) == {0: 2, 1: 2}
  for t in rl:
    assert f"host_{t['group']}" in t["trajectory_path"], t["trajectory_path"]
  ev = [t for t in trials if t["phase"] == "eval_before_rl"]
  assert sorted(t["group"] for t in ev) == [0, 1]
  assert {f"host_{t['group']}" in t["trajectory_path"] for t in ev} == {True}
  metrics = _lines(workdir / "metrics.jsonl")
  (train,) = [m for m in metrics if m["phase"] == "train"]
  (before,) = [m for m in metrics if m["phase"] == "eval" and m["step"] == 0]
  assert train["trials"] == 4 and before["n_trials"] == 2
  assert json.load(open(workdir / "summary.json"))["rl_steps"] == 1

  # Reference: one process, one device, the same rows from the recorded trajectories.
  results = []
  for t in rl:
    rec = {k: v for k, v in t.items() if k in TrialResult.__dataclass_fields__}
    results.append(TrialResult(**rec, trajectory=Trajectory.from_json(json.load(open(t["trajectory_path"])))))
  batches = _reference_batches(results, cfg)
  assert batches and train["batch_updates"] == len(batches)
  ref_cfg = worker.config()
  del ref_cfg.mesh
  model, _ = pipeline.build_policy(ref_cfg)
  ref = Learner(model, ref_cfg, seed=int(cfg.seed))
  assert ref.mesh is None
  start = {k: np.asarray(v) for k, v in ref.state.params.items()}
  m_ref = ref.update(batches)
  for k in ("loss/policy", "entropy"):
    np.testing.assert_allclose(train[k], m_ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert train["learner_tokens"] == m_ref["learner_tokens"]

  ckpt = Checkpointer(str(workdir / "checkpoints"), async_save=False)
  state, host, step = ckpt.restore(ref.state)
  ckpt.close()
  assert step == 1 and host["rl_step"] == 1
  moved = 0
  for k, want in ref.state.params.items():
    got = np.asarray(state.params[k])
    np.testing.assert_allclose(got, np.asarray(want), atol=1e-5, err_msg=k)
    moved += not np.allclose(got, start[k], atol=1e-6)
  assert moved > len(start) // 2  # the update really changed the parameters
