"""Multi-host plumbing: process-group start-up, per-host work shares, global batch assembly.

On a multi-host slice every host runs the same program. Each host runs its own share of the
harness trials on its CPUs, turns them into a *local* batch (the rows its devices hold) and
the hosts together form one global ``jax.Array`` with ``jax.make_array_from_process_local_data``;
the jitted update then runs SPMD over the mesh that spans all hosts. Everything here is a
no-op (or the identity) in a single process, so the same code path serves a laptop and a pod.

Checkpoints go through orbax, which writes each host's shards itself; a ``gs://`` directory
works as is (orbax/tensorstore for arrays, ``etils.epath`` for the small JSON items).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from legorl_jax import errors

log = logging.getLogger(__name__)

# Environment fallbacks for launchers that cannot pass flags (JAX itself reads the first).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
_BATCH_AXES = ("data", "fsdp")


def _int_or_none(v) -> int | None:
  if v is None or v == "":
    return None
  return int(v)


def _tpu_worker_count() -> int:
  """Hosts in this Cloud TPU slice as the TPU runtime advertises them (1 if not a TPU VM)."""
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h.strip()]) or 1


def _backends_started() -> bool:
  try:
    from jax._src import xla_bridge
    return bool(xla_bridge.backends_are_initialized())
  except Exception:  # Private API moved: let jax.distributed report it instead.
    return False


def maybe_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, *, mode: str = "auto",
                     local_device_ids: Sequence[int] | None = None,
                     initialization_timeout: int = 300) -> bool:
  """Starts ``jax.distributed`` when this run spans more than one process.

  Call it first thing in an entry point, before anything touches a JAX device. Arguments left
  unset fall back to ``$JAX_COORDINATOR_ADDRESS``, ``$JAX_NUM_PROCESSES``, ``$JAX_PROCESS_ID``.
  ``mode``: ``"auto"`` initialises when ``num_processes > 1`` or the TPU runtime lists several
  workers (Cloud TPU VMs need no arguments: JAX reads the slice's metadata); ``"always"`` calls
  ``jax.distributed.initialize`` with whatever is known (cluster auto-detection fills the rest:
  TPU, SLURM, Open MPI, Kubernetes); ``"never"`` does nothing. Returns whether the process
  group is (now) initialised. Idempotent.
  """
  if mode not in ("auto", "always", "never"):
    raise errors.ConfigError(f"distributed mode={mode!r} is invalid; choose auto, always or never.")
  if jax.distributed.is_initialized():
    return True
  if mode == "never":
    return False
  coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
  num_processes = _int_or_none(num_processes if num_processes is not None
                               else os.environ.get(ENV_NUM_PROCESSES))
  process_id = _int_or_none(process_id if process_id is not None and process_id >= 0
                            else os.environ.get(ENV_PROCESS_ID))
  if num_processes is not None and num_processes <= 0:
    num_processes = None  # 0 / -1 in a config: "not set"
  if mode == "auto":
    if num_processes == 1:
      return False
    if num_processes is None and _tpu_worker_count() <= 1:
      return False
    if num_processes is not None and (coordinator_address is None or process_id is None):
      raise errors.ShardingError(
          f"num_processes={num_processes} needs a coordinator address and this process's id: "
          f"pass coordinator_address='HOST:PORT' and process_id (or set ${ENV_COORDINATOR} and "
          f"${ENV_PROCESS_ID}); on Cloud TPU VMs leave all three unset.")
  if _backends_started():
    raise errors.ShardingError(
        "jax.distributed must start before any JAX computation, but devices are already in use; "
        "call legorl_jax.sharding.distributed.maybe_initialize() at the top of the entry point.")
  kwargs: dict[str, Any] = dict(coordinator_address=coordinator_address,
                                num_processes=num_processes, process_id=process_id,
                                initialization_timeout=int(initialization_timeout))
  if local_device_ids is not None:
    kwargs["local_device_ids"] = list(local_device_ids)
  try:
    jax.distributed.initialize(**kwargs)
  except (RuntimeError, ValueError) as e:
    raise errors.ShardingError(
        f"jax.distributed.initialize failed ({e}); check that every host runs the same command, "
        f"that the coordinator {coordinator_address or '(auto-detected)'} is reachable from all "
        "of them and that process ids are 0..num_processes-1.") from e
  log.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
           jax.process_count(), jax.local_device_count(), jax.device_count())
  return True


def initialize_from_config(cfg) -> bool:
  """``maybe_initialize`` from an optional ``distributed`` config section (absent: auto)."""
  d = cfg.get("distributed", None) if cfg is not None else None
  if d is None:
    return maybe_initialize()
  return maybe_initialize(d.get("coordinator_address", "") or None,
                          _int_or_none(d.get("num_processes", None)) or None,
                          _int_or_none(d.get("process_id", None)),
                          mode=d.get("mode", "auto"))


def is_coordinator() -> bool:
  """Process 0 writes the run-level files (metrics, summary, plots)."""
  return jax.process_index() == 0


# -- per-host work shares -------------------------------------------------------------------------

def host_share(n: int, process_index: int | None = None, process_count: int | None = None
               ) -> range:
  """Indices ``[0, n)`` this host handles (contiguous, sizes differ by at most one).

  Share whole GRPO groups (tasks), not single trials, so each host computes group-relative
  advantages from its own trials without talking to the others.
  """
  i = jax.process_index() if process_index is None else process_index
  k = jax.process_count() if process_count is None else process_count
  base, extra = divmod(n, k)
  start = i * base + min(i, extra)
  return range(start, start + base + (1 if i < extra else 0))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """``[B, ...]`` split over the mesh's batch axes (``data`` x ``fsdp``), the rest replicated;
  the same layout as ``trainer.train_step.batch_shardings``."""
  axes = tuple(a for a in _BATCH_AXES if a in mesh.shape)
  return NamedSharding(mesh, P(axes, *([None] * (ndim - 1))))


def _local_shards(mesh: Mesh) -> tuple[int, int]:
  """(batch shards in the whole mesh, distinct batch shards this process's devices hold)."""
  sh = batch_sharding(mesh, 1)
  n = int(np.prod([mesh.shape[a] for a in _BATCH_AXES if a in mesh.shape]))
  starts = {idx[0].start or 0 for idx in sh.addressable_devices_indices_map((n,)).values()}
  return n, len(starts)


def local_batch_rows(global_rows: int, mesh: Mesh) -> np.ndarray:
  """Row indices of a ``[global_rows, ...]`` batch that this process must supply, in the order
  ``global_batch`` expects them (ascending). ``global_rows`` must divide over the batch axes."""
  n, _ = _local_shards(mesh)
  if global_rows % n:
    raise errors.ShardingError(
        f"global batch of {global_rows} rows does not split over the mesh batch axes "
        f"({n} shards); make trainer.rows_per_batch a multiple of data x fsdp = {n}.")
  sh = batch_sharding(mesh, 1)
  rows = set()
  for idx in sh.addressable_devices_indices_map((global_rows,)).values():
    rows.update(range(*idx[0].indices(global_rows)))
  return np.asarray(sorted(rows), np.int64)


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles the global device batch from each process's rows.

  ``local_batch``: name -> ``[b_local, ...]`` host arrays holding, on every process, the rows
  given by ``local_batch_rows`` (a host that trains on its own trials simply fills them with
  its own rows: only their count matters). Returns name -> ``[b_local * shards / local_shards,
  ...]`` ``jax.Array`` sharded like ``batch_sharding`` across all hosts. Single process: the
  same as ``jax.device_put`` with that sharding.
  """
  n, local = _local_shards(mesh)
  out = {}
  for k, v in local_batch.items():
    if v is None:
      continue
    v = np.asarray(v)
    if v.shape[0] % local:
      raise errors.ShardingError(
          f"local batch {k!r} has {v.shape[0]} rows, which does not split over this host's "
          f"{local} batch shards; give every host a multiple of {local} rows.")
    global_shape = (v.shape[0] * n // local,) + v.shape[1:]
    out[k] = jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v, global_shape)
  return out


def put_global(tree, shardings):
  """Places a host pytree that is identical on every process (e.g. freshly initialised
  parameters from the same seed) onto global ``shardings``; each host fills its own shards."""

  def one(x, sh):
    if x is None:
      return None
    a = np.asarray(x)
    return jax.make_array_from_callback(a.shape, sh, lambda idx: a[idx])

  return jax.tree.map(one, tree, shardings, is_leaf=lambda x: x is None)


def gather(tree):
  """Every leaf as a full host NumPy array on every process (for metrics, tests, export)."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  from jax.experimental import multihost_utils
  return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def sync(name: str) -> None:
  """Barrier across hosts (no-op in one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


# -- paths ----------------------------------------------------------------------------------------

def is_remote(path: str) -> bool:
  return "://" in str(path)


def checkpoint_dir(workdir: str, name: str = "checkpoints") -> str:
  """Checkpoint directory under ``workdir``; ``gs://bucket/run`` stays a ``gs://`` URL (every
  host writes its own shards there through orbax; the bucket must be writable by the TPU VM
  service account and ``gcsfs`` installed for the JSON items)."""
  return str(epath.Path(workdir) / name)


def host_local_dir(workdir: str, name: str, root: str = "/tmp/legorl") -> str:
  """A directory for this host's trial files (sandboxes, sockets, per-trial JSON).

  Sandboxes and Unix sockets need a local file system, so with a ``gs://`` workdir they live
  under ``root`` instead; with several hosts each gets ``host_<i>`` so names never collide.
  """
  base = os.path.join(root, str(workdir).split("://", 1)[1]) if is_remote(workdir) else str(workdir)
  if jax.process_count() > 1:
    base = os.path.join(base, f"host_{jax.process_index()}")
  return os.path.join(base, name)
