"""Shared-prompt decode attention: a group's common prompt K/V read once per step, not per row.

A GRPO group is many rows behind one prompt. The prefix cache already computes that prompt once
(rows copy it), but plain decode attention then reads its K/V once per row at every step. Here
a decode call is split at a position ``P`` (a window size, so shapes stay few):

- **prefix** ``[0, P)``: rows whose prompts agree on their first ``P`` tokens form a group;
  their K/V there is the same (prefilled in chunks aligned to positions, or copied), so the
  call gathers one *leader* row's ``[0, P)`` per group, once, before its loop, and each step
  scores all of a group's queries against it in one matrix product (``[G, Hkv, M * g, Dh]``
  against ``[G, Hkv, Dh, P]``);
- **suffix** ``[P, W)``: each row's own continuation, read from its cache row as before.

The two halves are merged exactly by their log-sum-exp (each keeps its own max and sum). Every
decoding row sits at a position >= ``P`` (``P`` is at most every row's prefilled length), so
the step's writes all land in the suffix window. A row with a prompt of its own is a group of
one (no saving, same result). Results equal the plain path's to float tolerance (the sums are
split differently), as the tests check against the teacher-forced decoder.

Host side, ``plan`` picks ``P`` and the groups for one decode call from the ready rows' prompts;
device side, ``gather`` builds the prefix K/V and ``Prefix.attend`` is the merged attention that
``cache.forward`` calls instead of ``cache.attend``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from legorl_jax.sampling.cache import K_SLOT_AXIS, ROUTE_SLOT_AXIS, SCRATCH, V_SLOT_AXIS, Cache


class Groups(NamedTuple):
  """Which rows share which leader's prefix (int32 arrays; ``R`` = the call's rows).

  leaders: [G] cache row whose ``[0, P)`` K/V the group reads (padding groups: row 0).
  members: [G, M] the group's rows, padded with ``R`` (a zero query, its result unused).
  where: [R] each row's index into the flattened ``[G * M]`` members (rows not decoding: any).
  """

  leaders: jax.Array
  members: jax.Array
  where: jax.Array


class Plan(NamedTuple):
  """One decode call's split: ``prefix_len`` (``P``), the ``groups``, and ``saved_slots``, the
  K/V slot reads per step it avoids (``P`` x (decoding rows - groups))."""

  prefix_len: int
  groups: Groups
  saved_slots: int


def _pow2(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def plan(prompts: Sequence[tuple[int, np.ndarray, int]], num_rows: int,
         candidates: Sequence[int]) -> Plan | None:
  """The split ``P`` and groups for one decode call, or None when sharing saves nothing.

  Args:
    prompts: ``(row, prompt ids, prefilled length)`` of every row that decodes in the call; a
      row's K/V at positions below its prefilled length came from prefill or a prefix copy.
    num_rows: rows of the call (``R``).
    candidates: allowed splits (ascending window sizes); ``P`` is the one that saves the most
      slot reads per step, ``P * (rows - groups)``, among those <= every row's prefilled length.
  Group and member counts are padded to powers of two (fewer compiled shapes).
  """
  if num_rows < 2 or len(prompts) < 2:
    return None
  limit = min(n for _, _, n in prompts)
  best, best_save = None, 0
  for p in candidates:
    if p > limit:
      break
    groups: dict[bytes, list[int]] = {}
    for row, ids, _ in prompts:
      groups.setdefault(np.asarray(ids[:p], np.int32).tobytes(), []).append(row)
    save = p * (len(prompts) - len(groups))
    if save > best_save:
      best, best_save = (p, list(groups.values())), save
  if best is None:
    return None
  p, groups = best
  g, m = _pow2(len(groups)), _pow2(max(len(x) for x in groups))
  leaders = np.zeros(g, np.int32)
  members = np.full((g, m), num_rows, np.int32)
  where = np.full(num_rows, g * m - 1, np.int32)
  for i, rows in enumerate(groups):
    leaders[i] = rows[0]
    members[i, :len(rows)] = rows
    where[rows] = i * m + np.arange(len(rows))
  return Plan(p, Groups(leaders, members, where), best_save)


def suffix_window(cache: Cache, rows: int, start: int, end: int) -> Cache:
  """Rows ``[0, rows)``: the scratch slots, then positions ``[start, end)`` (a copy)."""
  def take(x, axis):
    x = x[:rows]  # the call's rows first: the cache also holds the prefix store's rows
    head = jax.lax.slice_in_dim(x, 0, SCRATCH, axis=axis)
    tail = jax.lax.slice_in_dim(x, SCRATCH + start, SCRATCH + end, axis=axis)
    return jnp.concatenate([head, tail], axis=axis)
  return Cache(k=tuple(take(x, K_SLOT_AXIS) for x in cache.k),
               v=tuple(take(x, V_SLOT_AXIS) for x in cache.v),
               routes=None if cache.routes is None else take(cache.routes, ROUTE_SLOT_AXIS))


def put_suffix_window(cache: Cache, start: int, sub: Cache) -> Cache:
  """Writes back a ``suffix_window(cache, rows, start, end)``."""
  def put(full, w, axis):
    head = jax.lax.slice_in_dim(w, 0, SCRATCH, axis=axis)
    tail = jax.lax.slice_in_dim(w, SCRATCH, w.shape[axis], axis=axis)
    full = jax.lax.dynamic_update_slice(full, head, (0,) * full.ndim)
    at = [0] * full.ndim
    at[axis] = SCRATCH + start
    return jax.lax.dynamic_update_slice(full, tail, at)
  return Cache(k=tuple(put(f, w, K_SLOT_AXIS) for f, w in zip(cache.k, sub.k)),
               v=tuple(put(f, w, V_SLOT_AXIS) for f, w in zip(cache.v, sub.v)),
               routes=None if cache.routes is None else put(cache.routes, sub.routes,
                                                            ROUTE_SLOT_AXIS))


class Prefix(NamedTuple):
  """The gathered prefix of one decode call and the groups that read it.

  offset: ``P`` (static): the suffix window's first position. kt: per layer
  ``[G, Hkv, Dh, P]``; v: per layer ``[G, Hkv, P, Dh]``.
  """

  offset: int
  kt: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  groups: Groups

  def attend(self, layer: int, q: jax.Array, kt: jax.Array, v: jax.Array,
             mask: jax.Array) -> jax.Array:
    """``cache.attend`` over prefix + suffix: q [R, 1, H, Dh]; kt [R, Hkv, Dh, S]; v [R, Hkv,
    S, Dh]; mask [R, 1, S] over the suffix window -> [R, 1, H, Dh]."""
    r, t, h, dh = q.shape
    assert t == 1, "shared-prefix attention is for decode steps (one token per row)"
    hkv = kt.shape[1]
    g = h // hkv
    q = q * jnp.asarray(1.0 / math.sqrt(dh), q.dtype)
    qh = q.reshape(r, hkv, g, dh)
    # Suffix: each row against its own slots.
    s2 = jnp.einsum("rkmd,rkds->rkms", qh, kt, preferred_element_type=jnp.float32)
    s2 = jnp.where(mask[:, 0][:, None, None, :], s2, jnp.finfo(jnp.float32).min)
    m2 = jnp.max(s2, axis=-1, keepdims=True)
    e2 = jnp.exp(s2 - m2)
    l2 = jnp.sum(e2, axis=-1, keepdims=True)
    o2 = jnp.einsum("rkms,rksd->rkmd", e2.astype(v.dtype), v, preferred_element_type=jnp.float32)
    # Prefix: a group's queries together against its leader's K/V (every slot visible).
    grp = self.groups
    ng, nm = grp.members.shape
    qpad = jnp.concatenate([qh, jnp.zeros((1, hkv, g, dh), qh.dtype)])
    qg = qpad[grp.members].transpose(0, 2, 1, 3, 4).reshape(ng, hkv, nm * g, dh)
    kpre, vpre = self.kt[layer].astype(q.dtype), self.v[layer].astype(q.dtype)
    s1 = jnp.einsum("gkmd,gkds->gkms", qg, kpre, preferred_element_type=jnp.float32)
    m1 = jnp.max(s1, axis=-1, keepdims=True)
    e1 = jnp.exp(s1 - m1)
    l1 = jnp.sum(e1, axis=-1, keepdims=True)
    o1 = jnp.einsum("gkms,gksd->gkmd", e1.astype(vpre.dtype), vpre,
                    preferred_element_type=jnp.float32)

    def to_rows(x):  # [G, Hkv, M * g, n] -> [R, Hkv, g, n]
      n = x.shape[-1]
      x = x.reshape(ng, hkv, nm, g, n).transpose(0, 2, 1, 3, 4).reshape(ng * nm, hkv, g, n)
      return x[grp.where]

    o1, m1, l1 = to_rows(o1), to_rows(m1), to_rows(l1)
    m = jnp.maximum(m1, m2)
    a1, a2 = jnp.exp(m1 - m), jnp.exp(m2 - m)
    out = (a1 * o1 + a2 * o2) / (a1 * l1 + a2 * l2)
    return out.astype(q.dtype).reshape(r, 1, h, dh)


def gather(cache: Cache, offset: int, groups: Groups) -> Prefix:
  """Each group leader's K/V at positions ``[0, offset)``, every layer (read once per call)."""
  def take(x, axis):
    x = jnp.take(x, groups.leaders, axis=0)
    return jax.lax.slice_in_dim(x, SCRATCH, SCRATCH + offset, axis=axis)
  return Prefix(offset=offset, kt=tuple(take(x, K_SLOT_AXIS) for x in cache.k),
                v=tuple(take(x, V_SLOT_AXIS) for x in cache.v), groups=groups)
