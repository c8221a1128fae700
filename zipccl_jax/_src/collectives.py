"""Compressed collectives for `jax.shard_map`: drop-in twins of the `jax.lax` ones.

    compressed_all_gather   compressed_psum_scatter   compressed_psum
    compressed_all_to_all   compressed_ppermute

This module holds the implementations (rows in, rows out, via transport.py), their
custom VJPs and the public wrappers; options.py validates and plans, stats.py
holds `CollectiveStats`, hlo.py measures the wire in compiled HLO.

Exactness (docs/design.md):
  * all_gather, all_to_all, ppermute return the input's bits for every input:
    lax's result, except that lax on XLA:CPU canonicalises bf16 NaN payloads
    and these keep them.
  * Leaves that are not bf16/fp16/fp32 (ints, bool, fp8, Python scalars) take
    the plain lax collective (`_takes_lax`).
  * psum_scatter / psum sum the exactly-transported chunks in rank order
    (0, 1, ..., N-1 of the linearised axis_name) in float32, rounding once to the
    input dtype: deterministic, identical for codec="zipccl" and codec="raw".
  * Every call moves the slot of the ladder that holds the largest used size of
    all participants (transport.py); a row that does not compress goes on the
    raw rung (same-width uint16/uint32 bitcasts: XLA:CPU would widen a bf16
    collective to f32 on the wire). The rung index is agreed by one 4-byte pmax,
    so it is identical on every participant.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import options
from zipccl_jax._src import stats as stats_lib
from zipccl_jax._src import transport


# ---- the collectives: implementations ------------------------------------------------------


class _Cfg(NamedTuple):
  """Static configuration of one collective call (custom_vjp nondiff argument)."""
  axes: tuple
  n_peers: int
  opts: options.Opts
  stats: bool
  fn: str
  dim: int = 0          # all_gather axis / psum_scatter scatter_dimension / a2a split_axis
  dim2: int = 0         # a2a concat_axis
  tiled: bool = False
  to: str = "varying"   # all_gather
  perm: tuple = ()      # ppermute


def _resolved(cfg: _Cfg, collective: str, dtype, m: int) -> _Cfg:
  """cfg with codec="auto" resolved for this call's rows (m elements of dtype), so
  that its transports and its stats use and name one codec (options.auto_codec)."""
  return cfg._replace(opts=options.resolve_codec(cfg.opts, dtype, m, collective=collective,
                                                 n_peers=cfg.n_peers))


def _plan(cfg: _Cfg, collective: str, dtype, m: int, all_to_all: bool = False) -> options.Plan:
  return options.plan(cfg.fn, dtype, m, cfg.opts, collective=collective, n_peers=cfg.n_peers,
                      all_to_all=all_to_all)


def _ag_assemble(g, shape, a, tiled, n_peers):
  """The gathered rows g[N, n] of a leaf of `shape` -> lax.all_gather's result."""
  y = jnp.moveaxis(g.reshape((n_peers,) + shape), 0, a)
  if tiled:
    y = y.reshape(shape[:a] + (n_peers * shape[a],) + shape[a + 1:])
  return y


def _empty(x, shape, cfg: _Cfg, name: str, varying: bool = True):
  """The result of a collective on an empty leaf: nothing to move, no collective.

  Why not the transport: jax >= 0.11 rejects an all-gather of a zero-sized
  dimension in its verifier, and jaxlib 0.11.2's Shardy canonicalizer
  (ManualComputationUnusedInputsPattern) crashed the process on our raw transport of
  an empty row (tests/test_collectives.py's empty leaf, Python 3.12). The result is
  typed varying over the axes like lax's, but for psum's (invariant).
  """
  cfg = _resolved(cfg, name, x.dtype, 0)
  y = jnp.zeros(shape, x.dtype)
  if varying:
    y = compat.pvary(y, cfg.axes)
  return y, (stats_lib.make_stats(name, cfg.opts.codec, [stats_lib.plain_part(0)])
             if cfg.stats else None)


def _ag_impl(x, cfg: _Cfg):
  n = x.size
  if n == 0:
    shape = _ag_assemble(jnp.zeros((cfg.n_peers, 0), x.dtype), x.shape, cfg.dim, cfg.tiled,
                         cfg.n_peers).shape
    return _empty(x, shape, cfg, "all_gather", varying=cfg.to == "varying")
  cfg = _resolved(cfg, "all_gather", x.dtype, n)
  plan = _plan(cfg, "all_gather", x.dtype, n)
  g, parts = transport.gather_rows(x.reshape(n), cfg.axes, cfg.n_peers, plan, cfg.stats,
                                   cfg.opts.check_decode)
  y = _ag_assemble(g, x.shape, cfg.dim, cfg.tiled, cfg.n_peers)
  if cfg.to == "varying":
    y = compat.pvary(y, cfg.axes)
  return y, (stats_lib.make_stats("all_gather", cfg.opts.codec, parts) if cfg.stats else None)


def _chunk_shape(shape, dim, tiled, n_peers):
  """The shape of the chunk of a leaf of `shape` that goes to one peer."""
  if tiled:
    return shape[:dim] + (shape[dim] // n_peers,) + shape[dim + 1:]
  return shape[:dim] + shape[dim + 1:]


def _rows_for_peers(x, dim, tiled, n_peers):
  """x -> (rows[N, m], chunk shape): row j is the chunk along `dim` for peer j."""
  shape = x.shape
  chunk = _chunk_shape(shape, dim, tiled, n_peers)
  if tiled:
    x = x.reshape(shape[:dim] + (n_peers, chunk[dim]) + shape[dim + 1:])
  rows = jnp.moveaxis(x, dim, 0).reshape(n_peers, int(np.prod(chunk, dtype=np.int64)))
  return rows, chunk


def _rs_impl(x, cfg: _Cfg):
  if x.size == 0:
    return _empty(x, _chunk_shape(x.shape, cfg.dim, cfg.tiled, cfg.n_peers), cfg,
                  "psum_scatter")
  rows, chunk = _rows_for_peers(x, cfg.dim, cfg.tiled, cfg.n_peers)
  cfg = _resolved(cfg, "psum_scatter", x.dtype, rows.shape[1])
  plan = _plan(cfg, "psum_scatter", x.dtype, rows.shape[1], all_to_all=True)
  recv, parts = transport.a2a_rows(rows, cfg.axes, plan, cfg.stats, cfg.opts.check_decode)
  y = transport.ordered_sum(recv, x.dtype).reshape(chunk)
  return y, (stats_lib.make_stats("psum_scatter", cfg.opts.codec, parts) if cfg.stats else None)


def _psum_impl(x, cfg: _Cfg):
  n = x.size
  if n == 0:
    return _empty(x, x.shape, cfg, "psum", varying=False)
  n_peers = cfg.n_peers
  m = -(-n // n_peers)
  flat = x.reshape(n)
  if n_peers * m != n:
    flat = jnp.pad(flat, (0, n_peers * m - n))
  check = cfg.opts.check_decode
  cfg = _resolved(cfg, "psum", x.dtype, m)
  plan = _plan(cfg, "psum", x.dtype, m, all_to_all=True)
  recv, p1 = transport.a2a_rows(flat.reshape(n_peers, m), cfg.axes, plan, cfg.stats, check)
  mine = transport.ordered_sum(recv, x.dtype)
  g, p2 = transport.gather_rows(mine, cfg.axes, n_peers, _plan(cfg, "psum", x.dtype, m),
                                cfg.stats, check)
  y = g.reshape(n_peers * m)[:n].reshape(x.shape)
  return y, (stats_lib.make_stats("psum", cfg.opts.codec, p1 + p2) if cfg.stats else None)


def _a2a_impl(x, cfg: _Cfg):
  n_peers = cfg.n_peers
  if x.size == 0:
    chunk = _chunk_shape(x.shape, cfg.dim, cfg.tiled, n_peers)
    shape = _a2a_assemble(jnp.zeros((n_peers,) + chunk, x.dtype), chunk, cfg.dim2, cfg.tiled,
                          n_peers).shape
    return _empty(x, shape, cfg, "all_to_all")
  rows, chunk = _rows_for_peers(x, cfg.dim, cfg.tiled, n_peers)
  cfg = _resolved(cfg, "all_to_all", x.dtype, rows.shape[1])
  plan = _plan(cfg, "all_to_all", x.dtype, rows.shape[1], all_to_all=True)
  recv, parts = transport.a2a_rows(rows, cfg.axes, plan, cfg.stats, cfg.opts.check_decode)
  y = _a2a_assemble(recv, chunk, cfg.dim2, cfg.tiled, n_peers)
  return y, (stats_lib.make_stats("all_to_all", cfg.opts.codec, parts) if cfg.stats else None)


def _a2a_assemble(recv, chunk, c, tiled, n_peers):
  """The received rows recv[N, m] (row i from peer i) -> lax.all_to_all's result."""
  y = jnp.moveaxis(recv.reshape((n_peers,) + chunk), 0, c)
  if tiled:
    y = y.reshape(chunk[:c] + (n_peers * chunk[c],) + chunk[c + 1:])
  return y


def _pp_impl(x, cfg: _Cfg):
  n = x.size
  if n == 0:
    return _empty(x, x.shape, cfg, "ppermute")
  cfg = _resolved(cfg, "ppermute", x.dtype, n)
  plan = _plan(cfg, "ppermute", x.dtype, n)
  y, parts = transport.permute_row(x.reshape(n), cfg.axes, cfg.perm, cfg.n_peers, plan,
                                   cfg.stats, cfg.opts.check_decode)
  st = stats_lib.make_stats("ppermute", cfg.opts.codec, parts) if cfg.stats else None
  return y.reshape(x.shape), st


# ---- custom VJPs -------------------------------------------------------------------------
# The transpose of each collective is another compressed collective with the same
# options (no stats): all_gather <-> psum_scatter, all_to_all with its axes swapped,
# ppermute with the inverted permutation, psum as JAX's shard_map rule.


def _float0_zeros(a):
  """The tangent of an integer/bool output (the stats): float0 zeros, as JAX wants."""
  return np.zeros(np.shape(a), jax.dtypes.float0)


def _with_vjp(impl, bwd):
  """impl(x, cfg) -> (y, stats) made differentiable in both modes.

  Reverse mode (jax.grad, jax.vjp): a custom_vjp whose backward pass `bwd` is the
  transposed *compressed* collective. Forward mode (jax.jvp, jax.jacfwd): JAX
  cannot run a custom_vjp forward, so a custom_jvp wraps it. Each collective is
  linear in x, so its tangent is the same collective applied to the tangent. In
  reverse mode JAX linearizes that custom_jvp rule and transposes the tangent
  map, which a custom_vjp call cannot be; there the rule differentiates the
  custom_vjp instead, which JAX records as a linear op with our `bwd` as its
  transpose. `compat.tangent_mode` tells the modes apart; where the rule is traced
  into the JVP jaxpr of an inner jit, jax.checkpoint or lax.scan, JAX may later run
  that jaxpr forward or transpose it, and the tangent is a `linear_call` (forward:
  `impl`; transpose: `bwd`; `compat` gives it a batching rule). The custom_vjp's
  forward calls the custom_jvp function, so a jvp of a grad (Hessian-vector
  products) is forward mode through `bwd`'s collectives: it works too.
  """
  vjp_fn = jax.custom_vjp(impl, nondiff_argnums=(1,))
  f = jax.custom_jvp(vjp_fn, nondiff_argnums=(1,))
  vjp_fn.defvjp(lambda x, cfg: (f(x, cfg), None), lambda cfg, _, ct: (bwd(cfg, ct[0]),))

  @f.defjvp
  def _jvp(cfg, primals, tangents):
    (x,), (t,) = primals, tangents
    mode = compat.tangent_mode(jax.tree_util.tree_leaves(t)[0])
    if mode == "reverse":
      return jax.jvp(lambda u: vjp_fn(u, cfg), (x,), (t,))
    y, st = vjp_fn(x, cfg)
    lin = cfg._replace(stats=False)
    if mode == "either":
      # The rule is traced into a JVP jaxpr (of a jit, checkpoint or scan) that JAX
      # may run forward (jax.jvp) or split and transpose (jax.grad): a linear_call
      # runs `impl` forward and transposes to `bwd`.
      ty = compat.linear_call(lambda _, u: impl(u, lin)[0], lambda _, ct: bwd(lin, ct), (), t)
    else:
      ty, _ = vjp_fn(t, lin)
    return (y, st), (ty, jax.tree_util.tree_map(_float0_zeros, st))

  return f


def _ag_bwd(cfg: _Cfg, ct):
  if cfg.to == "invarying":
    # lax's rule: the cotangent is replicated, so each peer keeps its own chunk.
    me = lax.axis_index(cfg.axes)
    if cfg.tiled:
      size = ct.shape[cfg.dim] // cfg.n_peers
      return lax.dynamic_slice_in_dim(ct, me * size, size, cfg.dim)
    return lax.dynamic_index_in_dim(ct, me, cfg.dim, keepdims=False)
  rs = cfg._replace(fn="compressed_psum_scatter (grad of compressed_all_gather)", stats=False)
  return _rs(compat.pvary(ct, cfg.axes), rs)[0]


def _rs_bwd(cfg: _Cfg, ct):
  ag = cfg._replace(fn="compressed_all_gather (grad of compressed_psum_scatter)", stats=False,
                    to="varying")
  return _ag(compat.pvary(ct, cfg.axes), ag)[0]


def _psum_bwd(cfg: _Cfg, ct):
  if compat.check_vma_enabled():
    return compat.pvary(ct, cfg.axes)      # JAX: psum's cotangent is only re-typed
  return _psum(ct, cfg._replace(stats=False))[0]  # no vma: psum again


def _a2a_bwd(cfg: _Cfg, ct):
  return _a2a(compat.pvary(ct, cfg.axes),
              cfg._replace(dim=cfg.dim2, dim2=cfg.dim, stats=False))[0]


def _pp_bwd(cfg: _Cfg, ct):
  inv = tuple((d, s) for s, d in cfg.perm)
  return _pp(compat.pvary(ct, cfg.axes), cfg._replace(perm=inv, stats=False))[0]


_ag = _with_vjp(_ag_impl, _ag_bwd)
_rs = _with_vjp(_rs_impl, _rs_bwd)
_psum = _with_vjp(_psum_impl, _psum_bwd)
_a2a = _with_vjp(_a2a_impl, _a2a_bwd)
_pp = _with_vjp(_pp_impl, _pp_bwd)


# Bucketed twins: x is a tuple of rows (of one dtype) packed along their last axis
# into one row (set) for the collective and unpacked after it, in the unsigned
# word domain (XLA:CPU may compute a bf16 concatenate in f32, which would
# canonicalise NaN payloads). Packing is inside the custom VJP, so gradients flow
# (a bitcast has none) and are themselves bucketed collectives. cfg is the neutral
# one of each bucket: rows [M] (gather, psum, permute) or [N, M] (one per peer).


def _pack(xs):
  return transport.unbits(jnp.concatenate([transport.bits(v) for v in xs], axis=-1),
                          xs[0].dtype)


def _unpack(y, xs):
  """Cuts y along its last axis into pieces as wide as the rows of xs."""
  u, out, off = transport.bits(y), [], 0
  for v in xs:
    m = v.shape[-1]
    out.append(transport.unbits(u[..., off:off + m], y.dtype))
    off += m
  return tuple(out)


def _bucketed(impl):
  return lambda xs, cfg: (_unpack(impl(_pack(xs), cfg)[0], xs), None)


def _pvary_all(cts, cfg):
  return tuple(compat.pvary(c, cfg.axes) for c in cts)


def _bag_bwd(cfg: _Cfg, cts):
  if cfg.to == "invarying":
    me = lax.axis_index(cfg.axes)
    return tuple(lax.dynamic_index_in_dim(c, me, 0, keepdims=False) for c in cts)
  return _brs(_pvary_all(cts, cfg), cfg._replace(stats=False))[0]


def _brs_bwd(cfg: _Cfg, cts):
  return _bag(_pvary_all(cts, cfg), cfg._replace(stats=False, to="varying"))[0]


def _bpsum_bwd(cfg: _Cfg, cts):
  if compat.check_vma_enabled():
    return _pvary_all(cts, cfg)
  return _bpsum(cts, cfg._replace(stats=False))[0]


def _ba2a_bwd(cfg: _Cfg, cts):
  return _ba2a(_pvary_all(cts, cfg), cfg._replace(stats=False))[0]


def _bpp_bwd(cfg: _Cfg, cts):
  inv = tuple((d, s) for s, d in cfg.perm)
  return _bpp(_pvary_all(cts, cfg), cfg._replace(perm=inv, stats=False))[0]


_bag = _with_vjp(_bucketed(_ag_impl), _bag_bwd)
_brs = _with_vjp(_bucketed(_rs_impl), _brs_bwd)
_bpsum = _with_vjp(_bucketed(_psum_impl), _bpsum_bwd)
_ba2a = _with_vjp(_bucketed(_a2a_impl), _ba2a_bwd)
_bpp = _with_vjp(_bucketed(_pp_impl), _bpp_bwd)


# ---- buckets: many small leaves, one transport ---------------------------------------------
# A pytree of many small leaves (a model's gradients: biases, norms, small
# matrices) would pay per leaf a row header, the ladder's slack, an agreement and
# a collective's latency, and each leaf's transport compiles its own ladder.
# Leaves of one dtype are packed into buckets of at most `bucket_bytes` (greedily,
# in leaf order) and each bucket moves as one row (set) through the same
# collective. Every collective here acts element by element on the rows (a
# gather or permute copies each element, a reduction sums each element over the
# peers in rank order), so a leaf's result is the same bits packed or alone;
# only the bytes on the wire and the number of transports change.


class _Item(NamedTuple):
  """A bucketable leaf: its rows and how to turn the bucket's rows back into it."""
  rows: jax.Array       # [m] (gather, psum, permute) or [N, m] (one row per peer)
  post: object          # rows of the result, this leaf's slice -> the leaf's result


def _flat_item(fn, leaf, opts, axes):
  """The _Item of a leaf whose rows are its flattened elements (psum, ppermute), or
  None for a leaf that is not bucketed (plain lax, codec None, empty)."""
  if _takes_lax(fn, leaf) or opts.codec is None:
    return None
  leaf = options.check_x(fn, leaf)
  if leaf.size == 0:
    return None
  shape = leaf.shape
  return _Item(compat.pvary(leaf, axes).reshape(-1), lambda r: r.reshape(shape))


def _bucket_groups(items, limit: int) -> list:
  """Indices of the buckets: leaves of one dtype, in leaf order, greedily filled up
  to `limit` raw bytes; a leaf of `limit` bytes or more travels alone."""
  groups, open_ = [], {}
  for i, it in items:
    nbytes = it.rows.size * it.rows.dtype.itemsize
    key = np.dtype(it.rows.dtype).name
    if nbytes >= limit:
      groups.append([i])
      continue
    cur = open_.get(key)
    if cur is None or cur[1] + nbytes > limit:
      cur = open_[key] = [[], 0]
      groups.append(cur[0])
    cur[0].append(i)
    cur[1] += nbytes
  return groups


def _map_leaves(one, x, stats: bool, bucket=None):
  """Runs the collective on every leaf of x: `one(leaf) -> (y, stats)`.

  bucket: None, or (item, run, limit): item(leaf) -> _Item, or None for a leaf that
  is not bucketed (plain lax, empty); run(rows) runs the bucketed collective on a
  tuple of rows and returns the tuple of their results. With stats=True every
  leaf keeps its own transport (its stats are its own), so nothing is bucketed.
  """
  leaves, treedef = jax.tree_util.tree_flatten(x)
  if bucket is None or stats or len(leaves) < 2:
    outs = [one(leaf) for leaf in leaves]
    y = jax.tree_util.tree_unflatten(treedef, [o[0] for o in outs])
    if not stats:
      return y
    return y, jax.tree_util.tree_unflatten(treedef, [o[1] for o in outs])
  item, run, limit = bucket
  items = [(i, it) for i, it in ((i, item(leaf)) for i, leaf in enumerate(leaves))
           if it is not None]
  by_index = dict(items)
  ys = [None] * len(leaves)
  for group in _bucket_groups(items, limit):
    if len(group) == 1:
      continue
    its = [by_index[i] for i in group]
    for i, it, r in zip(group, its, run(tuple(it.rows for it in its))):
      ys[i] = it.post(r)
  ys = [one(leaf)[0] if y is None else y for leaf, y in zip(leaves, ys)]
  return jax.tree_util.tree_unflatten(treedef, ys)


def _lax_stats(name, x):
  """codec=None: the lax op's operand is x itself (XLA:CPU may widen bf16 further)."""
  x = jnp.asarray(x)
  return stats_lib.make_stats(name, None, [stats_lib.plain_part(x.size * x.dtype.itemsize)])


def _takes_lax(fn, leaf) -> bool:
  """True when `leaf` goes through the plain `jax.lax` collective, uncompressed.

  Whatever the options (codec=None included), every leaf no codec takes:
  Python scalars (`compressed_psum(1, axis)` is the axis size, as in lax; a
  constant moves nothing), and arrays of any dtype other than bf16/fp16/fp32
  (integers, bool, fp8, float64, complex: a step counter inside a pytree of
  gradients, say). Those get lax's result, gradient and errors exactly, so the
  compressed_* functions are drop-in replacements for every input lax takes.
  """
  if isinstance(leaf, (bool, int, float, complex)):
    return True
  dtype = getattr(leaf, "dtype", None)
  if dtype is None:
    try:
      dtype = jnp.asarray(leaf).dtype
    except TypeError as e:
      raise TypeError(f"{fn}: x must be an array (or a pytree of arrays), got "
                      f"{type(leaf).__name__} ({e})") from None
  return not dtypes.is_supported(dtype)


# ---- public API ----------------------------------------------------------------------------

_OPTIONS_DOC = """
    codec: "auto" (default): with a calibration in force (`zipccl_jax.calibrate`),
      the registered codec with the lowest modelled time for this call
      (`zipccl_jax.costmodel.fastest_codec`), else AUTO_CODEC ("entropy";
      "zipccl" for float32);
      a registered codec ("zipccl", the window codec; "entropy", per-block
      Huffman); "raw" (the same algorithm moving uncompressed uint16/uint32
      bitcasts: the exact twin, bit-identical results) or None (the plain
      `jax.lax` collective, the oracle). Every codec gives the same bits.
    escape_capacity: deprecated and ignored (DeprecationWarning): each call sizes
      its wire from the data (the slot ladder, docs/design.md).
    grad_escape_capacity: deprecated and ignored, as escape_capacity.
    policy: "always" compress; "never" (same as codec="raw"); "auto" compress
      when a row (the message for one peer) holds at least AUTO_MIN_ROW_BYTES
      (64 KiB) raw and its smallest encoding is smaller than that; with a
      calibration (`zipccl_jax.calibrate`), when the cost model says compressing
      is faster.
    stats: also return a `CollectiveStats` (per leaf of x): the rung each
      transport took, used vs slot bytes, whether the raw rung was taken, the
      codec's count, decode errors. Costs one 4-byte psum per transport and turns
      the 4-byte agreement into an 8-byte all-gather.
    check_decode: fail the call's results (a `jax.pure_callback` that the results
      depend on raises, so `block_until_ready` raises an error naming the
      collective) when a received row fails to decode, instead of only returning
      NaN rows (and counting them in stats). Costs one host callback per call. None: on when the
      environment has ZIPCCL_CHECK_DECODE=1. A decode failure means the payload
      was corrupted in transit; the codec itself never produces one.
    chunks: split each compressed row into this many chunks, each its own
      transport (encode, agreement, slot switch), so that a backend that runs
      independent ops concurrently can overlap one chunk's codec with another's
      transfer (docs/design.md, "Overlap"); same bits for every count. "auto":
      the calibrated cost model's count (`costmodel.best_chunks`), 1 without a
      calibration or where no overlap is known (XLA:CPU). None: the environment's
      ZIPCCL_CHUNKS, else "auto". An int in [1, 16]; 1 is the unchunked program.
    bucket_bytes: leaves of a pytree smaller than this (raw bytes per device) are
      packed, per dtype and in leaf order, into buckets of at most this size, and
      each bucket moves as one transport (one row header, agreement and ladder
      for many small leaves; the same bits as leaf by leaf). None: the default,
      `BUCKET_BYTES` (4 MiB); 0: every leaf alone. With stats=True every leaf
      travels alone, so that its stats are its own."""


def _with_options_doc(f):
  f.__doc__ = f.__doc__.replace("{options}", _OPTIONS_DOC.strip("\n"))
  return f


@_with_options_doc
def compressed_all_gather(x, axis_name, *, axis: int = 0, tiled: bool = False,
                          to: str = "varying", codec: str | None = "auto",
                          escape_capacity: int | None = None,
                          grad_escape_capacity: int | None = None, policy: str = "auto",
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
    to: "varying" (default, as lax) or "invarying" (replicated result type).
{options}

  Returns:
    The gathered array (pytree), and a `CollectiveStats` when stats=True.

  Raises:
    TypeError / ValueError naming the argument: bad dtype, axis, options.
  """
  fn = "compressed_all_gather"
  if to not in ("varying", "invarying"):
    raise ValueError(f"{fn}: to must be 'varying' or 'invarying', got {to!r}")
  opts, axes, n_peers = options.setup(fn, axis_name, codec, escape_capacity,
                                      grad_escape_capacity, policy, stats, tiled, check_decode,
                                      chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def plain(leaf, a):
    y = (compat.all_gather_invariant(leaf, axes, axis=a, tiled=tiled) if to == "invarying"
         else lax.all_gather(leaf, axes, axis=a, tiled=tiled))
    return y, (_lax_stats("all_gather", leaf) if stats else None)

  def one(leaf):
    if _takes_lax(fn, leaf):
      return plain(leaf, axis)
    leaf = options.check_x(fn, leaf)
    if tiled and leaf.ndim == 0:
      raise ValueError(f"{fn}: tiled=True needs x with at least one dimension, got a scalar")
    a = options.check_dim(fn, "axis", axis, leaf.ndim + (0 if tiled else 1))
    if opts.codec is None:
      return plain(leaf, a)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, dim=a, tiled=tiled, to=to)
    return _ag(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if _takes_lax(fn, leaf) or opts.codec is None:
      return None
    leaf = options.check_x(fn, leaf)
    if leaf.size == 0 or (tiled and leaf.ndim == 0):
      return None
    a = options.check_dim(fn, "axis", axis, leaf.ndim + (0 if tiled else 1))
    shape = leaf.shape
    return _Item(compat.pvary(leaf, axes).reshape(-1),
                 lambda g: _ag_assemble(g, shape, a, tiled, n_peers))

  def run(rows):
    return _bag(rows, _Cfg(axes, n_peers, opts, False, fn, to=to))[0]

  return _map_leaves(one, x, stats, (item, run, limit))


@_with_options_doc
def compressed_psum_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = False,
                            codec: str | None = "auto", escape_capacity: int | None = None,
                            grad_escape_capacity: int | None = None,
                            policy: str = "auto", stats: bool = False,
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
  opts, axes, n_peers = options.setup(fn, axis_name, codec, escape_capacity,
                                      grad_escape_capacity, policy, stats, tiled, check_decode,
                                      chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def plain(leaf, d):
    y = lax.psum_scatter(leaf, axes, scatter_dimension=d, tiled=tiled)
    return y, (_lax_stats("psum_scatter", leaf) if stats else None)

  def one(leaf):
    if _takes_lax(fn, leaf):
      return plain(leaf, scatter_dimension)
    leaf, d = options.check_split_x(fn, leaf, "scatter_dimension", scatter_dimension, n_peers,
                                    tiled, axis_name)
    if opts.codec is None:
      return plain(leaf, d)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, dim=d, tiled=tiled)
    return _rs(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if _takes_lax(fn, leaf) or opts.codec is None:
      return None
    leaf, d = options.check_split_x(fn, leaf, "scatter_dimension", scatter_dimension, n_peers,
                                    tiled, axis_name)
    if leaf.size == 0:
      return None
    rows, chunk = _rows_for_peers(compat.pvary(leaf, axes), d, tiled, n_peers)
    return _Item(rows, lambda r: r.reshape(chunk))

  def run(rows):    # [N, m] each: row j for peer j, as _rows_for_peers(x, 0, False) sees it
    return _brs(rows, _Cfg(axes, n_peers, opts, False, fn))[0]

  return _map_leaves(one, x, stats, (item, run, limit))


@_with_options_doc
def compressed_psum(x, axis_name, *, codec: str | None = "auto",
                    escape_capacity: int | None = None,
                    grad_escape_capacity: int | None = None, policy: str = "auto",
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
  opts, axes, n_peers = options.setup(fn, axis_name, codec, escape_capacity,
                                      grad_escape_capacity, policy, stats, False, check_decode,
                                      chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def one(leaf):
    plain = _takes_lax(fn, leaf)
    if plain or opts.codec is None:
      leaf = leaf if plain else options.check_x(fn, leaf)
      return lax.psum(leaf, axes), (_lax_stats("psum", leaf) if stats else None)
    leaf = options.check_x(fn, leaf)
    cfg = _Cfg(axes, n_peers, opts, stats, fn)
    return _psum(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    return _flat_item(fn, leaf, opts, axes)

  def run(rows):
    return _bpsum(rows, _Cfg(axes, n_peers, opts, False, fn))[0]

  return _map_leaves(one, x, stats, (item, run, limit))


@_with_options_doc
def compressed_all_to_all(x, axis_name, split_axis: int, concat_axis: int, *,
                          tiled: bool = False, codec: str | None = "auto",
                          escape_capacity: int | None = None,
                          grad_escape_capacity: int | None = None, policy: str = "auto",
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
  opts, axes, n_peers = options.setup(fn, axis_name, codec, escape_capacity,
                                      grad_escape_capacity, policy, stats, tiled, check_decode,
                                      chunks)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def plain(leaf, s, c):
    y = lax.all_to_all(leaf, axes, s, c, tiled=tiled)
    return y, (_lax_stats("all_to_all", leaf) if stats else None)

  def one(leaf):
    if _takes_lax(fn, leaf):
      return plain(leaf, split_axis, concat_axis)
    leaf, s, c = options.check_split_x(fn, leaf, "split_axis", split_axis, n_peers, tiled,
                                       axis_name, also=(("concat_axis", concat_axis),))
    if opts.codec is None:
      return plain(leaf, s, c)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, dim=s, dim2=c, tiled=tiled)
    return _a2a(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    if _takes_lax(fn, leaf) or opts.codec is None:
      return None
    leaf, s, c = options.check_split_x(fn, leaf, "split_axis", split_axis, n_peers, tiled,
                                       axis_name, also=(("concat_axis", concat_axis),))
    if leaf.size == 0:
      return None
    rows, chunk = _rows_for_peers(compat.pvary(leaf, axes), s, tiled, n_peers)
    return _Item(rows, lambda r: _a2a_assemble(r, chunk, c, tiled, n_peers))

  def run(rows):    # [N, m] each in and out: row i from peer i
    return _ba2a(rows, _Cfg(axes, n_peers, opts, False, fn))[0]

  return _map_leaves(one, x, stats, (item, run, limit))


@_with_options_doc
def compressed_ppermute(x, axis_name, perm, *, codec: str | None = "auto",
                        escape_capacity: int | None = None,
                        grad_escape_capacity: int | None = None, policy: str = "auto",
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
  opts, axes, n_peers = options.setup(fn, axis_name, codec, escape_capacity,
                                      grad_escape_capacity, policy, stats, False, check_decode,
                                      chunks)
  perm = options.check_perm(fn, perm, n_peers)
  limit = options.check_bucket_bytes(fn, bucket_bytes)

  def one(leaf):
    plain = _takes_lax(fn, leaf)
    if plain or opts.codec is None:
      leaf = leaf if plain else options.check_x(fn, leaf)
      return lax.ppermute(leaf, axes, perm), (_lax_stats("ppermute", leaf) if stats else None)
    leaf = options.check_x(fn, leaf)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, perm=perm)
    return _pp(compat.pvary(leaf, axes), cfg)

  def item(leaf):
    return _flat_item(fn, leaf, opts, axes)

  def run(rows):
    return _bpp(rows, _Cfg(axes, n_peers, opts, False, fn, perm=perm))[0]

  return _map_leaves(one, x, stats, (item, run, limit))
