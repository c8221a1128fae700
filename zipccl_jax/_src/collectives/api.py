"""Compressed collectives for `jax.shard_map`: drop-in twins of the `jax.lax` ones.

    compressed_all_gather   compressed_psum_scatter   compressed_psum
    compressed_all_to_all   compressed_ppermute

Each validates its arguments (options.py), maps the pytree leaf by leaf with small
leaves bucketed (buckets.py), and runs the differentiable implementation of each
leaf or bucket (autodiff.py over impl.py). Semantics: docs/design.md.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax import lax

from zipccl_jax._src import compat
from zipccl_jax._src import options
from zipccl_jax._src import segments
from zipccl_jax._src.collectives import autodiff
from zipccl_jax._src.collectives import buckets
from zipccl_jax._src.collectives import impl

_OPTIONS_DOC = """
    codec: "auto" (default): with a calibration in force (`zipccl_jax.calibrate`),
      the registered codec with the lowest modelled time for this call
      (`zipccl_jax.costmodel.fastest_codec`), else AUTO_CODEC ("entropy";
      "zipccl" for float32);
      a registered codec ("zipccl", the window codec; "entropy", per-block
      Huffman); "raw" (the same algorithm moving uncompressed uint16/uint32
      bitcasts: the exact twin, bit-identical results) or None (the plain
      `jax.lax` collective, the oracle). Every codec gives the same bits.
    policy: "always" compress; "never" (same as codec="raw"); "auto" compress
      when a row (the message for one peer) holds at least AUTO_MIN_ROW_BYTES
      (64 KiB) raw and its smallest encoding is smaller than that; with a
      calibration (`zipccl_jax.calibrate`), when the cost model says compressing
      is faster.
    stats: also return a `CollectiveStats` (per leaf of x): the rung each
      transport took, used vs slot bytes, whether the raw rung was taken, the
      codec's count, decode errors (counted with check_decode). Free: the stats
      come from the agreement every compressed transport runs anyway, so the
      program (buckets, collectives, sizes) is the same with and without stats,
      and processes may differ in it (stats on one process only).
    check_decode: fail the call's results (a `jax.pure_callback` that the results
      depend on raises, so `block_until_ready` raises an error naming the
      collective) when a received row fails to decode, instead of only returning
      NaN rows. Costs one host callback and one 4-byte psum per transport (the
      failures counted over the participants, so that every device raises). None: on when the
      environment has ZIPCCL_CHECK_DECODE=1. A decode failure means the payload
      was corrupted in transit; the codec itself never produces one.
    chunks: split each compressed row into this many chunks, each its own
      transport (encode, agreement, slot switch), so that a backend that runs
      independent ops concurrently can overlap one chunk's codec with another's
      transfer (docs/design.md, "Transport: the slot ladder"); same bits for every count. "auto":
      the calibrated cost model's count (`costmodel.best_chunks`), 1 without a
      calibration or where no overlap is known (XLA:CPU). None: the environment's
      ZIPCCL_CHUNKS, else "auto". An int in [1, 16]; 1 is the unchunked program.
    bucket_bytes: leaves of a pytree smaller than this (raw bytes per device) are
      packed, per dtype and in leaf order, into buckets of at most this size, and
      each bucket moves as one transport (one row header, agreement and ladder
      for many small leaves; the same bits as leaf by leaf). None: the default,
      `BUCKET_BYTES` (4 MiB); 0: every leaf alone. With stats=True the leaves of
      a bucket share its transport and report the bucket's stats."""


def _with_options_doc(f):
  f.__doc__ = f.__doc__.replace("{options}", _OPTIONS_DOC.strip("\n"))
  return f


@_with_options_doc
def compressed_all_gather(x, axis_name, *, axis: int = 0, tiled: bool = False,
                          to: str = "varying", codec: str | None = "auto", policy: str = "auto",
                          stats: bool = False, check_decode: bool | None = None,
                          chunks: int | str | None = None, bucket_bytes: int | None = None):
  """`jax.lax.all_gather` with compressed payloads; bit-identical result.

  Each device encodes its block once into one row; the participants agree on the
  largest used size (one 4-byte pmax), all-gather that prefix of every row (a
  rung of the slot ladder) and decode it. Data that does not compress takes the
  raw rung (uint16/uint32 bits).

  Args:
    x: array (or pytree), inside `jax.shard_map`; bf16/fp16/fp32 leaves are
      compressed, other leaves take the plain lax collective.
    axis_name: mesh axis name or tuple of names.
    axis: where the gathered axis goes (as lax).
    tiled: concatenate along `axis` instead of stacking (as lax).
    to: "varying" (default, as lax), "invarying" (replicated result type) or
      "reduced" (JAX's reduced type: lax.all_gather's own collective, uncompressed).
{options}

  Returns:
    The gathered array (pytree), and a `CollectiveStats` when stats=True.

  Raises:
    TypeError / ValueError naming the argument: bad dtype, axis, options.
  """
  fn = "compressed_all_gather"
  if to not in ("varying", "invarying", "reduced"):
    raise ValueError(f"{fn}: to must be 'varying', 'invarying' or 'reduced', got {to!r}")
  opts, axes, n_peers = options.setup(fn, axis_name, codec, policy, stats, tiled, check_decode, chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def plain(leaf, a):
    if to == "reduced":   # JAX's reduced type: lax's own collective
      y = lax.all_gather(leaf, axes, axis=a, tiled=tiled, to="reduced")
    elif to == "invarying":
      y = compat.all_gather_invariant(leaf, axes, axis=a, tiled=tiled)
    else:
      y = lax.all_gather(leaf, axes, axis=a, tiled=tiled)
    return y, (buckets.lax_stats("all_gather", leaf) if stats else None)

  def one(leaf):
    if buckets.takes_lax(fn, leaf, axes) or to == "reduced":
      return plain(leaf, axis)
    leaf = options.check_x(fn, leaf)
    if tiled and leaf.ndim == 0:
      raise ValueError(f"{fn}: tiled=True needs x with at least one dimension, got a scalar")
    a = options.check_dim(fn, "axis", axis, leaf.ndim + (0 if tiled else 1))
    if opts.codec is None:
      return plain(leaf, a)
    cfg = impl.Cfg(axes, n_peers, opts, stats, fn, dim=a, tiled=tiled, to=to)
    return autodiff.ag(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if buckets.takes_lax(fn, leaf, axes) or opts.codec is None or to == "reduced":
      return None
    leaf = options.check_x(fn, leaf)
    if leaf.size == 0 or (tiled and leaf.ndim == 0):
      return None
    a = options.check_dim(fn, "axis", axis, leaf.ndim + (0 if tiled else 1))
    shape = leaf.shape
    return buckets.Item(compat.pvary(leaf, axes).reshape(-1),
                 lambda g: impl.ag_assemble(g, shape, a, tiled, n_peers))

  def run(rows):
    return autodiff.bag(rows, impl.Cfg(axes, n_peers, opts, stats, fn, to=to))

  def segmented(rows):
    return segments.run("all_gather", rows, impl.Cfg(axes, n_peers, opts, stats, fn, to=to), autodiff.sag)

  return buckets.map_leaves(one, x, stats, (item, run, limit, segmented))


@_with_options_doc
def compressed_psum_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = False,
                            codec: str | None = "auto",                             policy: str = "auto", stats: bool = False,
                            check_decode: bool | None = None,
                            chunks: int | str | None = None, bucket_bytes: int | None = None):
  """`jax.lax.psum_scatter` over compressed per-destination chunks.

  Each device encodes the N chunks of x along `scatter_dimension` as N rows in one
  call, the rows go over one all_to_all, and each device decodes the N chunks it
  received and sums them in rank order 0..N-1 with float32 accumulation, rounding
  once to x.dtype. Deterministic; bit-identical to codec="raw" and policy="never";
  close to (not bit-equal with) lax.psum_scatter, whose order XLA picks.

  Args:
    x: array (or pytree), inside `jax.shard_map`; bf16/fp16/fp32 leaves are
      compressed, other leaves take the plain lax collective.
    axis_name: mesh axis name or tuple of names.
    scatter_dimension: the dimension split among peers (as lax).
    tiled: as lax (False: that dimension must equal the axis size and vanishes).
{options}

  Returns:
    This device's reduced chunk (pytree), and a `CollectiveStats` when stats=True.

  Raises:
    TypeError / ValueError naming the argument.
  """
  fn = "compressed_psum_scatter"
  opts, axes, n_peers = options.setup(fn, axis_name, codec, policy, stats, tiled, check_decode, chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def plain(leaf, d):
    y = lax.psum_scatter(leaf, axes, scatter_dimension=d, tiled=tiled)
    return y, (buckets.lax_stats("psum_scatter", leaf) if stats else None)

  def one(leaf):
    if buckets.takes_lax(fn, leaf, axes):
      return plain(leaf, scatter_dimension)
    leaf, d = options.check_split_x(fn, leaf, "scatter_dimension", scatter_dimension, n_peers,
                                    tiled, axis_name)
    if opts.codec is None:
      return plain(leaf, d)
    cfg = impl.Cfg(axes, n_peers, opts, stats, fn, dim=d, tiled=tiled)
    return autodiff.rs(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if buckets.takes_lax(fn, leaf, axes) or opts.codec is None:
      return None
    leaf, d = options.check_split_x(fn, leaf, "scatter_dimension", scatter_dimension, n_peers,
                                    tiled, axis_name)
    if leaf.size == 0:
      return None
    rows, chunk = impl.rows_for_peers(compat.pvary(leaf, axes), d, tiled, n_peers)
    return buckets.Item(rows, lambda r: r.reshape(chunk))

  def run(rows):    # [N, m] each: row j for peer j, as impl.rows_for_peers(x, 0, False) sees it
    return autodiff.brs(rows, impl.Cfg(axes, n_peers, opts, stats, fn))

  def segmented(rows):
    return segments.run("psum_scatter", rows, impl.Cfg(axes, n_peers, opts, stats, fn), autodiff.srs)

  return buckets.map_leaves(one, x, stats, (item, run, limit, segmented))


@_with_options_doc
def compressed_psum(x, axis_name, *, codec: str | None = "auto", policy: str = "auto",
                    stats: bool = False, check_decode: bool | None = None,
                    chunks: int | str | None = None, bucket_bytes: int | None = None):
  """`jax.lax.psum` as compressed reduce-scatter + compressed all-gather.

  x is flattened and split into N equal rows (zero-padded); the reduce-scatter
  sums row i of every peer on peer i in rank order with float32 accumulation and
  rounds once; the all-gather shares the reduced rows losslessly, so every peer
  returns the same bits. Deterministic run to run and identical to codec="raw".

  Args:
    x: array (or pytree, e.g. gradients and a step counter), inside
      `jax.shard_map`; bf16/fp16/fp32 leaves are compressed, other leaves (and
      Python scalars: `compressed_psum(1, axis)` is the axis size) take lax.psum.
    axis_name: mesh axis name or tuple of names.
{options}

  Returns:
    The sum (pytree), typed invariant over axis_name like lax.psum, and a
    `CollectiveStats` (both phases together) when stats=True.

  Raises:
    TypeError / ValueError naming the argument.
  """
  fn = "compressed_psum"
  opts, axes, n_peers = options.setup(fn, axis_name, codec, policy, stats, False, check_decode, chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def one(leaf):
    plain = buckets.takes_lax(fn, leaf, axes) or buckets.invariant_over(fn, leaf, axes)
    if plain or opts.codec is None:
      leaf = leaf if plain else options.check_x(fn, leaf)
      return lax.psum(leaf, axes), (buckets.lax_stats("psum", leaf) if stats else None)
    leaf = options.check_x(fn, leaf)
    cfg = impl.Cfg(axes, n_peers, opts, stats, fn)
    return autodiff.psum(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if buckets.invariant_over(fn, leaf, axes):
      return None
    return buckets.flat_item(fn, leaf, opts, axes)

  def run(rows):
    return autodiff.bpsum(rows, impl.Cfg(axes, n_peers, opts, stats, fn))

  def segmented(rows):
    return segments.run("psum", rows, impl.Cfg(axes, n_peers, opts, stats, fn), autodiff.spsum)

  return buckets.map_leaves(one, x, stats, (item, run, limit, segmented))


@_with_options_doc
def compressed_all_to_all(x, axis_name, split_axis: int, concat_axis: int, *,
                          tiled: bool = False, codec: str | None = "auto", policy: str = "auto",
                          stats: bool = False, check_decode: bool | None = None,
                          chunks: int | str | None = None, bucket_bytes: int | None = None):
  """`jax.lax.all_to_all` with compressed per-destination chunks; bit-identical.

  Args:
    x: array (or pytree), inside `jax.shard_map`; bf16/fp16/fp32 leaves are
      compressed, other leaves take the plain lax collective.
    axis_name: mesh axis name or tuple of names.
    split_axis: dimension of x split among peers (as lax).
    concat_axis: dimension of the result that collects the peers' chunks (as lax).
    tiled: as lax.
{options}

  Returns:
    The exchanged array (pytree), and a `CollectiveStats` when stats=True.

  Raises:
    TypeError / ValueError naming the argument.
  """
  fn = "compressed_all_to_all"
  opts, axes, n_peers = options.setup(fn, axis_name, codec, policy, stats, tiled, check_decode, chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def plain(leaf, s, c):
    y = lax.all_to_all(leaf, axes, s, c, tiled=tiled)
    return y, (buckets.lax_stats("all_to_all", leaf) if stats else None)

  def one(leaf):
    if buckets.takes_lax(fn, leaf, axes):
      return plain(leaf, split_axis, concat_axis)
    leaf, s, c = options.check_split_x(fn, leaf, "split_axis", split_axis, n_peers, tiled,
                                       axis_name, also=(("concat_axis", concat_axis),))
    if opts.codec is None:
      return plain(leaf, s, c)
    cfg = impl.Cfg(axes, n_peers, opts, stats, fn, dim=s, dim2=c, tiled=tiled)
    return autodiff.a2a(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if buckets.takes_lax(fn, leaf, axes) or opts.codec is None:
      return None
    leaf, s, c = options.check_split_x(fn, leaf, "split_axis", split_axis, n_peers, tiled,
                                       axis_name, also=(("concat_axis", concat_axis),))
    if leaf.size == 0:
      return None
    rows, chunk = impl.rows_for_peers(compat.pvary(leaf, axes), s, tiled, n_peers)
    return buckets.Item(rows, lambda r: impl.a2a_assemble(r, chunk, c, tiled, n_peers))

  def run(rows):    # [N, m] each in and out: row i from peer i
    return autodiff.ba2a(rows, impl.Cfg(axes, n_peers, opts, stats, fn))

  def segmented(rows):
    return segments.run("all_to_all", rows, impl.Cfg(axes, n_peers, opts, stats, fn), autodiff.sa2a)

  return buckets.map_leaves(one, x, stats, (item, run, limit, segmented))


@_with_options_doc
def compressed_ppermute(x, axis_name, perm, *, codec: str | None = "auto", policy: str = "auto",
                        stats: bool = False, check_decode: bool | None = None,
                        chunks: int | str | None = None, bucket_bytes: int | None = None):
  """`jax.lax.ppermute` with a compressed payload; bit-identical (zeros where
  no one sends, as lax).

  Args:
    x: array (or pytree), inside `jax.shard_map`; bf16/fp16/fp32 leaves are
      compressed, other leaves take the plain lax collective.
    axis_name: mesh axis name or tuple of names.
    perm: (source, destination) pairs of indices along axis_name; no source and
      no destination may repeat.
{options}

  Returns:
    The permuted array (pytree), and a `CollectiveStats` when stats=True.

  Raises:
    TypeError / ValueError naming the argument.
  """
  fn = "compressed_ppermute"
  opts, axes, n_peers = options.setup(fn, axis_name, codec, policy, stats, False, check_decode, chunks)
  perm = options.check_perm(fn, perm, n_peers)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def one(leaf):
    plain = buckets.takes_lax(fn, leaf, axes)
    if plain or opts.codec is None:
      leaf = leaf if plain else options.check_x(fn, leaf)
      return lax.ppermute(leaf, axes, perm), (buckets.lax_stats("ppermute", leaf) if stats else None)
    leaf = options.check_x(fn, leaf)
    cfg = impl.Cfg(axes, n_peers, opts, stats, fn, perm=perm)
    return autodiff.pp(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    return buckets.flat_item(fn, leaf, opts, axes)

  def run(rows):
    return autodiff.bpp(rows, impl.Cfg(axes, n_peers, opts, stats, fn, perm=perm))

  return buckets.map_leaves(one, x, stats, (item, run, limit))


def compressed_pcast(x, axis_name, *, to: str = "varying", codec: str | None = "auto",
                     policy: str = "auto", check_decode: bool | None = None,
                     chunks: int | str | None = None, bucket_bytes: int | None = None):
  """`jax.lax.pcast(x, axis_name, to="varying")` whose transpose is `compressed_psum`.

  The data-parallel pattern: parameters replicated over "dp" are cast to varying
  before the gradient, so that `jax.grad` sums their gradients over "dp" with the
  compressed psum (bucketed, exact, identical to codec="raw") instead of the
  uncompressed psum JAX inserts for lax.pcast:

      grads = jax.grad(loss)(zc.compressed_pcast(params, "dp"), batch)   # summed over "dp"

  The forward moves nothing (a type cast, like lax.pcast). Forward-mode tangents
  are cast the same way.

  Args:
    x: array or pytree, typed invariant over axis_name, inside `jax.shard_map`.
    axis_name: mesh axis name or tuple of names.
    to: "varying"; any other target, and x typed reduced over the axis, go to
      lax.pcast unchanged.
    codec, policy, check_decode, chunks, bucket_bytes: of the gradient's
      compressed_psum (see compressed_psum).

  Raises:
    NameError outside a mesh with that axis; TypeError / ValueError naming the argument.
  """
  fn = "compressed_pcast"
  named = frozenset(axis_name) if isinstance(axis_name, (tuple, list)) else {axis_name}
  if to != "varying" or any(compat.reduced_axes(leaf) & named for leaf in jax.tree.leaves(x)):
    # other casts, and JAX's reduced values (whose cast to varying is its own): lax's
    return lax.pcast(x, axis_name, to=to)
  options.setup(fn, axis_name, codec, policy, False, False, check_decode, chunks)
  options.check_bucket_bytes(fn, bucket_bytes)
  kw = (("codec", codec), ("policy", policy), ("check_decode", check_decode),
        ("chunks", chunks), ("bucket_bytes", bucket_bytes))
  axes = tuple(axis_name) if isinstance(axis_name, list) else axis_name
  return _pcast(x, _PcastCfg(axes, kw))[0]


class _PcastCfg(NamedTuple):
  """compressed_pcast's static configuration (autodiff.with_vjp's cfg)."""
  axis_name: Any
  kw: tuple          # the gradient's compressed_psum options, as (name, value) pairs
  stats: bool = False


def _pcast_fwd(x, cfg: _PcastCfg):
  return jax.tree_util.tree_map(lambda v: lax.pcast(v, cfg.axis_name, to="varying"), x), None


def _pcast_bwd(cfg: _PcastCfg, ct):
  # float0 cotangents (integer leaves) have nothing to sum
  leaves, treedef = jax.tree_util.tree_flatten(ct)
  real = [i for i, c in enumerate(leaves) if getattr(c, "dtype", None) != jax.dtypes.float0]
  summed = compressed_psum([leaves[i] for i in real], cfg.axis_name, **dict(cfg.kw))
  for i, v in zip(real, summed):
    leaves[i] = v
  return jax.tree_util.tree_unflatten(treedef, leaves)


# differentiable in both modes: forward, the cast of the tangent; reverse, the
# compressed psum of the cotangent
_pcast = autodiff.with_vjp(_pcast_fwd, _pcast_bwd)
