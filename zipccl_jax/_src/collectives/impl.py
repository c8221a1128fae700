"""The collectives as rows in, rows out: what each does around its transports.

Each implementation flattens its input into rows (one per destination for
psum_scatter and all_to_all, one per source for all_gather and ppermute), asks the
planner for each transport's plan (plan.py), moves the rows (transport.py) and
reassembles lax's result. `Cfg` is a call's static configuration (a custom_vjp
nondiff argument).

Exactness (docs/design.md, "Collectives: semantics"): all_gather, all_to_all and ppermute
return the input's bits for every input; psum_scatter and psum sum the exactly
transported chunks in rank order in float32 and round once, identical for every
codec and codec="raw".
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import compat
from zipccl_jax._src import plan as plan_lib
from zipccl_jax._src import stats as stats_lib
from zipccl_jax._src import transport
from zipccl_jax._src.options import Opts


class Cfg(NamedTuple):
  """Static configuration of one collective call (custom_vjp nondiff argument)."""
  axes: tuple
  n_peers: int
  opts: Opts
  stats: bool
  fn: str
  dim: int = 0          # all_gather axis / psum_scatter scatter_dimension / a2a split_axis
  dim2: int = 0         # a2a concat_axis
  tiled: bool = False
  to: str = "varying"   # all_gather
  perm: tuple = ()      # ppermute


def _plan(cfg: Cfg, collective: str, dtype, m: int, all_to_all: bool = False) -> plan_lib.Plan:
  """The plan of one transport of this call (plan.py): its codec, ladder and chunks."""
  return plan_lib.plan(cfg.fn, dtype, m, cfg.opts, collective=collective, n_peers=cfg.n_peers,
                       all_to_all=all_to_all)


def ag_assemble(g, shape, a, tiled, n_peers):
  """The gathered rows g[N, n] of a leaf of `shape` -> lax.all_gather's result."""
  y = jnp.moveaxis(g.reshape((n_peers,) + shape), 0, a)
  if tiled:
    y = y.reshape(shape[:a] + (n_peers * shape[a],) + shape[a + 1:])
  return y


def _empty(x, shape, cfg: Cfg, name: str, varying: bool = True):
  """The result of a collective on an empty leaf: nothing to move, no collective.

  Why not the transport: jax >= 0.11 rejects an all-gather of a zero-sized
  dimension in its verifier, and jaxlib 0.11.2's Shardy canonicalizer
  (ManualComputationUnusedInputsPattern) crashed the process on our raw transport of
  an empty row (tests/test_collectives.py's empty leaf, Python 3.12). The result is
  typed varying over the axes like lax's, but for psum's (invariant).
  """
  y = jnp.zeros(shape, x.dtype)
  if varying:
    y = compat.pvary(y, cfg.axes)
  if not cfg.stats:
    return y, None
  codec = _plan(cfg, name, x.dtype, 0).name
  return y, stats_lib.make_stats(name, codec, [stats_lib.plain_part(0)])


def ag_impl(x, cfg: Cfg):
  n = x.size
  if n == 0:
    shape = ag_assemble(jnp.zeros((cfg.n_peers, 0), x.dtype), x.shape, cfg.dim, cfg.tiled,
                         cfg.n_peers).shape
    return _empty(x, shape, cfg, "all_gather", varying=cfg.to == "varying")
  plan = _plan(cfg, "all_gather", x.dtype, n)
  g, parts = transport.gather_rows(x.reshape(n), cfg.axes, cfg.n_peers, plan, cfg.stats,
                                   cfg.opts.check_decode)
  y = ag_assemble(g, x.shape, cfg.dim, cfg.tiled, cfg.n_peers)
  if cfg.to == "varying":
    y = compat.pvary(y, cfg.axes)
  return y, (stats_lib.make_stats("all_gather", plan.name, parts) if cfg.stats else None)


def chunk_shape(shape, dim, tiled, n_peers):
  """The shape of the chunk of a leaf of `shape` that goes to one peer."""
  if tiled:
    return shape[:dim] + (shape[dim] // n_peers,) + shape[dim + 1:]
  return shape[:dim] + shape[dim + 1:]


def rows_for_peers(x, dim, tiled, n_peers):
  """x -> (rows[N, m], chunk shape): row j is the chunk along `dim` for peer j."""
  shape = x.shape
  chunk = chunk_shape(shape, dim, tiled, n_peers)
  if tiled:
    x = x.reshape(shape[:dim] + (n_peers, chunk[dim]) + shape[dim + 1:])
  rows = jnp.moveaxis(x, dim, 0).reshape(n_peers, int(np.prod(chunk, dtype=np.int64)))
  return rows, chunk


def rs_impl(x, cfg: Cfg):
  if x.size == 0:
    return _empty(x, chunk_shape(x.shape, cfg.dim, cfg.tiled, cfg.n_peers), cfg,
                  "psum_scatter")
  rows, chunk = rows_for_peers(x, cfg.dim, cfg.tiled, cfg.n_peers)
  plan = _plan(cfg, "psum_scatter", x.dtype, rows.shape[1], all_to_all=True)
  recv, parts = transport.a2a_rows(rows, cfg.axes, plan, cfg.stats, cfg.opts.check_decode)
  y = transport.ordered_sum(recv, x.dtype).reshape(chunk)
  return y, (stats_lib.make_stats("psum_scatter", plan.name, parts) if cfg.stats else None)


def psum_impl(x, cfg: Cfg):
  n = x.size
  if n == 0:
    return _empty(x, x.shape, cfg, "psum", varying=False)
  n_peers = cfg.n_peers
  m = -(-n // n_peers)
  flat = x.reshape(n)
  if n_peers * m != n:
    flat = jnp.pad(flat, (0, n_peers * m - n))
  check = cfg.opts.check_decode
  plan = _plan(cfg, "psum", x.dtype, m, all_to_all=True)
  recv, p1 = transport.a2a_rows(flat.reshape(n_peers, m), cfg.axes, plan, cfg.stats, check)
  mine = transport.ordered_sum(recv, x.dtype)
  # the all-gather half: the same decision, a gather's ladder
  g, p2 = transport.gather_rows(mine, cfg.axes, n_peers,
                                plan_lib.with_ladder(plan, plan.chunks, all_to_all=False),
                                cfg.stats, check)
  y = g.reshape(n_peers * m)[:n].reshape(x.shape)
  return y, (stats_lib.make_stats("psum", plan.name, p1 + p2) if cfg.stats else None)


def a2a_impl(x, cfg: Cfg):
  n_peers = cfg.n_peers
  if x.size == 0:
    chunk = chunk_shape(x.shape, cfg.dim, cfg.tiled, n_peers)
    shape = a2a_assemble(jnp.zeros((n_peers,) + chunk, x.dtype), chunk, cfg.dim2, cfg.tiled,
                          n_peers).shape
    return _empty(x, shape, cfg, "all_to_all")
  rows, chunk = rows_for_peers(x, cfg.dim, cfg.tiled, n_peers)
  plan = _plan(cfg, "all_to_all", x.dtype, rows.shape[1], all_to_all=True)
  recv, parts = transport.a2a_rows(rows, cfg.axes, plan, cfg.stats, cfg.opts.check_decode)
  y = a2a_assemble(recv, chunk, cfg.dim2, cfg.tiled, n_peers)
  return y, (stats_lib.make_stats("all_to_all", plan.name, parts) if cfg.stats else None)


def a2a_assemble(recv, chunk, c, tiled, n_peers):
  """The received rows recv[N, m] (row i from peer i) -> lax.all_to_all's result."""
  y = jnp.moveaxis(recv.reshape((n_peers,) + chunk), 0, c)
  if tiled:
    y = y.reshape(chunk[:c] + (n_peers * chunk[c],) + chunk[c + 1:])
  return y


def pp_impl(x, cfg: Cfg):
  n = x.size
  if n == 0:
    return _empty(x, x.shape, cfg, "ppermute")
  plan = _plan(cfg, "ppermute", x.dtype, n)
  y, parts = transport.permute_row(x.reshape(n), cfg.axes, cfg.perm, cfg.n_peers, plan,
                                   cfg.stats, cfg.opts.check_decode)
  st = stats_lib.make_stats("ppermute", plan.name, parts) if cfg.stats else None
  return y.reshape(x.shape), st
