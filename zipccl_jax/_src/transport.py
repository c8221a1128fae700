"""Row transports: the size-adaptive slot ladder.

Every collective moves *rows*: a tensor flattened to `m` elements, one row per
destination (all_to_all, reduce-scatter) or one row per source (all_gather,
ppermute). For one call, a device

  1. encodes all its rows in one `encode_rows` call into a worst-case buffer
     uint8[R, max_nbytes]; the codec reports each row's used size (a multiple of
     128 bytes; more than max_nbytes when the row does not fit);
  2. agrees with its peers on the largest used size: ONE int32 pmax over the axes
     (an all-gather of (used, count) pairs when stats are asked for);
  3. rounds it up to the next rung of a static ladder of slot sizes (`ladder`),
     from the codec's min_nbytes (or its floor, with low rungs below) to below
     the raw row size, 1% apart (`ladder`); the rung index is identical
     everywhere after the agreement;
  4. runs that rung's branch of a `lax.switch`: cut payload[:, :slot], move it
     with the XLA collective, decode it. The top rung moves the raw words
     (same-width uint16/uint32 bitcasts: XLA:CPU widens bf16 collectives to f32).

How a rung moves its rows depends on the backend (`lax.platform_dependent`), so
that on XLA:CPU a rung compiles to custom calls and collective thunks only, no
kernel (every kernel is LLVM compile time, per rung):
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

Chunks (docs/design.md, "Overlap"). A plan with C > 1 chunks splits every row
into C column ranges (`chunk_bounds`) and runs the whole ladder above (encode,
agree, switch) once per chunk, each with its own ladder; the received chunks are
concatenated, so the result is the same bits as one transport. Chunking is a
layer around `_ladder`: with C = 1 the program is exactly the unchunked one.

Each mover returns (rows that arrived, (stats.Part per chunk,)).
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src import stats

_ALIGN = 128           # used sizes and slots are multiples of 128 bytes (the contract)
# The ladder: FINE_RUNGS rungs 1% apart from the codec's min_nbytes (where data that
# compresses lands: weights, most gradients), then COARSE growth up to the raw
# size, at most MAX_RUNGS compressed rungs: each is a switch branch. Every rung
# compiles to custom calls and collectives only on XLA:CPU (a gather or permute
# rung cuts its slot with `row_prefix`, an all-to-all rung is N - 1 permutes of
# `a2a_slot`), ~0 kernels and a few ms of compile time per rung, so all
# transports get the same fine ladder (docs/design.md, "Transport"). It was 8
# rungs 2% apart, then 5%, at most 12 for the all-to-all transports while their
# rungs were XLA all-to-alls (~10 kernels each).
LADDER_GROWTH = ((1, 100), (1, 20))   # (fine, coarse) growth per rung, exact fractions
FINE_RUNGS = 24
MAX_RUNGS = 32
ALL_TO_ALL_LADDER = (FINE_RUNGS, LADDER_GROWTH, MAX_RUNGS)   # the same as the gathers'
UNIFORM_DEN = 1000     # a too-long ladder is respaced uniformly, growth in 0.1% steps
# A ladder that starts above the codec's min_nbytes (a codec's `ladder_floor`, where
# typical rows land) gets LOW_RUNGS more rungs below its start, each LOW_STEP
# smaller than the one above (at least min_nbytes): rows that compress much
# better than typical (zero-heavy activations and embedding gradients under the
# entropy codec's zero elision: ratios 2-10) then move within 25% of their size
# instead of on the first rung. The same for all-to-all transports (2 while their
# rungs cost N slice kernels each on XLA:CPU).
LOW_RUNGS = 4
ALL_TO_ALL_LOW_RUNGS = LOW_RUNGS
LOW_STEP = (5, 4)       # 1.25x apart: ratios 2.0, 2.5, 3.1, 3.9 below a 1.6 floor
_UNROLL_MAX = 64       # ordered sums over more peers use a fori_loop
# Chunks: at most MAX_CHUNKS per row (each is a switch of the whole ladder: compile
# time grows with C); chunk boundaries are multiples of CHUNK_ALIGN elements (both
# codecs' block sizes, 2048 and 4096, divide it, so chunks hold whole blocks)
# unless the row is too short for that.
MAX_CHUNKS = 16
CHUNK_ALIGN = 4096
# False codes the own row like any other (the behaviour before the skip mask): read
# at trace time, only for A/B measurements (benchmarks/netns_bench.py's "<codec>+own").
_SKIP_OWN_ROW = True
# False keeps lax.all_to_all for the compressed all-to-all rungs on CPU too (the
# behaviour before `a2a_slot`'s permutes): read at trace time, only for A/B
# measurements of compile and run time.
_A2A_PERMUTES = True


def ladder(min_nbytes: int, raw_row: int, *, all_to_all: bool = False,
           below: int | None = None) -> tuple:
  """Compressed slot sizes (bytes per row) for rows whose raw size is raw_row.

  Ascending multiples of 128 from align128(min_nbytes), all below raw_row: the
  first FINE_RUNGS 1% (at least 128 bytes) apart, the rest 5% apart, so that a
  used size u near the codec's best case lands on a rung at most 1% above u.
  Sizes above the last rung take the raw rung (raw_row bytes, implicit, not
  listed). With all_to_all (the rows of an all-to-all transport) the ladder is
  ALL_TO_ALL_LADDER, now the same as the others. A ladder longer than
  its maximum (one that starts low, as the entropy codec's floor does) is
  respaced with one uniform growth, the smallest in steps of 0.1% that fits: the
  rows' band is not known in advance, and a uniform ladder bounds the slack
  everywhere (~1.5-2% mean over any band, where widening the coarse part first
  left 4-6% in bands above the fine part). Python ints: exact for any size.

  below: the codec's own min_nbytes when `min_nbytes` is a floor above it (a
  codec's `ladder_floor`): then LOW_RUNGS (ALL_TO_ALL_LOW_RUNGS) rungs go below
  the first, 1.25x apart (multiples of 128, none below `below`).
  """
  rungs = _ladder_from(min_nbytes, raw_row, all_to_all)
  if below is None or not rungs or below >= rungs[0]:
    return rungs
  low, s = [], rungs[0]
  for _ in range(ALL_TO_ALL_LOW_RUNGS if all_to_all else LOW_RUNGS):
    s = max(s * LOW_STEP[1] // LOW_STEP[0] // _ALIGN * _ALIGN, -(-below // _ALIGN) * _ALIGN)
    if s >= (low[-1] if low else rungs[0]):
      break
    low.append(s)
  return tuple(reversed(low)) + rungs


def _ladder_from(min_nbytes: int, raw_row: int, all_to_all: bool) -> tuple:
  fine, ((fn, fd), (cn, cd)), max_rungs = (ALL_TO_ALL_LADDER if all_to_all else
                                            (FINE_RUNGS, LADDER_GROWTH, MAX_RUNGS))

  def build(fine, fn, fd, cn, cd):
    rungs = []
    s = -(-min_nbytes // _ALIGN) * _ALIGN
    while s < raw_row and len(rungs) <= max_rungs:
      rungs.append(s)
      num, den = (fn, fd) if len(rungs) < fine else (cn, cd)
      s = max(s + _ALIGN, s * (den + num) // den // _ALIGN * _ALIGN)
    return rungs

  rungs = build(fine, fn, fd, cn, cd)
  # Too long: one uniform growth over the whole range, the smallest (in steps of
  # 0.1%, integers only, so that every host builds the same ladder) that fits.
  g = fn * UNIFORM_DEN // fd
  while len(rungs) > max_rungs:
    g += 1
    rungs = build(0, g, UNIFORM_DEN, g, UNIFORM_DEN)
  return tuple(rungs)


@functools.cache
def check_decode_default() -> bool:
  """ZIPCCL_CHECK_DECODE=1 turns `check_decode` on by default (read once)."""
  return os.environ.get("ZIPCCL_CHECK_DECODE", "0").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def chunks_default():
  """ZIPCCL_CHUNKS: the default of the collectives' `chunks=None` ("auto" or an int;
  read once). Anything else is reported by the collective that reads it."""
  v = os.environ.get("ZIPCCL_CHUNKS", "auto").strip().lower()
  if v in ("", "auto"):
    return "auto"
  try:
    return int(v)
  except ValueError:
    return v


def chunk_bounds(m: int, chunks: int) -> tuple:
  """Element ranges ((a, b), ...) of the chunks of a row of m elements.

  min(chunks, m) non-empty ranges covering [0, m) in order, as equal as possible.
  When m >= chunks * CHUNK_ALIGN every boundary is a multiple of CHUNK_ALIGN
  (whole codec blocks; the chunks differ by at most CHUNK_ALIGN elements, the
  last holds the remainder), else the sizes are floor/ceil of m / chunks.
  Python ints: static.
  """
  if m <= 0 or chunks <= 1:
    return ((0, max(m, 0)),)
  if m >= chunks * CHUNK_ALIGN:
    blocks = -(-m // CHUNK_ALIGN)
    cuts = [CHUNK_ALIGN * (k * blocks // chunks) for k in range(chunks)]
  else:
    cuts = [k * m // chunks for k in range(chunks)]
  cuts.append(m)
  return tuple((a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a)


def bits(x):
  """Same-width unsigned view: the wire dtype of the uncompressed path."""
  return lax.bitcast_convert_type(x, dtypes.info(x.dtype).word)


def unbits(u, dtype):
  return lax.bitcast_convert_type(u, dtype)


def _target(name: str, shape, dtype, like, *args, vmap_method=None, **attrs):
  """One result dtype[shape] of the transport FFI target `name` called on args
  (attrs: its attributes), typed varying like `like` (`codec._result_type`)."""
  from zipccl_jax._src import codec as _codec  # pylint: disable=g-import-not-at-top
  _ffi.register()
  out = _codec._result_type(tuple(shape), dtype, like)  # pylint: disable=protected-access
  return jax.ffi.ffi_call(name, out, vmap_method=vmap_method)(*args, **attrs)


def _bitcast(x, dtype, shape):
  """x's bytes as dtype[shape] by XLA ops (bitcast_convert_type and reshapes)."""
  dtype = np.dtype(dtype)
  a, b = x.dtype.itemsize, dtype.itemsize
  if a < b:   # narrower words: the last axis groups b // a of them
    return lax.bitcast_convert_type(x.reshape(shape + (b // a,)), dtype)
  return lax.bitcast_convert_type(x, dtype).reshape(shape)


def copy_as(x, dtype, shape=None):
  """x's bytes as an array dtype[shape] (default: x's shape; the same byte size).

  On CPU backends a custom call ("zipccl_bitcast_copy", ffi/transport_cpu.cc)
  copies the bytes: XLA:CPU compiles a bf16 <-> u16 (or u8) bitcast_convert into a
  copy kernel of its own, one LLVM compile each (the raw rung's two views were two
  of the ladder's kernels). Elsewhere the bitcast_convert_type; same bits.
  """
  shape = tuple(x.shape) if shape is None else tuple(shape)
  dtype = np.dtype(dtype)
  if x.dtype == dtype and tuple(x.shape) == shape:
    return x
  if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != x.size * x.dtype.itemsize:
    raise ValueError(f"copy_as: {dtype}{list(shape)} does not hold the {x.size * x.dtype.itemsize} "
                     f"bytes of {x.dtype}{list(x.shape)}")

  def on_cpu(v):
    return _target("zipccl_bitcast_copy", shape, dtype, v, v, vmap_method="broadcast_all")

  return lax.platform_dependent(x, cpu=on_cpu, default=lambda v: _bitcast(v, dtype, shape))


@jax.custom_batching.custom_vmap
def used_max(st):
  """max(0, st[:, 2]) of an encoder's stats rows s32[R, 4] (used sizes, units of 128 B).

  A custom call on CPU backends ("zipccl_used_max"): the slice and reduction
  would be a kernel of their own for XLA:CPU to compile. Elsewhere jnp.max.

  Under jax.vmap the maximum is taken over the batch as well and is not batched
  (`_used_max_vmap`): every batch member then moves on the same rung, one switch,
  instead of a batched switch index, which JAX turns into running every rung's
  collectives and selecting (and the custom call has no batched form).
  """
  def on_cpu(v):   # "sequential": where JAX batches the call itself (see below)
    return _target("zipccl_used_max", (), jnp.int32, v, v, vmap_method="sequential")

  return lax.platform_dependent(st, cpu=on_cpu, default=lambda v: jnp.max(v[:, 2], initial=0))


@used_max.def_vmap
def _used_max_vmap(axis_size, in_batched, st):
  del axis_size
  if in_batched[0]:   # [B, R, 4] -> [B * R, 4]: the batch's rows are rows like any other
    st = st.reshape(-1, st.shape[-1])
  return used_max(st), False


def rung_index(agreed, rungs):
  """The rung of an agreed used size (int32, units of 128 B): the number of rungs
  (slot sizes in bytes, ascending) too small for it; len(rungs) = the raw rung.

  A custom call on CPU backends ("zipccl_rung_index", the rung sizes an attribute):
  the comparison and sum would be a kernel. Elsewhere jnp ops.
  """
  units = np.asarray([s // _ALIGN for s in rungs], np.int32)
  if units.size == 0:   # no compressed rung: the raw one
    return jnp.sum(agreed > units).astype(jnp.int32)

  def on_cpu(v):
    return _target("zipccl_rung_index", (), jnp.int32, v, v, units=units, vmap_method="sequential")

  return lax.platform_dependent(agreed.astype(jnp.int32), cpu=on_cpu,
                                default=lambda v: jnp.sum(v > units).astype(jnp.int32))


def row_prefix(payload, slot: int):
  """payload[..., :slot], the operand of a rung's collective.

  On CPU backends a custom call ("zipccl_row_prefix", ffi/transport_cpu.cc) makes
  the copy: XLA:CPU compiles every slice into its own kernel, ~15 ms of compile
  time per rung, while a custom call compiles to nothing. Other backends slice
  (a GPU compiles a slice fast; the target's CUDA handler, cuda/transport.cu, only
  keeps programs lowered for CPU and GPU at once compiling). Same bytes either way.
  """
  if slot == payload.shape[-1]:
    return payload

  def on_cpu(p):
    return _target("zipccl_row_prefix", p.shape[:-1] + (slot,), jnp.uint8, p, p,
                   vmap_method="broadcast_all")

  return lax.platform_dependent(payload, cpu=on_cpu, default=lambda p: p[..., :slot])


def a2a_by_permutes() -> bool:
  """Whether an all-to-all ladder traced now runs its rungs as N - 1 permutes
  (`a2a_slot`'s CPU path): the static bookkeeping of the bytes it hands to XLA
  (stats), read from the traced mesh's platform."""
  return _A2A_PERMUTES and compat.mesh_platform() == "cpu"


def _permute_index(axes):
  """(axes in mesh order, index): index[t] is the ppermute index over those axes of
  the peer whose lax.axis_index(axes) is t.

  lax.all_to_all and lax.axis_index over a tuple of axes number the peers in the
  tuple's order; lax.ppermute (jax 0.10) numbers them in mesh order whatever the
  tuple's order (measured: over ("b", "a") of an ("a", "b") mesh a shift by one
  reached the wrong peers). The permutes therefore run over the axes sorted into
  mesh order, where every convention agrees, with the pairs translated.
  """
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  order = compat.mesh_axis_names()
  canon = tuple(sorted(names, key=order.index)) if all(a in order for a in names) else names
  sizes = {a: compat.axis_size((a,)) for a in names}
  index = []
  for t in range(int(np.prod([sizes[a] for a in names], dtype=np.int64))):
    coord = {}
    for a in reversed(names):    # row-major over the tuple's order
      t, coord[a] = divmod(t, sizes[a])
    c = 0
    for a in canon:
      c = c * sizes[a] + coord[a]
    index.append(c)
  return (canon[0] if isinstance(axes, str) else canon), index


def _permute_rows(p, slot: int, axes, me):
  """The CPU all-to-all of p[:, :slot] (p u8[N, L]) as N - 1 collective permutes."""
  from zipccl_jax._src import codec as _codec  # pylint: disable=g-import-not-at-top
  _ffi.register()
  n_peers = p.shape[0]
  piece = _codec._result_type((slot,), jnp.uint8, p)  # pylint: disable=protected-access
  my = lax.axis_index(axes).astype(jnp.int32) if me is None else me
  # Under jax.vmap both custom calls run once per batch member ("sequential"); the
  # permutes between them batch as lax's do.
  pieces = jax.ffi.ffi_call("zipccl_row_split", [piece] * (n_peers - 1), vmap_method="sequential")(p, my)
  canon, index = _permute_index(axes)
  moved = [lax.ppermute(q, canon, [(index[j], index[(j + k) % n_peers]) for j in range(n_peers)])
           for k, q in enumerate(pieces, 1)]
  return _target("zipccl_row_join", (n_peers, slot), jnp.uint8, p, p, my, *moved,
                 vmap_method="sequential")


def a2a_slot(payload, slot: int, axes, me=None):
  """lax.all_to_all(payload[:, :slot], axes, 0, 0, tiled=True) for payload u8[N, L].

  On CPU backends the all-to-all is N - 1 collective permutes: shift k = 1..N-1
  moves, from every device j, its row for peer (j + k) mod N. One custom call
  ("zipccl_row_split", ffi/transport_cpu.cc) cuts the N - 1 slot-sized rows to
  send, one ("zipccl_row_join") puts the received rows and the own row (the
  payload's, never sent) back in peer order: the same bytes as the all-to-all.
  Why: XLA:CPU compiles an array all-to-all into a tuple all-to-all of N per-peer
  slice kernels and a concatenate, ~10 kernels per ladder rung, while custom calls
  and collective permutes compile to no kernel (docs/design.md, "Transport"). Other
  backends (a GPU's NCCL all-to-all) keep lax.all_to_all; the targets' CUDA
  handlers only keep programs lowered for CPU and GPU at once compiling.

  me: lax.axis_index(axes) as int32, computed once outside a ladder's switch (in
  a branch it is one more kernel per rung).
  """
  n_peers = payload.shape[0]

  def default(p):
    return lax.all_to_all(p[:, :slot], axes, 0, 0, tiled=True)

  if n_peers < 2 or not _A2A_PERMUTES:
    return default(payload)
  return lax.platform_dependent(payload, cpu=lambda p: _permute_rows(p, slot, axes, me),
                                default=default)


def a2a_raw(rows, axes, me=None):
  """unbits(lax.all_to_all(bits(rows), axes, 0, 0, tiled=True)) for rows[N, m] of a
  float dtype: an all-to-all ladder's raw rung, on CPU as the same N - 1 permutes
  as its compressed rungs (`a2a_slot` on the rows' bytes, which `copy_as` views
  as u8 and back: no kernel).

  Why the raw rung too: XLA:CPU's collective-permute rendezvous spans every device
  named in its source-target pairs, the other groups of a transport over one axis
  of a larger mesh included, while an all-to-all's spans its own group. Groups
  that agree on different rungs of one switch must therefore issue the same
  collectives in the same order (docs/design.md, "Transport"): here N - 1
  permutes with the same pairs on every rung.
  """
  n_peers, m = rows.shape

  def default(r):
    return unbits(lax.all_to_all(bits(r), axes, 0, 0, tiled=True), r.dtype)

  if n_peers < 2 or not _A2A_PERMUTES:
    return default(rows)

  def on_cpu(r):
    nbytes = m * r.dtype.itemsize
    b = copy_as(r, jnp.uint8, (n_peers, nbytes))
    return copy_as(_permute_rows(b, nbytes, axes, me), r.dtype, (n_peers, m))

  return lax.platform_dependent(rows, cpu=on_cpu, default=default)


def _agree(used, count, axes, want_stats):
  """The largest used size (units of 128 B) over the participants, and the summed count.

  Without stats: one pmax of an int32 (4 bytes). With stats: one all-gather of
  (used, count) (8 bytes), reduced locally, so stats cost no extra collective here.
  """
  if want_stats:
    both = compat.all_gather_invariant(jnp.stack([used, count]).astype(jnp.int32), axes)
    return jnp.max(both[:, 0]), jnp.sum(both[:, 1]), 8
  return lax.pmax(used.astype(jnp.int32), axes), jnp.int32(0), 4


def _raise_decode_error(where, word, bad, worst):
  """Host side of check_decode: zero of the wire word dtype, or raises.

  A pure_callback (not a debug callback) on purpose: its error fails this call's
  results, which the caller sees at block_until_ready, and nothing else. A failing
  jax.debug.callback stays in JAX's runtime tokens and re-raises at every later
  effects barrier and at interpreter exit.
  """
  if int(bad):
    from zipccl_jax._src import codec as _codec  # pylint: disable=g-import-not-at-top
    raise RuntimeError(
        f"zipccl_jax: {int(bad)} received row(s) of {where} failed to decode (status "
        f"{int(worst)}: {_codec.decode_error_message(int(worst))}); they hold NaN "
        "(all-one bits). The payload was corrupted in transit.")
  return np.zeros((), word)


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
  agreed, count_total, agree_bytes = _agree(used, count, axes, want_stats)
  rung = rung_index(agreed, plan.rungs)       # the first rung >= agreed size

  def zeros_status(like):
    # typed varying over exactly the axes the received rows vary over
    return compat.pvary(jnp.zeros(like.shape[:1], jnp.int32), tuple(compat.varying_axes(like)))

  def compressed(slot):
    received = move_slot(payload, slot) if move_slot else move(prefix(payload, slot))
    if own is not None:
      return codec.decode_rows(received, m, dtype, skip=own[1], fill=own[2])
    return codec.decode_rows(received, m, dtype)

  def raw():
    if move_raw is not None:
      y = move_raw(rows)
    else:
      word = dtypes.info(dtype).word
      y = copy_as(move(copy_as(rows, word)), dtype)
    return y, zeros_status(y)

  y, status = compat.switch_in_range(rung, [functools.partial(compressed, s) for s in plan.rungs] + [raw])
  if recvs is not None:   # nobody sends to this device: lax gives zeros
    y = unbits(jnp.where(recvs, bits(y), 0), dtype)
    status = jnp.where(recvs, status, 0)
  bad = jnp.sum(status != 0).astype(jnp.int32)
  if check:
    # y ^ zero: the results depend on the check (zero comes from the host at run
    # time, so XLA cannot fold it away) and fail with its error; one pass over y.
    word = dtypes.info(dtype).word
    zero = jax.pure_callback(functools.partial(_raise_decode_error, where, word),
                             jax.ShapeDtypeStruct((), word), bad, jnp.max(status),
                             vmap_method="sequential")
    y = unbits(bits(y) ^ zero, dtype)
  errors = jnp.int32(0)
  if want_stats:
    errors = lax.psum(bad, axes)
    agree_bytes += 4
  return y, (rung, agreed, count_total, errors, agree_bytes)


def skips_own_row(codec) -> bool:
  """Whether transports leave the own row uncoded with this codec (its SKIP_ROWS)."""
  return _SKIP_OWN_ROW and bool(getattr(codec, "SKIP_ROWS", False))


def _part(plan, info, rows_sent: int, elements: int) -> stats.Part:
  """stats.Part of a ladder transport that sends rows_sent rows per device."""
  rung, agreed, count, errors, agree_bytes = info
  slots = tuple(rows_sent * s for s in plan.rungs) + (rows_sent * plan.raw_row,)
  sizes = tuple(plan.rungs) + (plan.raw_row,)
  return stats.Part(rung, agreed, count, errors, slots, sizes, agree_bytes,
                    rows_sent * plan.raw_row, elements, True)


def _chunked(rows, plan, run):
  """Runs run(rows[:, a:b], chunk_plan, after) -> (y, part) for every chunk of the
  plan (after: the previous compressed chunk's rung, None for the first) and
  concatenates the received chunks along the row: (y[R', m], parts).

  The chunks are transports in program order: chunk k+1's encode depends on
  nothing of chunk k, so a scheduler that overlaps independent ops may run it
  during chunk k's collective; only its agreement waits for chunk k's (`_ladder`'s
  `after`), which keeps the agreements apart (docs/design.md, "Overlap").
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
    y, info = _ladder(r, p, axes, want_stats, check, move=None, move_raw=lambda w: a2a_raw(w, axes, me),
                      where="an all_to_all", after=after,
                      move_slot=lambda a, slot: a2a_slot(a, slot, axes, me), own=(mine, mine, r))
    # elements the count covers: every participant's rows, less their own ones
    coded = n_peers - 1 if skips_own_row(p.codec) else n_peers
    # rows handed to XLA per rung: on CPU the own row stays here (permutes)
    sent = n_peers - 1 if n_peers > 1 and a2a_by_permutes() else n_peers
    return y, _part(p, info, sent, n_peers * coded * p.m)

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
    return y, _part(p, info, 1, n_peers * p.m)

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
    return y, _part(p, info, 1, len(perm) * p.m)

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
