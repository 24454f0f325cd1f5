"""One process of the two-process learner test (``tests/sharding/test_multihost.py``).

  python -m tests.sharding.multihost_worker PROCESS_ID NUM_PROCESSES PORT OUT_DIR

Run with ``JAX_PLATFORMS=cpu`` and ``XLA_FLAGS=--xla_force_host_platform_device_count=4``:
the processes join one ``jax.distributed`` group, build a ``(2, 2, 2)`` mesh over all their
devices, feed their own rows of the global batch, run one sharded learner step, checkpoint
the new state with orbax and restore it. Process 0 writes the gathered result to
``OUT_DIR/result.npz``; every process writes the rows it fed to ``OUT_DIR/rows_<i>.json``.
"""

import json
import os
import sys

from legorl_jax.sharding import distributed


def main(process_id: int, num_processes: int, port: int, out_dir: str):
  assert distributed.maybe_initialize(f"127.0.0.1:{port}", num_processes, process_id,
                                      initialization_timeout=120)
  import jax
  import numpy as np
  import optax

  from legorl_jax.models import create_model
  from legorl_jax.models.params import split_model
  from legorl_jax.sharding import make_mesh
  from legorl_jax.trainer import state as state_lib, train_step as ts
  from legorl_jax.trainer.checkpoint import Checkpointer
  from tests.trainer import test_train_step as helpers

  assert jax.process_count() == num_processes, jax.process_count()
  mesh = make_mesh(2, 2, 2)
  assert len(mesh.local_devices) < mesh.devices.size  # the mesh spans both processes

  cfg = helpers.make_cfg(micro=2)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
  model_def, params = split_model(create_model(helpers.CFG, seed=0))
  step_fn = ts.make_train_step(model_def, opt, cfg)
  state = state_lib.create_train_state(params, opt)
  state_sh = state_lib.state_shardings(state, model_def, mesh)
  state = distributed.put_global(state, state_sh)

  full = helpers.make_batch(b=8, seed=3)   # every process knows it only to cut its own rows
  rows = distributed.local_batch_rows(8, mesh)
  batch = distributed.global_batch({k: v[rows] for k, v in full.items()}, mesh)
  with open(os.path.join(out_dir, f"rows_{process_id}.json"), "w") as f:
    json.dump([int(r) for r in rows], f)

  step = ts.jit_train_step(step_fn, state_sh, ts.batch_shardings(batch, mesh))
  new_state, metrics = step(state, batch)
  new_params = distributed.gather(new_state.params)
  loss = distributed.gather(metrics["loss/policy"])

  ckpt = Checkpointer(distributed.checkpoint_dir(out_dir), keep=1, async_save=False)
  ckpt.save(1, new_state, host={"rl_step": 1}, force=True)
  ckpt.wait()
  restored, host, _ = ckpt.restore(new_state)
  ckpt.close()
  restored_params = distributed.gather(restored.params)
  same = all(np.array_equal(restored_params[k], new_params[k]) for k in new_params)
  assert restored.params["layers.0.mlp.up_kernel"].sharding == new_state.params[
      "layers.0.mlp.up_kernel"].sharding
  distributed.sync("done")
  if distributed.is_coordinator():
    np.savez(os.path.join(out_dir, "result.npz"), __loss__=loss, __restored_same__=same,
             __host_step__=host["rl_step"], **new_params)
  print(f"process {process_id}: ok", flush=True)


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
