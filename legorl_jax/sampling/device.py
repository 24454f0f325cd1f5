"""What the sampling engine keeps on the device, and every call it makes there.

The parameters, the KV cache (live rows, then the prefix store's rows) and the reused window
buffers live here, with the jitted steps of ``sampling.steps`` that read and write them. The
scheduler decides *what* to prefill, decode, copy or swap; this module only runs it, so a step
can be swapped in one place (the fault tests replace ``decode_step``) and the cache rebuilt when
a failed call consumed it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from legorl_jax import errors
from legorl_jax.models import params as model_params
from legorl_jax.models.decoder import Decoder
from legorl_jax.sampling import fused as fused_lib
from legorl_jax.sampling import steps
from legorl_jax.sampling.cache import SCRATCH, Cache
from legorl_jax.sharding import rules as sharding_rules


class Device:
  """Parameters (with their version), the KV cache of ``num_rows`` rows, and the step calls.

  Args:
    model: the ``Decoder`` whose parameter buffers are used as they are.
    num_rows: cache rows (the engine's ``max_batch`` plus the prefix store's rows).
    max_len: cache slots per row.
    cache_dtype: K/V dtype (None: the model's compute dtype).
    record_routes: keep the route cache (``sampling.cache``; mixture-of-experts models only).
  """

  def __init__(self, model: Decoder, num_rows: int, max_len: int, cache_dtype=None,
               record_routes: bool = False, fuse_projections: bool = False):
    self.config, self.num_rows, self.max_len = model.config, num_rows, max_len
    self.record_routes = bool(record_routes)
    self.graphdef, state = nnx.split(model)
    self.model_def, _ = model_params.split_model(model)
    # Fused q|k|v and gate|up kernels (``sampling.fused``), only when asked for: on XLA:CPU
    # they measured slower (0.96x per decode step at SmolLM2's shapes, 32 rows), and on a
    # mesh, concatenating head-sharded kernels would interleave q and kv heads across shards.
    self.fuse_projections = bool(fuse_projections)
    if self.fuse_projections and _spans_devices(state):
      raise errors.ConfigError(
          "Engine(fuse_projections=True) needs parameters on one device: on a mesh the fused "
          "q|k|v and gate|up kernels would interleave head-sharded columns across shards. Leave "
          "fuse_projections off for a sharded model.")
    self.fused = None
    self.state = state
    self.version = 0
    self._cache_dtype = cache_dtype
    self.cache = self.new_cache()
    self.prefill_step, self.decode_step = steps.PREFILL, steps.DECODE
    self.swap_step, self.copy_step = steps.SWAP_ROWS, steps.COPY_PREFIX
    # On one CPU device, each step's window is built in the previous call's window buffer of the
    # same kind (see ``sampling.steps``): one for decode, one per prefill row bucket, each no
    # larger than its window.
    sharding = self.cache.k[0].sharding
    self._keep_windows = (len(sharding.device_set) == 1
                          and next(iter(sharding.device_set)).platform == "cpu")
    self._window_buffers: dict[str, object] = {}

  @property
  def state(self):
    """The parameters (``nnx.split`` state); setting them rebuilds the fused kernels."""
    return self._state

  @state.setter
  def state(self, state):
    self._state = state
    if self.fuse_projections:
      self.fused = fused_lib.FUSE(self.graphdef, state)

  # -- the cache --------------------------------------------------------------------------------
  def new_cache(self) -> Cache:
    """Zero cache; on the parameters' mesh (if any) with K/V heads split like the weights."""
    make = functools.partial(Cache.zeros, self.config, self.num_rows, self.max_len,
                             self._cache_dtype, routes=self.record_routes)
    sharding = jax.tree.leaves(self.state)[0].sharding
    if not isinstance(sharding, NamedSharding):
      return make()
    c = self.config

    def spec(logical, shape):
      return NamedSharding(sharding.mesh,
                           sharding_rules.logical_to_spec(logical, shape, sharding.mesh))

    b, h, s, d = self.num_rows, c.num_kv_heads, self.max_len, c.head_dim
    k = spec((None, "kv_heads", "head_dim", None), (b, h, d, s))
    v = spec((None, "kv_heads", None, "head_dim"), (b, h, s, d))
    n = c.num_layers
    routes = NamedSharding(sharding.mesh, PartitionSpec()) if self.record_routes else None
    return jax.jit(make, out_shardings=Cache(k=(k,) * n, v=(v,) * n, routes=routes))()

  def lost(self) -> bool:
    """True when a failed call consumed (donated) the cache's buffers."""
    return any(x.is_deleted() for x in jax.tree.leaves(self.cache))

  def reset(self):
    """After a failed step: drop the window buffers and rebuild the cache if it was lost."""
    self._window_buffers.clear()
    if self.lost():
      self.cache = self.new_cache()

  def block_until_ready(self):
    jax.block_until_ready(self.cache)

  # -- the calls --------------------------------------------------------------------------------
  def _window_buffer(self, kind: str, shapes):
    """The kept window buffer of ``kind`` if it has these shapes, else a new one; None when
    buffers are not kept. The buffer is taken out: a failed call may have consumed it."""
    if not self._keep_windows:
      return None
    buf = self._window_buffers.pop(kind, None)
    if buf is None or jax.tree.map(lambda b: b.shape, buf) != jax.tree.map(lambda x: x.shape,
                                                                          shapes):
      buf = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
      # A kept buffer is a step's output, committed to its device when the cache or parameters
      # are; a new one must match, or the step would trace again for the other kind of input.
      if any(x.committed for x in (self.cache.k[0], *jax.tree.leaves(self.state))):
        buf = jax.device_put(buf, self.cache.k[0].sharding)
    return buf

  def prefill(self, slots, ids, pos, attn: int):
    """Prefills ``ids`` at positions ``pos`` (-1: padding) into cache rows ``slots``."""
    # One buffer per prefill row bucket: a burst of arrivals alternates 1-row and 4-row groups.
    kind = f"prefill/{len(slots)}"
    buf = self._window_buffer(kind, steps.window_shapes(self.cache, len(slots), attn))
    out = self.prefill_step(self.graphdef, self.state, self.cache, slots, ids, pos,
                            attn_len=attn, window_buffer=buf, fused=self.fused)
    if buf is None:
      self.cache = out
    else:
      self.cache, self._window_buffers[kind] = out

  def decode(self, rows, num_rows: int, attn: int, num_steps: int, shared=None):
    """Runs one decode chunk on rows ``[0, num_rows)``; returns (rows, out_ids, out_logp).
    ``shared``: a ``shared_prefix.Plan``, or None (plain attention)."""
    prefix_len, groups = (shared.prefix_len, shared.groups) if shared is not None else (0, None)
    buf = None
    if prefix_len or num_rows < self.num_rows or attn < self.max_len:  # else the whole cache
      buf = self._window_buffer("decode", steps.decode_window_shapes(self.cache, num_rows, attn,
                                                                     prefix_len))
    out = self.decode_step(self.graphdef, self.state, self.cache, rows, num_rows=num_rows,
                           attn_len=attn, num_steps=num_steps, window_buffer=buf,
                           fused=self.fused, groups=groups, prefix_len=prefix_len)
    self.cache = out[0]
    if buf is not None:
      self._window_buffers["decode"] = out[4]
    return out[1:4]

  def copy_prefix(self, src: int, dst: int, attn: int):
    """K/V positions ``[0, attn)`` of row ``src`` -> row ``dst``."""
    self.cache = self.copy_step(self.cache, np.int32(src), np.int32(dst), attn_len=attn)

  def swap_rows(self, a: int, b: int):
    self.cache = self.swap_step(self.cache, np.int32(a), np.int32(b))

  def routes(self, row: int, length: int) -> np.ndarray:
    """The route cache of positions ``[0, length)`` of ``row``: ``[length, L_moe, k]`` in
    ``config.route_dtype`` (a host copy; the next step may overwrite the row)."""
    full = np.asarray(steps.ROW_ROUTES(self.cache.routes, np.int32(row)))
    return full[SCRATCH:SCRATCH + length].copy()


def _spans_devices(state) -> bool:
  """Whether the parameters are placed across more than one device (a model on a mesh puts
  every leaf on the mesh's devices, as ``new_cache`` also assumes)."""
  return len(jax.tree.leaves(state)[0].sharding.device_set) > 1
