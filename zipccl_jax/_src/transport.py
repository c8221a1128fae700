"""Row transports: the size-adaptive slot ladder.

Every collective moves *rows*: a tensor flattened to `m` elements, one row per
destination (all_to_all, reduce-scatter) or one row per source (all_gather,
ppermute). For one call, a device

  1. encodes all its rows in one `encode_rows` call into a worst-case buffer
     uint8[R, max_nbytes]; the codec reports each row's used size (a multiple of
     128 bytes; more than max_nbytes when the row does not fit);
  2. agrees with its peers on the largest used size: ONE all-gather of a small
     int32 row per participant, (used size, count, the plan fingerprint), the same
     with or without stats. The fingerprint (`fingerprint`: codec and format
     version, ladder, chunking, collective, dtype, row shape, check_decode) must
     be equal everywhere: participants that planned different transports fail
     the call before any byte moves ("zipccl_agree");
  3. rounds it up to the next rung of a static ladder of slot sizes (`ladder`),
     from the codec's min_nbytes (or its floor, with low rungs below) to below
     the raw row size, 1% apart (`ladder`); the rung index is identical
     everywhere after the agreement;
  4. runs that rung's branch of a `lax.switch`: cut payload[:, :slot], move it
     with the XLA collective, decode it. The top rung moves the raw words
     (same-width uint16/uint32 bitcasts: XLA:CPU widens bf16 collectives to f32).

How a rung moves its rows depends on the backend (`lax.platform_dependent`), so
that on XLA:CPU a rung compiles to custom calls and collective thunks only, no
kernel (every kernel is LLVM compile time, per rung; the row operations are in
row_ops.py):
  * all-gather / ppermute rungs: the slot is cut by a custom call (`row_prefix`,
    "zipccl_row_prefix") on CPU, by a slice elsewhere;
  * all-to-all rungs (psum_scatter, all_to_all, psum's reduce-scatter): on CPU
    N - 1 collective permutes, shift k = 1..N-1 moving every device's row for
    peer (me + k) mod N, the rows cut by one custom call ("zipccl_row_split") and
    put back in peer order by another ("zipccl_row_join"; the own row never
    leaves the device) -- `a2a_slot`, `a2a_raw`. XLA:CPU would turn an array
    all-to-all into N per-peer slice kernels and a concatenate per rung. The raw
    rung moves its words by the same permutes: every branch of a switch issues
    the same collectives in the same order, because XLA:CPU's collective-permute
    rendezvous spans all devices named in its pairs, so groups of a transport
    over one axis of a larger mesh that agree on different rungs must meet in
    the same ops. Other backends (NCCL) keep lax.all_to_all. Stats count the
    rows each rung hands to XLA: N - 1 on CPU, N elsewhere.

So no capacity is tuned and nothing falls back for a whole call: the wire is the
largest used size among the participants plus ~1%, or raw when the data does
not compress. The decoder's per-row status is kept: rows that fail to decode
(only a corrupted wire can cause it) are NaN (all-one bits, written by the
decoder), counted in the stats, and raise when `check_decode` is on.

Chunks (docs/design.md, "Transport: the slot ladder"). A plan with C > 1 chunks splits every row
into C column ranges (`chunk_bounds`) and runs the whole ladder above (encode,
agree, switch) once per chunk, each with its own ladder; the received chunks are
concatenated, so the result is the same bits as one transport. Chunking is a
layer around `_ladder`: with C = 1 the program is exactly the unchunked one.

Each mover returns (rows that arrived, (stats.Part per chunk,)).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import agreement
from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src import planned_sites
from zipccl_jax._src import stats
from zipccl_jax._src.codecs import base
from zipccl_jax._src.row_ops import (USED_COLUMN, a2a_raw, a2a_rows_sent, a2a_slot, bits, copy_as,
                                     row_prefix, unbits, used_max)

_ALIGN = ladder_lib.ALIGN   # used sizes and slots are multiples of 128 bytes
_UNROLL_MAX = 64       # ordered sums over more peers use a fori_loop



def _ladder(rows, plan, axes, want_stats, check, *, move, sends=None, recvs=None, where="",
            after=None, prefix=row_prefix, own=None, move_slot=None, move_raw=None):
  """Moves rows[R, m] by the slot ladder; returns (received rows[R', m], stats.Part).

  move(a) is the XLA collective applied to a uint8[R, slot] payload or to the
  raw words uint{16,32}[R, m] (the same function for every rung). sends: bool[]
  whether this device's rows are sent (ppermute); recvs: bool[] whether it
  receives anything (rows it does not receive are zeros, as in lax). after: an
  int32 >= 0 the agreement must wait for (a chunked transport passes the previous
  chunk's rung, so that XLA cannot combine the chunks' agreements into one
  all-reduce, which would wait for every chunk's encode). prefix(payload, slot)
  cuts the slot out of the encoded rows; move_slot(payload, slot), when given,
  replaces move(prefix(payload, slot)) on the compressed rungs, move_raw(rows)
  the raw rung's move of the rows' words (default: move on `copy_as` word views).
  own: (sent,
  received, fill) for a transport whose own row never leaves the device: sent
  bool[R] marks it among
  the rows sent (or None), received bool[R'] among the rows received, fill[F, m]
  its values (F dividing R': received row i takes fill row i // (R' // F)). A
  codec with SKIP_ROWS then neither encodes nor decodes it: the decoder copies
  fill (docs/format.md, "Skipped rows"), the bits the row would decode to, so the
  result is unchanged and the codec does (N-1)/N of the work.
  """
  m = plan.m
  dtype = plan.dtype
  codec = plan.codec
  if own is not None and not skips_own_row(codec):
    own = None
  if own is not None:
    # the codecs' skip masks as uint8 once, outside the switch (in a branch its
    # conversion would be one more kernel to compile per rung); one mask when the
    # encoder's and the decoder's are the same array (an all-to-all's)
    recv_mask = own[1].astype(jnp.uint8)
    send_mask = recv_mask if own[0] is own[1] else own[0]
    own = (send_mask, recv_mask, own[2])
  trace = planned_sites.active()
  if trace is not None:
    return _planned(trace, rows, plan, axes, check, where, own, move, prefix, move_slot, move_raw,
                    sends, recvs)
  if own is not None and own[0] is not None:
    payload, st = codec.encode_rows(rows, skip=own[0])   # u8[R, max_nbytes], s32[R, 4]
    # The count leaves the own row out on every backend (a GPU encodes it anyway);
    # its used size stays in the max: a GPU decodes the own row from its slot.
    count = jnp.sum(jnp.where(own[0], 0, jnp.minimum(st[:, 1], m)))
  else:
    payload, st = codec.encode_rows(rows)
    count = jnp.sum(jnp.minimum(st[:, 1], m))
  used = used_max(st)
  if sends is not None:
    used = jnp.where(sends, used, 0)
    count = jnp.where(sends, count, 0)
  if after is not None:
    # A data dependence (used >= 0 and rung >= 0, so the value is unchanged):
    # XLA:CPU drops optimization barriers before it combines all-reduces.
    used = jnp.maximum(used, jnp.minimum(after, 0).astype(used.dtype))
  fp = agreement.fingerprint(plan, rows.shape, where, check)
  agreed, count_total, rung, agree_bytes = agreement.gather(used, count, fp, axes, plan.rungs, where)

  compressed = functools.partial(_move_compressed, payload, plan, own, move, prefix, move_slot)
  raw = functools.partial(_move_raw, rows, dtype, move, move_raw)

  def mismatch():
    # The participants' plans differ (a backend whose agreement cannot raise): the
    # raw branch's types, nothing moved, all-one rows with status agreement.PLAN_MISMATCH.
    like_y, like_status = jax.eval_shape(raw)
    word = dtypes.info(dtype).word
    y = compat.pvary(jnp.full(like_y.shape, np.iinfo(word).max, word), compat.struct_varying(like_y))
    status = compat.pvary(jnp.full(like_status.shape, agreement.PLAN_MISMATCH, jnp.int32),
                          compat.struct_varying(like_status))
    return unbits(y, dtype), status

  y, status = compat.switch_in_range(
      rung, [functools.partial(compressed, s) for s in plan.rungs] + [raw, mismatch])
  y, status = _mask_receivers(y, status, recvs, dtype)
  errors = None   # not counted without check_decode: a count over the participants is a collective
  if check:
    # The failed rows over all participants (check_decode is part of the plan
    # fingerprint, so every participant runs this psum), so that every device
    # fails, not only the ones that received a bad row.
    errors = lax.psum(jnp.sum(status != 0).astype(jnp.int32), axes)
    agree_bytes += 4
    # y ^ zero: the results depend on the check (zero comes from the host at run
    # time, so XLA cannot fold it away) and fail with its error; one pass over y.
    word = dtypes.info(dtype).word
    zero = jax.pure_callback(functools.partial(agreement.raise_decode_error, where, codec, word),
                             jax.ShapeDtypeStruct((), word), errors, jnp.max(status),
                             vmap_method="sequential")
    y = unbits(bits(y) ^ zero, dtype)
  return y, Info(rung, agreed, count_total, errors, agree_bytes, tuple(plan.rungs))


def _zeros_status(like):
  """int32[R'] zeros typed varying over exactly the axes the received rows vary over."""
  return compat.pvary(jnp.zeros(like.shape[:1], jnp.int32), tuple(compat.varying_axes(like)))


def _move_compressed(payload, plan, own, move, prefix, move_slot, slot):
  """A compressed rung: the rows cut to `slot` bytes, moved, decoded: (y, status)."""
  received = move_slot(payload, slot) if move_slot else move(prefix(payload, slot))
  if own is not None:
    return plan.codec.decode_rows(received, plan.m, plan.dtype, skip=own[1], fill=own[2])
  return plan.codec.decode_rows(received, plan.m, plan.dtype)


def _move_raw(rows, dtype, move, move_raw):
  """The raw rung: the rows' words moved: (y, zero status)."""
  if move_raw is not None:
    y = move_raw(rows)
  else:
    word = dtypes.info(dtype).word
    y = copy_as(move(copy_as(rows, word)), dtype)
  return y, _zeros_status(y)


def _move_words(rows, dtype, move):
  """The rows' words moved by the plain collective, as the uncompressed path moves
  them: (y, zero status)."""
  y = unbits(move(bits(rows)), dtype)
  return y, _zeros_status(y)


def _mask_receivers(y, status, recvs, dtype):
  if recvs is None:
    return y, status
  # nobody sends to this device: lax gives zeros
  return unbits(jnp.where(recvs, bits(y), 0), dtype), jnp.where(recvs, status, 0)


def _planned(trace, rows, plan, axes, check, where, own, move, prefix, move_slot, move_raw,
             sends, recvs):
  """A call site under `zipccl_jax.jit` (planned.py): the planned slot, no agreement
  and no switch. The site records its largest used size (units of 128 B) and its
  failed rows into the mailbox; the wrapper validates them after the step. A row
  longer than the slot is cut: its receivers fail to decode it (status != 0, NaN
  rows) and the wrapper re-runs the step with a grown plan. While measuring
  (slot None) the site encodes to record the used size and moves the raw words."""
  signature = planned_sites.signature(where, plan, rows.shape, check, compat.axis_size(axes))
  k, slot = planned_sites.site(trace, signature, plan.rungs, plan.raw_row)
  # A raw site's words move as under codec="raw" (`_move_words`), not by a ladder's
  # raw rung (`_move_raw`), whose permutes and copy custom calls keep its switch's
  # branches alike and cheap to compile: a planned program has no switch. The
  # measuring program does move them by the raw rung: on CPU its N - 1 permutes
  # compile to no kernel, where an all-to-all's per-peer slices are kernels, and the
  # first call waits for that compile (a 200-leaf psum's first call: 0.64-0.77 s,
  # 0.89-1.04 s by the all-to-all), while the program runs only a few steps.
  if slot == planned_sites.RAW:
    y, status = _move_words(rows, plan.dtype, move)
  else:
    if own is not None and own[0] is not None:
      payload, st = plan.codec.encode_rows(rows, skip=own[0])
    else:
      payload, st = plan.codec.encode_rows(rows)
    # the used size: the stats' USED_COLUMN read by the mailbox itself (no
    # reduction op), or, for a device that may not send (a partial ppermute), masked
    used, column = (st, USED_COLUMN) if sends is None else (jnp.where(sends, used_max(st), 0), -1)
    if slot is None:
      # measuring: the raw words move once the used size is recorded
      rows = planned_sites.record(rows, [used], trace.ledger, 2 * k, column)
      y, status = _move_raw(rows, plan.dtype, move, move_raw)
    else:
      y, status = _move_compressed(payload, plan, own, move, prefix, move_slot, slot)
  y, status = _mask_receivers(y, status, recvs, plan.dtype)
  if slot not in (None, planned_sites.RAW):
    # one record per site: the used size and the decoder statuses (positive on
    # failure: max > 0 marks a failed row)
    y = planned_sites.record(y, [used, status], trace.ledger, 2 * k, column)
  return y, planned_info(slot, words_by_lax=slot == planned_sites.RAW)


class Info(NamedTuple):
  """What a transport reports for its stats (`stats_part`)."""
  rung: Any              # int32[], the rung taken
  agreed: Any            # int32[], the agreed used size / 128 (-1: not agreed, planned)
  count: Any             # int32[], the codec's count over the participants (-1: none)
  errors: Any            # int32[] failed rows over the participants; None: not counted
  agree_bytes: int       # bytes of the agreement collectives
  rungs: tuple           # the compressed rungs (bytes per row); the raw rung follows
  words_by_lax: bool = False   # the raw words went by the plain collective (`_move_words`)


def planned_info(slot: int | None, words_by_lax: bool = False) -> Info:
  """A planned site's stats info: a static one-rung ladder, its slot (rung 0, then
  raw: rung 1), or the raw rung alone (rung 0) for a site that moves raw words or
  measures. The used size and count live in the wrapper (`site_stats`)."""
  compressed = slot not in (None, planned_sites.RAW)
  return Info(jnp.int32(0), jnp.int32(-1), jnp.int32(-1), None, 0,
              (slot,) if compressed else (), words_by_lax)


def skips_own_row(codec) -> bool:
  """Whether transports leave the own row uncoded with this codec (its SKIP_ROWS)."""
  return bool(getattr(codec, "SKIP_ROWS", False))


def stats_part(plan, info, rows_sent: int, elements: int, raw_sent: int | None = None) -> stats.Part:
  """stats.Part of a ladder transport that sends rows_sent rows per device (raw_sent
  on its raw rung; default rows_sent) from its `Info`."""
  raw_sent = rows_sent if raw_sent is None else raw_sent
  slots = tuple(rows_sent * s for s in info.rungs) + (raw_sent * plan.raw_row,)
  sizes = info.rungs + (plan.raw_row,)
  return stats.Part(info.rung, info.agreed, info.count, info.errors, slots, sizes,
                    info.agree_bytes, raw_sent * plan.raw_row, elements, True)


def _chunked(rows, plan, run):
  """Runs run(rows[:, a:b], chunk_plan, after) -> (y, part) for every chunk of the
  plan (after: the previous compressed chunk's rung, None for the first) and
  concatenates the received chunks along the row: (y[R', m], parts).

  The chunks are transports in program order: chunk k+1's encode depends on
  nothing of chunk k, so a scheduler that overlaps independent ops may run it
  during chunk k's collective; only its agreement waits for chunk k's (`_ladder`'s
  `after`), which keeps the agreements apart (docs/design.md, "Transport: the slot ladder").
  """
  ys, parts = [], []
  prev = None
  for (a, b), sub in zip(plan.bounds, plan.parts):
    y, part = run(rows[:, a:b], sub, prev)
    ys.append(bits(y))
    parts.append(part)
    prev = part.rung if sub.compress else prev
  # concatenated as unsigned words: XLA:CPU may compute a bf16 concatenate in f32,
  # which would canonicalise NaN payloads
  return unbits(jnp.concatenate(ys, axis=1), plan.dtype), tuple(parts)


def a2a_rows(rows, axes, plan, want_stats, check=False):
  """rows[j] goes to peer j; returns (recv with recv[i] from peer i, parts)."""
  n_peers = rows.shape[0]

  def move(a):
    return lax.all_to_all(a, axes, 0, 0, tiled=True)

  def one(r, p, after=None):
    if not p.compress:
      return unbits(move(bits(r)), p.dtype), stats.plain_part(n_peers * p.raw_row, p.raw_row)
    # Compressed rungs: `a2a_slot` (on CPU N - 1 permutes, the own row stays here;
    # elsewhere the all-to-all of a plain slice, which fuses into it). Row `me`
    # is sent to this device itself: not coded. The fill is all rows (F = N: row r
    # takes fill row r, so row me takes r[me]; no slice copy of the own row).
    me = lax.axis_index(axes).astype(jnp.int32)
    mine = jnp.arange(n_peers) == me
    y, info = _ladder(r, p, axes, want_stats, check, move=move, move_raw=lambda w: a2a_raw(w, axes, me),
                      where="an all_to_all", after=after,
                      move_slot=lambda a, slot: a2a_slot(a, slot, axes, me), own=(mine, mine, r))
    # elements the count covers: every participant's rows, less their own ones
    coded = n_peers - 1 if skips_own_row(p.codec) else n_peers
    # rows handed to XLA per rung: on CPU the own row stays here (permutes); a
    # planned raw site's words go by lax's all-to-all (`_planned`), all N rows
    sent = a2a_rows_sent(n_peers)
    raw_sent = n_peers if info.words_by_lax else sent
    return y, stats_part(p, info, sent, n_peers * coded * p.m, raw_sent)

  if plan.parts:
    return _chunked(rows, plan, one)
  y, part = one(rows, plan)
  return y, (part,)


def gather_rows(row, axes, n_peers, plan, want_stats, check=False):
  """row[m] of every peer -> ([N, m] typed invariant over axes (identical everywhere),
  parts)."""

  def move(a):
    return compat.all_gather_invariant(a[0], axes)

  def one(r, p, after=None):
    if not p.compress:
      return unbits(move(bits(r)), p.dtype), stats.plain_part(p.raw_row, p.raw_row)
    # This device's own row of the result is its input: not decoded.
    y, info = _ladder(r, p, axes, want_stats, check, move=move, where="an all_gather",
                      after=after, own=(None, jnp.arange(n_peers) == lax.axis_index(axes), r))
    return y, stats_part(p, info, 1, n_peers * p.m)

  if plan.parts:
    return _chunked(row[None], plan, one)
  y, part = one(row[None], plan)
  return y, (part,)


def permute_row(row, axes, perm, n_peers, plan, want_stats, check=False):
  """lax.ppermute of row[m] -> (row, parts); peers that receive nothing get zeros,
  as in lax."""

  def move(a):
    return lax.ppermute(a[0], axes, perm)[None]

  sends_tbl = np.zeros(n_peers, bool)
  recvs_tbl = np.zeros(n_peers, bool)
  for s, d in perm:
    sends_tbl[s] = True
    recvs_tbl[d] = True

  def one(r, p, after=None):
    if not p.compress:
      return unbits(move(bits(r)), p.dtype), stats.plain_part(p.raw_row, p.raw_row)
    # A permutation every device takes part in (a ring) needs no masks: the mask
    # of receivers would cost a pass over the received row.
    y, info = _ladder(r, p, axes, want_stats, check, move=move,
                      sends=None if sends_tbl.all() else jnp.asarray(sends_tbl)[me],
                      recvs=None if recvs_tbl.all() else jnp.asarray(recvs_tbl)[me],
                      where="a ppermute", after=after)
    return y, stats_part(p, info, 1, len(perm) * p.m)

  if not plan.compress:
    y, part = one(row[None], plan)
    return y[0], (part,)
  me = lax.axis_index(axes)
  if plan.parts:
    y, parts = _chunked(row[None], plan, one)
    return y[0], parts
  y, part = one(row[None], plan)
  return y[0], (part,)


def ordered_sum(recv, dtype):
  """sum_i recv[i] in rank order i = 0..N-1, float32 accumulation, rounded once.

  On CPU backends one custom call ("zipccl_row_sum", ffi/transport.h: the adds of
  `ordered_sum_xla` as XLA:CPU computes them, subnormals flushed) and XLA's
  convert: as XLA ops the sum is N slices, converts and adds per call to trace,
  optimise and fuse (~35 of a compressed psum's ~80 traced operations).
  Elsewhere `ordered_sum_xla`.
  """
  n_peers = recv.shape[0]
  if n_peers == 1:
    return recv[0].astype(dtype)   # no add: the words themselves (XLA drops the convert pair too)

  def on_cpu(r):
    _ffi.register()
    flat = r.reshape(n_peers, -1)
    out = base.result_type(flat.shape[1:], jnp.float32, flat)
    acc = jax.ffi.ffi_call("zipccl_row_sum", out, vmap_method="broadcast_all")(flat)
    return acc.astype(dtype).reshape(r.shape[1:])

  return compat.platform_dependent(recv, cpu=on_cpu, default=lambda r: ordered_sum_xla(r, dtype))


def ordered_sum_xla(recv, dtype):
  """`ordered_sum` as XLA ops: a chain of adds (not jnp.sum), so that the order is
  the program's: XLA does not reassociate floating-point adds."""
  n_peers = recv.shape[0]
  acc = recv[0].astype(jnp.float32)
  if n_peers <= _UNROLL_MAX:
    for i in range(1, n_peers):
      acc = acc + recv[i].astype(jnp.float32)
  else:
    acc = lax.fori_loop(1, n_peers, lambda i, a: a + recv[i].astype(jnp.float32), acc)
  return acc.astype(dtype)
