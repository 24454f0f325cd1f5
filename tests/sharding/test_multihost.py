"""Multi-host learner: two ``jax.distributed`` processes on this machine (CPU, gloo collectives)
run the sharded update over one (2, 2, 2) mesh spanning both, each feeding its own rows, and
must reproduce a single process holding the whole batch; plus the single-process behaviour of
the helpers in ``legorl_jax.sharding.distributed``."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.models.params import split_model
from legorl_jax.sharding import distributed, make_mesh
from legorl_jax.trainer import state as state_lib, train_step as ts
from tests.sharding import two_processes
from tests.trainer import test_train_step as helpers



@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
  two_processes.run("tests.sharding.multihost_worker", tmp_path, timeout=420)

  # Each process fed a disjoint half; together they cover the batch.
  rows = [json.load(open(tmp_path / f"rows_{i}.json")) for i in range(2)]
  assert all(len(r) == 4 for r in rows) and sorted(rows[0] + rows[1]) == list(range(8))

  # Reference: one process, one device, the whole global batch.
  cfg = helpers.make_cfg(micro=2)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
  model_def, params = split_model(create_model(helpers.CFG, seed=0))
  batch = jax.tree.map(jnp.asarray, helpers.make_batch(b=8, seed=3))
  ref, m_ref = jax.jit(ts.make_train_step(model_def, opt, cfg))(
      state_lib.create_train_state(params, opt), batch)

  res = np.load(tmp_path / "result.npz")
  np.testing.assert_allclose(res["__loss__"], m_ref["loss/policy"], rtol=1e-5, atol=1e-6)
  for k in params:
    assert not np.allclose(res[k], params[k]), f"{k} did not move"
    np.testing.assert_allclose(res[k], np.asarray(ref.params[k]), atol=1e-5, err_msg=k)
  assert bool(res["__restored_same__"]) and int(res["__host_step__"]) == 1


def test_global_batch_single_process_is_device_put():
  mesh = make_mesh(2, 2, 2)
  full = helpers.make_batch(b=8, seed=1)
  rows = distributed.local_batch_rows(8, mesh)
  np.testing.assert_array_equal(rows, np.arange(8))
  gb = distributed.global_batch(full, mesh)
  ref = ts.batch_shardings(full, mesh)
  for k, v in full.items():
    assert gb[k].shape == v.shape and gb[k].sharding.is_equivalent_to(ref[k], v.ndim)
    np.testing.assert_array_equal(np.asarray(gb[k]), v)
  with pytest.raises(errors.ShardingError, match="multiple of data x fsdp = 4"):
    distributed.local_batch_rows(6, mesh)
  with pytest.raises(errors.ShardingError, match="rows"):
    distributed.global_batch({"x": np.zeros((3, 2))}, mesh)


def test_put_global_and_gather_round_trip():
  mesh = make_mesh(2, 2, 2)
  model_def, params = split_model(create_model(helpers.CFG, seed=0))
  sh = model_def.shardings(mesh)
  placed = distributed.put_global(params, sh)
  assert placed["layers.0.mlp.up_kernel"].sharding == sh["layers.0.mlp.up_kernel"]
  back = distributed.gather(placed)
  for k in params:
    np.testing.assert_array_equal(back[k], np.asarray(params[k]))


def test_host_share_partitions_groups():
  for n in (0, 1, 7, 8, 13):
    for k in (1, 2, 3, 4):
      shares = [distributed.host_share(n, i, k) for i in range(k)]
      assert [j for s in shares for j in s] == list(range(n))
      assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_maybe_initialize_single_process(monkeypatch):
  for k in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID,
            "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(k, raising=False)
  assert distributed.maybe_initialize() is False
  assert distributed.maybe_initialize(num_processes=1) is False
  assert distributed.maybe_initialize(mode="never") is False
  with pytest.raises(errors.ShardingError, match="coordinator"):
    distributed.maybe_initialize(num_processes=2)
  jax.devices()  # backends are up now: joining a process group must be refused, with the fix
  with pytest.raises(errors.ShardingError, match="maybe_initialize"):
    distributed.maybe_initialize("127.0.0.1:1", 2, 0)
  with pytest.raises(errors.ConfigError):
    distributed.maybe_initialize(mode="sometimes")


def test_paths():
  assert distributed.checkpoint_dir("gs://bucket/run") == "gs://bucket/run/checkpoints"
  assert distributed.checkpoint_dir("/tmp/run", "ckpt") == "/tmp/run/ckpt"
  assert distributed.host_local_dir("gs://bucket/run", "trials") == "/tmp/legorl/bucket/run/trials"
  assert distributed.host_local_dir("/w", "trials") == "/w/trials"
