"""Row transports: how encoded rows move through XLA collectives.

Every collective moves *rows*: a tensor flattened to `m` elements, one row per
destination (all_to_all, reduce-scatter) or one row per source (all_gather,
ppermute). One `encode_rows` call writes all rows of a device straight into the
`uint8[rows, nbytes]` array the XLA collective sends, and one `decode_rows` call
decodes what arrived. Each mover returns (rows that arrived, stats.Part).

Agreement: a row that does not fit is never decoded; all participants agree
(all_gather from the gathered headers; the others with one 4-byte pmax) and the
call takes the uncompressed path inside a `lax.cond` whose predicate is identical
on every participant. The uncompressed path moves same-width unsigned bitcasts
(uint16/uint32): XLA:CPU widens a bf16 collective to f32 on the wire.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import codec as _codec
from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import options
from zipccl_jax._src import stats

# Header fields read from gathered rows (docs/format.md, "Header").
_HDR_STATUS = 7        # u8: 0 = OK, 1 = DOES_NOT_FIT
_HDR_USED = 16         # u64 used_nbytes
_HDR_ESCAPES = 48      # u64 escape_count; its low 32 bits are enough (count <= n < 2^31)

_UNROLL_MAX = 64       # ordered sums over more peers use a fori_loop

# Rows are decoded only when nobody overflowed.


def bits(x):
  """Same-width unsigned view: the wire dtype of the uncompressed path."""
  return lax.bitcast_convert_type(x, dtypes.info(x.dtype).word)


def unbits(u, dtype):
  return lax.bitcast_convert_type(u, dtype)


def _encode_slot(rows, plan: options.Plan):
  """Encodes rows [N, m] and keeps the fixed slot: the first plan.nbytes bytes of each
  (format v2 rows are prefix-decodable)."""
  payload, st = _codec.encode_rows(rows)
  return payload[:, :plan.nbytes], st


def _overflows(st, plan: options.Plan):
  """Rows whose used bytes exceed the slot, or that do not fit at all (status 1)."""
  return (st[:, 0] != 0) | (st[:, 2] > plan.nbytes // 128)


def agree(overflow, escapes, axes, want_stats):
  """One tiny all-reduce that makes the fallback predicate identical everywhere.

  Without stats it is a pmax of an int32 flag (4 bytes); with stats a psum of
  (flag, escapes) (8 bytes), so stats cost no extra collective.
  """
  if want_stats:
    tot = lax.psum(jnp.stack([overflow.astype(jnp.int32), escapes.astype(jnp.int32)]), axes)
    return tot[0] > 0, tot[1], 8
  return lax.pmax(overflow.astype(jnp.int32), axes) > 0, jnp.int32(0), 4


def a2a_rows(rows, axes, plan: options.Plan, want_stats):
  """rows[j] goes to peer j; returns recv with recv[i] from peer i."""
  n_peers, m = rows.shape
  dtype = plan.dtype
  raw_bytes = n_peers * m * dtype.itemsize

  def uncompressed():
    return unbits(lax.all_to_all(bits(rows), axes, 0, 0, tiled=True), dtype)

  if not plan.compress:
    return uncompressed(), stats.plain_part(raw_bytes)
  payload, st = _encode_slot(rows, plan)                    # u8[N, nbytes], s32[N, 4]
  overflow = jnp.any(_overflows(st, plan))
  escapes = jnp.sum(jnp.minimum(st[:, 1], m))
  fell, esc_total, flag_bytes = agree(overflow, escapes, axes, want_stats)

  def compressed():
    recv = lax.all_to_all(payload, axes, 0, 0, tiled=True)
    return _codec.decode_rows(recv, m, dtype)[0]

  out = lax.cond(fell, uncompressed, compressed)
  wire = jnp.where(fell, raw_bytes, n_peers * plan.nbytes) + flag_bytes
  return out, stats.Part(fell, esc_total, wire, raw_bytes, n_peers * n_peers * m, True)


def gather_rows(row, axes, n_peers, plan: options.Plan, want_stats):
  """row[m] of every peer -> [N, m], typed invariant over axes (identical everywhere).

  The overflow decision reads the status byte of every gathered header, which
  every participant holds identically: no extra collective.
  """
  m = row.shape[0]
  dtype = plan.dtype
  raw_bytes = m * dtype.itemsize

  def uncompressed():
    return unbits(compat.all_gather_invariant(bits(row), axes), dtype)

  if not plan.compress:
    return uncompressed(), stats.plain_part(raw_bytes)
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
  return out, stats.Part(fell, escapes, wire, raw_bytes, n_peers * m, True)


def permute_row(row, axes, perm, n_peers, plan: options.Plan, want_stats):
  """lax.ppermute of row[m]; peers that receive nothing get zeros, as in lax."""
  m = row.shape[0]
  dtype = plan.dtype
  raw_bytes = m * dtype.itemsize

  def uncompressed():
    return unbits(lax.ppermute(bits(row), axes, perm), dtype)

  if not plan.compress:
    return uncompressed(), stats.plain_part(raw_bytes)
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
  fell, esc_total, flag_bytes = agree(overflow, escapes, axes, want_stats)

  def compressed():
    recv = lax.ppermute(payload[0], axes, perm)
    y, _ = _codec.decode_rows(recv[None], m, dtype)
    # A peer nobody sends to holds a zero payload (not decodable): lax gives zeros.
    u = jnp.where(jnp.asarray(recvs_tbl)[me], bits(y[0]), 0)
    return unbits(u, dtype)

  out = lax.cond(fell, uncompressed, compressed)
  wire = jnp.where(fell, raw_bytes, plan.nbytes) + flag_bytes
  return out, stats.Part(fell, esc_total, wire, raw_bytes, len(perm) * m, True)


def ordered_sum(recv, dtype):
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
