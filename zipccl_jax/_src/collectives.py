"""Compressed collectives for `jax.shard_map`: drop-in twins of the `jax.lax` ones.

    compressed_all_gather   compressed_psum_scatter   compressed_psum
    compressed_all_to_all   compressed_ppermute

Every collective moves *rows*: a tensor flattened to `m` elements, one row per
destination (all_to_all, reduce-scatter) or one row per source (all_gather,
ppermute). One `encode_rows` call writes all rows of a device straight into the
`uint8[rows, encoded_nbytes(m)]` array the XLA collective sends (no split or
concatenate copies of the payload), and one `decode_rows` call decodes what
arrived. The row size is static (docs/format.md), so the bytes XLA moves are the
encoded size: ~1.41x fewer than bf16 for Gaussian data.

Exactness (docs/design.md):
  * all_gather, all_to_all, ppermute return the lax op's bits for every input.
  * psum_scatter / psum sum the exactly-transported chunks in rank order
    (0, 1, ..., N-1 of the linearised axis_name) in float32, rounding once to the
    input dtype: deterministic, identical for codec="zipccl" and codec="raw".
  * A row that does not fit its escape capacity is never decoded: all
    participants agree (all_gather from the gathered headers; the others with one
    4-byte pmax) and the call takes the uncompressed path inside a `lax.cond`
    whose predicate is identical on every participant.

The uncompressed path moves same-width unsigned bitcasts (uint16/uint32): XLA:CPU
would widen a bf16 collective to f32 on the wire (../shared/jax-notes.md, trap 3).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import codec as _codec
from zipccl_jax._src import compat

POLICIES = ("always", "never", "auto")
COLLECTIVE_CODECS = ("zipccl", "raw", None)

# policy="auto" compresses a collective when each row (the message for one peer)
# holds at least this many raw bytes. Below it the fixed per-row overhead (128-byte
# header, 128-byte aligned sections) eats the gain: the static ratio of a bf16 row
# is 1.33 at 8 KiB, 1.39 at 32 KiB and 1.40 at 64 KiB (1.11 fp16, 1.16 fp32), and
# small messages are latency-bound anyway (the paper's switcher keeps them native).
# A calibrated cost model replaces this later.
AUTO_MIN_ROW_BYTES = 64 * 1024

# Header fields read from gathered rows (docs/format.md, "Header").
_HDR_STATUS = 7        # u8: 0 = OK, 1 = DOES_NOT_FIT
_HDR_USED = 16         # u64 used_nbytes
_HDR_ESCAPES = 48      # u64 escape_count; its low 32 bits are enough (count <= n < 2^31)

_UINT = {2: jnp.uint16, 4: jnp.uint32}
_UNROLL_MAX = 64       # ordered sums over more peers use a fori_loop


# ---- statistics -------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CollectiveStats:
  """What compression did in one call (returned when the call gets `stats=True`).

  The array fields are identical on every participant of the collective (typed
  invariant over `axis_name`), so they can leave shard_map with `out_specs=P()`
  when the input varies over no other axis.

  Attributes:
    fell_back: bool[], some participant's row overflowed its escape capacity and
      the call moved uncompressed data instead (the result is exact either way).
    escape_count: int32[], escaped exponents in all rows encoded for this call,
      summed over all participants (0 when not compressed).
    wire_bytes: int32[], bytes this device handed to XLA collectives on the path
      taken: the operand bytes, the same measure as `hlo_wire_bytes`.
    collective: static, "all_gather", "psum_scatter", "psum", "all_to_all" or
      "ppermute".
    codec: static, "zipccl", "raw" or None (plain lax).
    compressed: static, the compressed path was tried (codec and policy).
    raw_bytes: static, operand bytes of the uncompressed path for this device.
    elements: static, elements encoded for this call over all participants (the
      denominator of `escape_rate`).
  """
  fell_back: jax.Array
  escape_count: jax.Array
  wire_bytes: jax.Array
  collective: str = dataclasses.field(metadata=dict(static=True), default="")
  codec: Any = dataclasses.field(metadata=dict(static=True), default=None)
  compressed: bool = dataclasses.field(metadata=dict(static=True), default=False)
  raw_bytes: int = dataclasses.field(metadata=dict(static=True), default=0)
  elements: int = dataclasses.field(metadata=dict(static=True), default=0)

  @property
  def ratio(self) -> jax.Array:
    """raw_bytes / wire_bytes: > 1 is a saving, < 1 after a fallback."""
    return jnp.float32(self.raw_bytes) / jnp.maximum(self.wire_bytes, 1).astype(jnp.float32)

  @property
  def escape_rate(self) -> jax.Array:
    """Fraction of encoded elements whose exponent escaped its block window."""
    return self.escape_count.astype(jnp.float32) / np.float32(max(self.elements, 1))

  def summary(self) -> str:
    """One line for logs (eager: reads the values back to the host)."""
    return (f"{self.collective} codec={self.codec} compressed={self.compressed} "
            f"fell_back={bool(np.any(np.asarray(self.fell_back)))} "
            f"wire={int(np.max(np.asarray(self.wire_bytes)))}B raw={self.raw_bytes}B "
            f"ratio={float(np.min(np.asarray(self.ratio))):.3f} "
            f"escape_rate={float(np.max(np.asarray(self.escape_rate))):.4f}")


class _Part(NamedTuple):
  """Stats of one row transport (combined into CollectiveStats)."""
  fell_back: Any
  escapes: Any
  wire_bytes: Any
  raw_bytes: int
  elements: int
  compressed: bool


def _stats(name: str, codec, parts) -> CollectiveStats:
  fell = functools.reduce(jnp.logical_or, [jnp.asarray(p.fell_back) for p in parts])
  esc = sum(jnp.asarray(p.escapes, jnp.int32) for p in parts)
  wire = sum(jnp.asarray(p.wire_bytes, jnp.int32) for p in parts)
  return CollectiveStats(
      fell_back=fell, escape_count=esc, wire_bytes=wire, collective=name, codec=codec,
      compressed=any(p.compressed for p in parts),
      raw_bytes=sum(p.raw_bytes for p in parts), elements=sum(p.elements for p in parts))


def _plain_part(nbytes: int) -> _Part:
  return _Part(jnp.bool_(False), jnp.int32(0), jnp.int32(nbytes), nbytes, 0, False)


# ---- options and validation ----------------------------------------------------------------


class _Opts(NamedTuple):
  codec: str | None
  escape_capacity: int | None
  policy: str
  grad_escape_capacity: int | None = None   # for the collective the VJP runs

  def for_grad(self) -> "_Opts":
    """Options of the transposed collective: the gradient's own capacity if given."""
    if self.grad_escape_capacity is None:
      return self
    return self._replace(escape_capacity=self.grad_escape_capacity)


class _Plan(NamedTuple):
  """Static transport decision for rows of m elements."""
  compress: bool
  m: int
  dtype: Any
  cap: int
  nbytes: int       # the fixed slot: the bytes of each encoded row sent (when compress)


def _check_capacity(fn, name, value):
  """None (the default capacity) or a static non-negative int, as `encode` checks it."""
  return None if value is None else _codec._check_count(value, f"{fn}: {name}")


def _check_opts(fn, codec, escape_capacity, policy, stats, grad_escape_capacity=None) -> _Opts:
  if codec not in COLLECTIVE_CODECS:
    raise ValueError(f"{fn}: codec must be 'zipccl', 'raw' or None, got {codec!r}")
  if policy not in POLICIES:
    raise ValueError(f"{fn}: policy must be one of {POLICIES}, got {policy!r}")
  escape_capacity = _check_capacity(fn, "escape_capacity", escape_capacity)
  grad_escape_capacity = _check_capacity(fn, "grad_escape_capacity", grad_escape_capacity)
  if not isinstance(stats, bool):
    raise TypeError(f"{fn}: stats must be a bool, got {stats!r}")
  return _Opts(codec, escape_capacity, policy, grad_escape_capacity)


def _check_axes(fn, axis_name) -> tuple:
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  if not axes:
    raise ValueError(f"{fn}: axis_name must name at least one mesh axis, got {axis_name!r}")
  for a in axes:
    try:
      hash(a)
    except TypeError:
      raise TypeError(f"{fn}: axis_name entries must be hashable mesh axis names, "
                      f"got {a!r}") from None
  if len(set(axes)) != len(axes):
    raise ValueError(f"{fn}: axis_name has repeated axes: {axis_name!r}")
  return axes


def _axis_size(fn, axes, axis_name) -> int:
  try:
    return compat.axis_size(axes)
  except NameError as e:
    raise ValueError(
        f"{fn}: axis_name {axis_name!r} is not a bound mesh axis; call it inside "
        f"jax.shard_map over a mesh that has that axis ({e})") from None


def _setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity, policy, stats,
           tiled=False):
  """Validation shared by the five public collectives: (options, axes, peer count)."""
  opts = _check_opts(fn, codec, escape_capacity, policy, stats, grad_escape_capacity)
  axes = _check_axes(fn, axis_name)
  if not isinstance(tiled, bool):
    raise TypeError(f"{fn}: tiled must be a bool, got {tiled!r}")
  return opts, axes, _axis_size(fn, axes, axis_name)


def _check_x(fn, x):
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    x = jnp.asarray(x)
    dtype = x.dtype
  if np.dtype(dtype) not in (np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)):
    raise TypeError(f"{fn}: x must be bfloat16, float16 or float32, got {np.dtype(dtype).name}")
  return jnp.asarray(x)


def _check_dim(fn, arg, value, ndim) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{fn}: {arg} must be an int, got {value!r}")
  if not -ndim <= value < ndim:
    raise ValueError(f"{fn}: {arg}={value} is out of range for {ndim} dimension(s)")
  return int(value) % ndim


def _plan(fn, dtype, m: int, opts: _Opts) -> _Plan:
  dtype = np.dtype(dtype)
  if m >= 2**31:
    raise ValueError(f"{fn}: a row (one peer's message) must have fewer than 2^31 elements, "
                     f"got {m}")
  raw_row = m * dtype.itemsize
  cap = (_codec.default_escape_capacity(m) if opts.escape_capacity is None
         else opts.escape_capacity)
  nbytes = _codec.encoded_nbytes(dtype, m, cap)
  if opts.codec != "zipccl" or opts.policy == "never" or m == 0:
    compress = False
  elif opts.policy == "auto":
    compress = raw_row >= AUTO_MIN_ROW_BYTES and nbytes < raw_row
  else:
    compress = True
  return _Plan(compress, m, dtype, cap, nbytes)


# ---- row transports ----------------------------------------------------------------------
# Each returns (rows that arrived, _Part). Rows are decoded only when nobody overflowed.


def _bits(x):
  """Same-width unsigned view: the wire dtype of the uncompressed path."""
  return lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize])


def _unbits(u, dtype):
  return lax.bitcast_convert_type(u, dtype)


def _encode_slot(rows, plan: _Plan):
  """Encodes rows [N, m] and keeps the fixed slot: the first plan.nbytes bytes of each."""
  payload, st = _codec.encode_rows(rows)
  return payload[:, :plan.nbytes], st


def _overflows(st, plan: _Plan):
  """Rows whose used bytes exceed the slot (or that do not fit at all)."""
  return (st[:, 0] != 0) | (st[:, 2] > plan.nbytes // 128)


def _agree(overflow, escapes, axes, want_stats):
  """One tiny all-reduce that makes the fallback predicate identical everywhere.

  Without stats it is a pmax of an int32 flag (4 bytes); with stats a psum of
  (flag, escapes) (8 bytes), so stats cost no extra collective.
  """
  if want_stats:
    tot = lax.psum(jnp.stack([overflow.astype(jnp.int32), escapes.astype(jnp.int32)]), axes)
    return tot[0] > 0, tot[1], 8
  return lax.pmax(overflow.astype(jnp.int32), axes) > 0, jnp.int32(0), 4


def _a2a_rows(rows, axes, plan: _Plan, want_stats):
  """rows[j] goes to peer j; returns recv with recv[i] from peer i."""
  n_peers, m = rows.shape
  dtype = plan.dtype
  raw_bytes = n_peers * m * dtype.itemsize

  def uncompressed():
    return _unbits(lax.all_to_all(_bits(rows), axes, 0, 0, tiled=True), dtype)

  if not plan.compress:
    return uncompressed(), _plain_part(raw_bytes)
  payload, st = _encode_slot(rows, plan)                    # u8[N, nbytes], s32[N, 4]
  overflow = jnp.any(_overflows(st, plan))
  escapes = jnp.sum(jnp.minimum(st[:, 1], m))
  fell, esc_total, flag_bytes = _agree(overflow, escapes, axes, want_stats)

  def compressed():
    recv = lax.all_to_all(payload, axes, 0, 0, tiled=True)
    return _codec.decode_rows(recv, m, dtype)[0]

  out = lax.cond(fell, uncompressed, compressed)
  wire = jnp.where(fell, raw_bytes, n_peers * plan.nbytes) + flag_bytes
  return out, _Part(fell, esc_total, wire, raw_bytes, n_peers * n_peers * m, True)


def _gather_rows(row, axes, n_peers, plan: _Plan, want_stats):
  """row[m] of every peer -> [N, m], typed invariant over axes (identical everywhere).

  The overflow decision reads the status byte of every gathered header, which
  every participant holds identically: no extra collective.
  """
  m = row.shape[0]
  dtype = plan.dtype
  raw_bytes = m * dtype.itemsize

  def uncompressed():
    return _unbits(compat.all_gather_invariant(_bits(row), axes), dtype)

  if not plan.compress:
    return uncompressed(), _plain_part(raw_bytes)
  payload, _ = _encode_slot(row[None], plan)                 # u8[1, nbytes]
  gathered = compat.all_gather_invariant(payload[0], axes)   # u8[N, nbytes]
  used_lo = lax.bitcast_convert_type(gathered[:, _HDR_USED:_HDR_USED + 4], jnp.uint32)
  used_hi = lax.bitcast_convert_type(gathered[:, _HDR_USED + 4:_HDR_USED + 8], jnp.uint32)
  fell = jnp.any((gathered[:, _HDR_STATUS] != 0) | (used_hi != 0) |
                 (used_lo > np.uint32(plan.nbytes)))

  def compressed():
    return _codec.decode_rows(gathered, m, dtype)[0]

  out = lax.cond(fell, uncompressed, compressed)
  if want_stats:
    esc = lax.bitcast_convert_type(gathered[:, _HDR_ESCAPES:_HDR_ESCAPES + 4], jnp.uint32)
    escapes = jnp.sum(jnp.minimum(esc, np.uint32(m)).astype(jnp.int32))
  else:
    escapes = jnp.int32(0)
  wire = jnp.where(fell, plan.nbytes + raw_bytes, plan.nbytes)
  return out, _Part(fell, escapes, wire, raw_bytes, n_peers * m, True)


def _permute_row(row, axes, perm, n_peers, plan: _Plan, want_stats):
  """lax.ppermute of row[m]; peers that receive nothing get zeros, as in lax."""
  m = row.shape[0]
  dtype = plan.dtype
  raw_bytes = m * dtype.itemsize

  def uncompressed():
    return _unbits(lax.ppermute(_bits(row), axes, perm), dtype)

  if not plan.compress:
    return uncompressed(), _plain_part(raw_bytes)
  sends_tbl = np.zeros(n_peers, bool)
  recvs_tbl = np.zeros(n_peers, bool)
  for s, d in perm:
    sends_tbl[s] = True
    recvs_tbl[d] = True
  me = lax.axis_index(axes)
  sends = jnp.asarray(sends_tbl)[me]
  payload, st = _encode_slot(row[None], plan)
  # Only rows that are sent can force a fallback.
  overflow = sends & _overflows(st, plan)[0]
  escapes = jnp.where(sends, jnp.minimum(st[0, 1], m), 0)
  fell, esc_total, flag_bytes = _agree(overflow, escapes, axes, want_stats)

  def compressed():
    recv = lax.ppermute(payload[0], axes, perm)
    y, _ = _codec.decode_rows(recv[None], m, dtype)
    # A peer nobody sends to holds a zero payload (not decodable): lax gives zeros.
    u = jnp.where(jnp.asarray(recvs_tbl)[me], _bits(y[0]), 0)
    return _unbits(u, dtype)

  out = lax.cond(fell, uncompressed, compressed)
  wire = jnp.where(fell, raw_bytes, plan.nbytes) + flag_bytes
  return out, _Part(fell, esc_total, wire, raw_bytes, len(perm) * m, True)


def _ordered_sum(recv, dtype):
  """sum_i recv[i] in rank order i = 0..N-1, float32 accumulation, rounded once.

  Written as a chain of adds (not jnp.sum) so that the order is the program's:
  XLA does not reassociate floating-point adds.
  """
  n_peers = recv.shape[0]
  acc = recv[0].astype(jnp.float32)
  if n_peers <= _UNROLL_MAX:
    for i in range(1, n_peers):
      acc = acc + recv[i].astype(jnp.float32)
  else:
    acc = lax.fori_loop(1, n_peers, lambda i, a: a + recv[i].astype(jnp.float32), acc)
  return acc.astype(dtype)


# ---- the collectives: implementations ------------------------------------------------------


class _Cfg(NamedTuple):
  """Static configuration of one collective call (custom_vjp nondiff argument)."""
  axes: tuple
  n_peers: int
  opts: _Opts
  stats: bool
  fn: str
  dim: int = 0          # all_gather axis / psum_scatter scatter_dimension / a2a split_axis
  dim2: int = 0         # a2a concat_axis
  tiled: bool = False
  to: str = "varying"   # all_gather
  perm: tuple = ()      # ppermute


def _ag_impl(x, cfg: _Cfg):
  shape = x.shape
  n = x.size
  plan = _plan(cfg.fn, x.dtype, n, cfg.opts)
  g, part = _gather_rows(x.reshape(n), cfg.axes, cfg.n_peers, plan, cfg.stats)
  y = jnp.moveaxis(g.reshape((cfg.n_peers,) + shape), 0, cfg.dim)
  if cfg.tiled:
    a = cfg.dim
    y = y.reshape(shape[:a] + (cfg.n_peers * shape[a],) + shape[a + 1:])
  if cfg.to == "varying":
    y = compat.pvary(y, cfg.axes)
  return y, (_stats("all_gather", cfg.opts.codec, [part]) if cfg.stats else None)


def _rows_for_peers(x, dim, tiled, n_peers):
  """x -> (rows[N, m], chunk shape): row j is the chunk along `dim` for peer j."""
  shape = x.shape
  if tiled:
    c = shape[dim] // n_peers
    x = x.reshape(shape[:dim] + (n_peers, c) + shape[dim + 1:])
    chunk = shape[:dim] + (c,) + shape[dim + 1:]
  else:
    chunk = shape[:dim] + shape[dim + 1:]
  rows = jnp.moveaxis(x, dim, 0).reshape(n_peers, -1)
  return rows, chunk


def _rs_impl(x, cfg: _Cfg):
  rows, chunk = _rows_for_peers(x, cfg.dim, cfg.tiled, cfg.n_peers)
  plan = _plan(cfg.fn, x.dtype, rows.shape[1], cfg.opts)
  recv, part = _a2a_rows(rows, cfg.axes, plan, cfg.stats)
  y = _ordered_sum(recv, x.dtype).reshape(chunk)
  return y, (_stats("psum_scatter", cfg.opts.codec, [part]) if cfg.stats else None)


def _psum_impl(x, cfg: _Cfg):
  n = x.size
  n_peers = cfg.n_peers
  m = -(-n // n_peers)
  flat = x.reshape(n)
  if n_peers * m != n:
    flat = jnp.pad(flat, (0, n_peers * m - n))
  plan = _plan(cfg.fn, x.dtype, m, cfg.opts)
  recv, p1 = _a2a_rows(flat.reshape(n_peers, m), cfg.axes, plan, cfg.stats)
  mine = _ordered_sum(recv, x.dtype)
  g, p2 = _gather_rows(mine, cfg.axes, n_peers, plan, cfg.stats)
  y = g.reshape(n_peers * m)[:n].reshape(x.shape)
  return y, (_stats("psum", cfg.opts.codec, [p1, p2]) if cfg.stats else None)


def _a2a_impl(x, cfg: _Cfg):
  n_peers = cfg.n_peers
  rows, chunk = _rows_for_peers(x, cfg.dim, cfg.tiled, n_peers)
  plan = _plan(cfg.fn, x.dtype, rows.shape[1], cfg.opts)
  recv, part = _a2a_rows(rows, cfg.axes, plan, cfg.stats)
  c = cfg.dim2
  y = jnp.moveaxis(recv.reshape((n_peers,) + chunk), 0, c)
  if cfg.tiled:
    y = y.reshape(chunk[:c] + (n_peers * chunk[c],) + chunk[c + 1:])
  return y, (_stats("all_to_all", cfg.opts.codec, [part]) if cfg.stats else None)


def _pp_impl(x, cfg: _Cfg):
  n = x.size
  plan = _plan(cfg.fn, x.dtype, n, cfg.opts)
  y, part = _permute_row(x.reshape(n), cfg.axes, cfg.perm, cfg.n_peers, plan, cfg.stats)
  return y.reshape(x.shape), (_stats("ppermute", cfg.opts.codec, [part]) if cfg.stats else None)


# ---- custom VJPs -------------------------------------------------------------------------
# The transpose of each collective is another compressed collective with the same
# options (no stats): all_gather <-> psum_scatter, all_to_all with its axes swapped,
# ppermute with the inverted permutation, psum as JAX's shard_map rule.


def _with_vjp(impl, bwd):
  f = jax.custom_vjp(impl, nondiff_argnums=(1,))
  f.defvjp(lambda x, cfg: (impl(x, cfg), None), lambda cfg, _, ct: (bwd(cfg, ct[0]),))
  return f


def _ag_bwd(cfg: _Cfg, ct):
  if cfg.to == "invarying":
    # lax's rule: the cotangent is replicated, so each peer keeps its own chunk.
    me = lax.axis_index(cfg.axes)
    if cfg.tiled:
      size = ct.shape[cfg.dim] // cfg.n_peers
      return lax.dynamic_slice_in_dim(ct, me * size, size, cfg.dim)
    return lax.dynamic_index_in_dim(ct, me, cfg.dim, keepdims=False)
  rs = cfg._replace(fn="compressed_psum_scatter (grad of compressed_all_gather)", stats=False,
                    opts=cfg.opts.for_grad())
  return _rs(compat.pvary(ct, cfg.axes), rs)[0]


def _rs_bwd(cfg: _Cfg, ct):
  ag = cfg._replace(fn="compressed_all_gather (grad of compressed_psum_scatter)", stats=False,
                    to="varying", opts=cfg.opts.for_grad())
  return _ag(compat.pvary(ct, cfg.axes), ag)[0]


def _psum_bwd(cfg: _Cfg, ct):
  if compat.check_vma_enabled():
    return compat.pvary(ct, cfg.axes)      # JAX: psum's cotangent is only re-typed
  return _psum(ct, cfg._replace(stats=False, opts=cfg.opts.for_grad()))[0]  # no vma: psum again


def _a2a_bwd(cfg: _Cfg, ct):
  return _a2a(compat.pvary(ct, cfg.axes),
              cfg._replace(dim=cfg.dim2, dim2=cfg.dim, stats=False, opts=cfg.opts.for_grad()))[0]


def _pp_bwd(cfg: _Cfg, ct):
  inv = tuple((d, s) for s, d in cfg.perm)
  return _pp(compat.pvary(ct, cfg.axes), cfg._replace(perm=inv, stats=False,
                                                      opts=cfg.opts.for_grad()))[0]


_ag = _with_vjp(_ag_impl, _ag_bwd)
_rs = _with_vjp(_rs_impl, _rs_bwd)
_psum = _with_vjp(_psum_impl, _psum_bwd)
_a2a = _with_vjp(_a2a_impl, _a2a_bwd)
_pp = _with_vjp(_pp_impl, _pp_bwd)


def _map_leaves(one, x, stats: bool):
  leaves, treedef = jax.tree_util.tree_flatten(x)
  outs = [one(leaf) for leaf in leaves]
  y = jax.tree_util.tree_unflatten(treedef, [o[0] for o in outs])
  if not stats:
    return y
  return y, jax.tree_util.tree_unflatten(treedef, [o[1] for o in outs])


def _lax_stats(name, x):
  """codec=None: the lax op's operand is x itself (XLA:CPU may widen bf16 further)."""
  return _stats(name, None, [_plain_part(x.size * x.dtype.itemsize)])


# ---- public API ----------------------------------------------------------------------------

_OPTIONS_DOC = """
    codec: "zipccl" (compress), "raw" (the same algorithm moving uncompressed
      uint16/uint32 bitcasts: the exact twin, bit-identical results) or None
      (the plain `jax.lax` collective, the oracle).
    escape_capacity: escape slots per row (one row = the message for one peer);
      default `default_escape_capacity(m)` (3.75% + 64). A row that needs more
      makes the whole call fall back to the uncompressed path (still exact).
    grad_escape_capacity: escape slots per row of the collective that jax.grad
      runs for this one (e.g. the reduce-scatter of an all_gather's cotangent);
      default: escape_capacity. Gradients often escape more than weights (heavier
      tails, mixed scales in flat FSDP buffers), so they may need more room.
    policy: "always" compress; "never" (same as codec="raw"); "auto" compress
      when a row holds at least AUTO_MIN_ROW_BYTES (64 KiB) raw and encodes
      smaller than that.
    stats: also return a `CollectiveStats` (per leaf of x) with the fallback
      flag, escape count and bytes moved. Costs nothing extra on the wire except
      the fallback flag of psum_scatter/psum/all_to_all/ppermute growing from 4
      to 8 bytes."""


def _with_options_doc(f):
  f.__doc__ = f.__doc__.replace("{options}", _OPTIONS_DOC.strip("\n"))
  return f


@_with_options_doc
def compressed_all_gather(x, axis_name, *, axis: int = 0, tiled: bool = False,
                          to: str = "varying", codec: str | None = "zipccl",
                          escape_capacity: int | None = None,
                          grad_escape_capacity: int | None = None, policy: str = "auto",
                          stats: bool = False):
  """`jax.lax.all_gather` with compressed payloads; bit-identical result.

  Each device encodes its block once into one row, the rows are all-gathered as
  uint8 and decoded. If any row overflowed (seen in the gathered headers, no extra
  collective), everyone gathers the raw uint16/uint32 bits instead.

  Args:
    x: bf16/fp16/fp32 array (or pytree of them), inside `jax.shard_map`.
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
  opts, axes, n_peers = _setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity,
                               policy, stats, tiled)

  def one(leaf):
    leaf = _check_x(fn, leaf)
    if tiled and leaf.ndim == 0:
      raise ValueError(f"{fn}: tiled=True needs x with at least one dimension, got a scalar")
    a = _check_dim(fn, "axis", axis, leaf.ndim + (0 if tiled else 1))
    if opts.codec is None:
      y = (compat.all_gather_invariant(leaf, axes, axis=a, tiled=tiled) if to == "invarying"
           else lax.all_gather(leaf, axes, axis=a, tiled=tiled))
      return y, (_lax_stats("all_gather", leaf) if stats else None)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, dim=a, tiled=tiled, to=to)
    return _ag(compat.pvary(leaf, axes), cfg)

  return _map_leaves(one, x, stats)


@_with_options_doc
def compressed_psum_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = False,
                            codec: str | None = "zipccl", escape_capacity: int | None = None,
                            grad_escape_capacity: int | None = None,
                            policy: str = "auto", stats: bool = False):
  """`jax.lax.psum_scatter` over compressed per-destination chunks.

  Each device encodes the N chunks of x along `scatter_dimension` as N rows in one
  call, the rows go over one all_to_all, and each device decodes the N chunks it
  received and sums them in rank order 0..N-1 with float32 accumulation, rounding
  once to x.dtype. Deterministic; bit-identical to codec="raw" and policy="never";
  close to (not bit-equal with) lax.psum_scatter, whose order XLA picks.

  Args:
    x: bf16/fp16/fp32 array (or pytree), inside `jax.shard_map`.
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
  opts, axes, n_peers = _setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity,
                               policy, stats, tiled)

  def one(leaf):
    leaf = _check_x(fn, leaf)
    if leaf.ndim == 0:
      raise ValueError(f"{fn}: x must have at least one dimension, got a scalar")
    d = _check_dim(fn, "scatter_dimension", scatter_dimension, leaf.ndim)
    _check_split(fn, "scatter_dimension", leaf.shape[d], n_peers, tiled, axis_name)
    if opts.codec is None:
      y = lax.psum_scatter(leaf, axes, scatter_dimension=d, tiled=tiled)
      return y, (_lax_stats("psum_scatter", leaf) if stats else None)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, dim=d, tiled=tiled)
    return _rs(compat.pvary(leaf, axes), cfg)

  return _map_leaves(one, x, stats)


def _check_split(fn, arg, size, n_peers, tiled, axis_name):
  if tiled and size % n_peers:
    raise ValueError(f"{fn}: x.shape[{arg}] = {size} must be divisible by the size of "
                     f"axis {axis_name!r} ({n_peers}) when tiled=True")
  if not tiled and size != n_peers:
    raise ValueError(f"{fn}: x.shape[{arg}] = {size} must equal the size of axis "
                     f"{axis_name!r} ({n_peers}) when tiled=False")


@_with_options_doc
def compressed_psum(x, axis_name, *, codec: str | None = "zipccl",
                    escape_capacity: int | None = None,
                    grad_escape_capacity: int | None = None, policy: str = "auto",
                    stats: bool = False):
  """`jax.lax.psum` as compressed reduce-scatter + compressed all-gather.

  x is flattened and split into N equal rows (zero-padded); the reduce-scatter
  sums row i of every peer on peer i in rank order with float32 accumulation and
  rounds once; the all-gather shares the reduced rows losslessly, so every peer
  returns the same bits. Deterministic run to run and identical to codec="raw".

  Args:
    x: bf16/fp16/fp32 array (or pytree, e.g. gradients), inside `jax.shard_map`.
    axis_name: mesh axis name or tuple of names.
{options}

  Returns:
    The sum (pytree), typed invariant over axis_name like lax.psum, and a
    `CollectiveStats` (both phases together) when stats=True.

  Raises:
    TypeError / ValueError naming the argument.
  """
  fn = "compressed_psum"
  opts, axes, n_peers = _setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity,
                               policy, stats)

  def one(leaf):
    leaf = _check_x(fn, leaf)
    if opts.codec is None:
      return lax.psum(leaf, axes), (_lax_stats("psum", leaf) if stats else None)
    cfg = _Cfg(axes, n_peers, opts, stats, fn)
    return _psum(compat.pvary(leaf, axes), cfg)

  return _map_leaves(one, x, stats)


@_with_options_doc
def compressed_all_to_all(x, axis_name, split_axis: int, concat_axis: int, *,
                          tiled: bool = False, codec: str | None = "zipccl",
                          escape_capacity: int | None = None,
                          grad_escape_capacity: int | None = None, policy: str = "auto",
                          stats: bool = False):
  """`jax.lax.all_to_all` with compressed per-destination chunks; bit-identical.

  Args:
    x: bf16/fp16/fp32 array (or pytree), inside `jax.shard_map`.
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
  opts, axes, n_peers = _setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity,
                               policy, stats, tiled)

  def one(leaf):
    leaf = _check_x(fn, leaf)
    if leaf.ndim == 0:
      raise ValueError(f"{fn}: x must have at least one dimension, got a scalar")
    s = _check_dim(fn, "split_axis", split_axis, leaf.ndim)
    c = _check_dim(fn, "concat_axis", concat_axis, leaf.ndim)
    _check_split(fn, "split_axis", leaf.shape[s], n_peers, tiled, axis_name)
    if opts.codec is None:
      y = lax.all_to_all(leaf, axes, s, c, tiled=tiled)
      return y, (_lax_stats("all_to_all", leaf) if stats else None)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, dim=s, dim2=c, tiled=tiled)
    return _a2a(compat.pvary(leaf, axes), cfg)

  return _map_leaves(one, x, stats)


@_with_options_doc
def compressed_ppermute(x, axis_name, perm, *, codec: str | None = "zipccl",
                        escape_capacity: int | None = None,
                        grad_escape_capacity: int | None = None, policy: str = "auto",
                        stats: bool = False):
  """`jax.lax.ppermute` with a compressed payload; bit-identical (zeros where
  no one sends, as lax).

  Args:
    x: bf16/fp16/fp32 array (or pytree), inside `jax.shard_map`.
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
  opts, axes, n_peers = _setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity,
                               policy, stats)
  perm = _check_perm(fn, perm, n_peers)

  def one(leaf):
    leaf = _check_x(fn, leaf)
    if opts.codec is None:
      y = lax.ppermute(leaf, axes, perm)
      return y, (_lax_stats("ppermute", leaf) if stats else None)
    cfg = _Cfg(axes, n_peers, opts, stats, fn, perm=perm)
    return _pp(compat.pvary(leaf, axes), cfg)

  return _map_leaves(one, x, stats)


def _check_perm(fn, perm, n_peers) -> tuple:
  try:
    pairs = tuple((int(s), int(d)) for s, d in perm)
    ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
             for pair in perm for v in pair)
  except (TypeError, ValueError):
    pairs, ok = (), False
  if not ok:
    raise TypeError(f"{fn}: perm must be a sequence of (source, destination) int pairs, "
                    f"got {perm!r}")
  for s, d in pairs:
    if not (0 <= s < n_peers and 0 <= d < n_peers):
      raise ValueError(f"{fn}: perm pair {(s, d)} is out of range for an axis of size "
                       f"{n_peers}")
  srcs = [s for s, _ in pairs]
  dsts = [d for _, d in pairs]
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"{fn}: perm must not repeat a source or a destination, got {perm!r}")
  return pairs


# ---- measuring the wire in compiled HLO ------------------------------------------------------

_COLLECTIVE_OPCODES = ("all-gather", "all-gather-start", "all-to-all", "collective-permute",
                       "collective-permute-start", "reduce-scatter", "all-reduce",
                       "all-reduce-start", "ragged-all-to-all", "collective-broadcast")
_ELEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY_RE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8\w*)\[([\d,]*)\]")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_COMP_RE = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")


def _group_size(attrs: str, default: int) -> int:
  m = re.search(r"replica_groups=\{\{([\d,\s]*)\}", attrs)
  if m:
    return len([v for v in m.group(1).split(",") if v.strip()])
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
  if m:
    return int(m.group(2))
  return default


def _sent_model(opcode: str, nbytes: int, group: int) -> float:
  """Bytes one device sends for a collective of `nbytes` operand bytes over `group`."""
  base = opcode.removesuffix("-start")
  if base == "all-gather":
    return float(nbytes * (group - 1))
  if base in ("all-to-all", "reduce-scatter", "ragged-all-to-all"):
    return nbytes * (group - 1) / group
  if base == "all-reduce":
    return 2.0 * nbytes * (group - 1) / group
  return float(nbytes)


@dataclasses.dataclass(frozen=True)
class HloCollective:
  """One collective instruction of a compiled HLO module."""
  computation: str
  opcode: str
  operand_bytes: int
  path: str   # "always" (both paths), "common" (branch 0 only), "fallback" (branch 1 only)
  group_size: int = 1
  sent_bytes: float = 0.0   # modelled bytes one device sends (see hlo_wire_bytes)


@dataclasses.dataclass(frozen=True)
class HloWireBytes:
  """Operand bytes of the collectives in a compiled module.

  common: on the path taken when nothing overflows (conditionals take branch 0,
    the false branch: every fallback `lax.cond` here is `cond(fell_back, ...)`).
  fallback: on the path taken when every fallback fires (branch 1).
  total: every collective in the module, whichever branch it is in.
  *_sent: the same sums of `HloCollective.sent_bytes`, a model of the bytes that
    leave one device, which makes different collectives comparable (an
    all-reduce of B operand bytes sends ~2B(G-1)/G, an all-gather B(G-1)).
  """
  common: int
  fallback: int
  total: int
  ops: tuple
  common_sent: float = 0.0
  fallback_sent: float = 0.0
  total_sent: float = 0.0


def _shape_bytes(shape: str) -> int:
  total = 0
  for dt, dims in _ARRAY_RE.findall(shape):
    size = _ELEM_BYTES.get(dt, 1)
    for d in filter(None, dims.split(",")):
      size *= int(d)
    total += size
  return total


def _split_top(s: str, open_ch: str, close_ch: str):
  """Returns (text inside the first balanced open..close group, the rest)."""
  depth = 0
  start = s.index(open_ch)
  for i in range(start, len(s)):
    if s[i] == open_ch:
      depth += 1
    elif s[i] == close_ch:
      depth -= 1
      if depth == 0:
        return s[start + 1:i], s[i + 1:]
  return s[start + 1:], ""


def hlo_wire_bytes(hlo_text: str) -> HloWireBytes:
  """Sums the operand bytes of every collective in compiled HLO text.

  Use it on `jax.jit(f).lower(*args).compile().as_text()`: the bytes there are
  what XLA actually moves (after any dtype widening). A while loop body counts
  once. Async start/done pairs count once (the start).

  Returns:
    An `HloWireBytes` with the common-case, fallback-case and total sums, and
    every collective found (`ops`).

  Raises:
    ValueError: the text has no ENTRY computation.
  """
  comps: dict[str, list] = {}
  m = re.search(r"num_partitions=(\d+)", hlo_text)
  n_dev = int(m.group(1)) if m else 1
  if n_dev == 1:
    m = re.search(r"replica_count=(\d+)", hlo_text)
    n_dev = int(m.group(1)) if m else 1
  entry = None
  cur = None
  for line in hlo_text.splitlines():
    m = _COMP_RE.match(line)   # computation headers start in column 0
    if m:
      cur = m.group(2)
      comps[cur] = []
      if m.group(1):
        entry = cur
      continue
    if cur is None:
      continue
    if line.strip() == "}":
      cur = None
      continue
    im = _INSTR_RE.match(line)
    if not im:
      continue
    name, rest = im.group(1), im.group(2)
    if rest.startswith("("):
      inner, after = _split_top(rest, "(", ")")
      shape = "(" + inner + ")"
      after = after.lstrip()
    else:
      shape, _, after = rest.partition(" ")
    opcode = after.split("(", 1)[0].strip()
    operands_txt, attrs = _split_top(after, "(", ")") if "(" in after else ("", after)
    operands = re.findall(r"%([\w.\-]+)", operands_txt)
    comps[cur].append((name, shape, opcode, operands, attrs))
  if entry is None:
    raise ValueError("hlo_wire_bytes: no ENTRY computation found in the HLO text")

  def walk(comp, choose, seen, out):
    """Collectives reachable from comp; conditionals take branch `choose` (None: all)."""
    if comp in seen or comp not in comps:
      return
    seen = seen | {comp}
    shapes = {name: shape for name, shape, *_ in comps[comp]}
    for name, _, opcode, operands, attrs in comps[comp]:
      if opcode in _COLLECTIVE_OPCODES:
        nbytes = sum(_shape_bytes(shapes.get(o, "")) for o in operands)
        group = _group_size(attrs, n_dev)
        out[(comp, name)] = (opcode, nbytes, group, _sent_model(opcode, nbytes, group))
      if opcode == "conditional":
        m = re.search(r"branch_computations=\{([^}]*)\}", attrs)
        if m:
          branches = re.findall(r"%([\w.\-]+)", m.group(1))
        else:
          t = re.search(r"true_computation=%([\w.\-]+)", attrs)
          f = re.search(r"false_computation=%([\w.\-]+)", attrs)
          branches = [f.group(1), t.group(1)] if t and f else []
        for i, b in enumerate(branches):
          if choose is None or i == min(choose, len(branches) - 1):
            walk(b, choose, seen, out)
        continue
      for key in ("calls", "to_apply", "body", "condition"):
        for sub in re.findall(key + r"=%([\w.\-]+)", attrs):
          walk(sub, choose, seen, out)

  found = {}
  for choose in (0, 1, None):
    found[choose] = {}
    walk(entry, choose, frozenset(), found[choose])
  ops = []
  for key, (opcode, nbytes, group, sent) in found[None].items():
    in0, in1 = key in found[0], key in found[1]
    path = "always" if in0 and in1 else "common" if in0 else "fallback" if in1 else "other"
    ops.append(HloCollective(key[0], opcode, nbytes, path, group, sent))

  def total(which, i):
    return sum(v[i] for v in found[which].values())

  return HloWireBytes(total(0, 1), total(1, 1), total(None, 1), tuple(ops),
                      total(0, 3), total(1, 3), total(None, 3))
