"""Planned collectives over many leaves in one transport: segmented rows (ffi/segments.h).

Under `zipccl_jax.jit` every compressed leaf is a call site with a static slot, so
the leaves of one pytree call that travel alone (`bucket_bytes=0`, or leaves larger
than a bucket) need not move one by one: their rows are packed side by side, every
leaf a *segment* coded as the rows it would be alone (its own row header, slot and
call site, the same bytes per leaf), and ONE collective per phase moves them all,
as XLA's combiner does for lax's many psums. Why: XLA:CPU's compile time grows
faster than linearly with a program's ops (1,600 custom calls compiled in 1.4 s,
400 in 0.16 s), and leaf by leaf a 200-leaf psum holds ~900 custom calls and
~1,200 collective permutes; segmented it holds ~10 custom calls and N collectives.

Where: a pytree psum, psum_scatter, all_to_all or all_gather under
`zipccl_jax.jit` (for ppermute, whose partial permutations mask senders and
receivers per leaf, and outside `zipccl_jax.jit` every leaf keeps its own
transport). The segment targets have CPU handlers; other platforms code each
segment with the codec's own row custom call and XLA slices and concatenates
(`encode_xla`, `decode_xla`: the same bytes), still one collective per phase.
The platform is the traced mesh's (compat.platform_dependent): a planned program
traced on a CPU mesh is a CPU program. Leaves are grouped per (dtype, codec); the leaves a plan
moves raw form a group of their own (raw segments, no call site). A group's sites
are numbered consecutively, so one mailbox record (`planned_sites.ELEMENTWISE`)
writes every site's used size and decoder status.

A segment's slot attribute: the planned slot (bytes), 0 (moved raw: planned RAW,
or a group that never compresses) or -1 (the measuring program: moved raw, its
used size measured).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import compat
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src import plan as plan_lib
from zipccl_jax._src import planned_sites
from zipccl_jax._src import stats as stats_lib
from zipccl_jax._src import row_ops
from zipccl_jax._src import transport
from zipccl_jax._src.codecs import base
from zipccl_jax._src.codecs import entropy
from zipccl_jax._src.codecs import window

ENCODE_TARGET = "zipccl_segments_encode"
DECODE_TARGET = "zipccl_segments_decode"
# The codec modules the targets code, by their row header's codec id (docs/format.md):
# a registered codec whose module is one of these codes the same bytes.
CODECS = {window.CODEC_ID: window, entropy.CODEC_ID: entropy}
CODEC_IDS = {m.__name__: i for i, m in CODECS.items()}
MEASURE = -1            # a segment's slot in the measuring program


def available() -> bool:
  """Whether a call traced now uses segmented transports: under `zipccl_jax.jit`."""
  return planned_sites.active() is not None


def pack(xs):
  """The rows xs[k] [..., w_k] side by side -> [..., sum w_k] ("zipccl_row_pack": bytes,
  no NaN canonicalised, no kernel)."""
  x0 = xs[0]
  if len(xs) == 1:
    return x0
  shape = x0.shape[:-1] + (sum(int(x.shape[-1]) for x in xs),)
  return base.call_target("zipccl_row_pack", shape, x0.dtype, x0, *xs, vmap_method="broadcast_all")


def _attrs(codec_id: int, widths, slots) -> dict:
  return dict(codec=np.int64(codec_id), widths=np.asarray(widths, np.int64),
              slots=np.asarray(slots, np.int64))


def wire_width(widths, slots, itemsize: int) -> int:
  """Bytes of one wire row: a slot per coded segment, the raw words of the others."""
  return sum(s if s > 0 else w * itemsize for w, s in zip(widths, slots))


def _bounds(widths):
  offs = np.concatenate([[0], np.cumsum(widths)]).astype(int).tolist()
  return list(zip(offs[:-1], offs[1:]))


def encode_target(x, codec_id: int, widths, slots, skip):
  """x [R, M] -> (payload u8[R, S], used s32[L]) by "zipccl_segments_encode" (CPU)."""
  _ffi.register()
  out = (base.result_type((x.shape[0], wire_width(widths, slots, x.dtype.itemsize)), jnp.uint8, x),
         base.result_type((len(widths),), jnp.int32, x))
  return jax.ffi.ffi_call(ENCODE_TARGET, out, vmap_method="sequential")(x, skip, **_attrs(codec_id, widths, slots))


def decode_target(payload, codec_id: int, widths, slots, dtype, skip, fill):
  """payload u8[R, S] -> (y [R, M], status s32[L]) by "zipccl_segments_decode" (CPU)."""
  _ffi.register()
  out = (base.result_type((payload.shape[0], sum(widths)), dtype, payload),
         base.result_type((len(widths),), jnp.int32, payload))
  return jax.ffi.ffi_call(DECODE_TARGET, out, vmap_method="sequential")(
      payload, skip, fill, **_attrs(codec_id, widths, slots))


def encode(x, codec_id: int, widths, slots, skip):
  """x [R, M] -> (payload u8[R, S], used s32[L]) (ffi/segments.h): the target on CPU
  backends, `encode_xla` elsewhere."""
  return compat.platform_dependent(x, skip, cpu=lambda v, k: encode_target(v, codec_id, widths, slots, k),
                                   default=lambda v, k: encode_xla(v, codec_id, widths, slots, k))


def decode(payload, codec_id: int, widths, slots, dtype, skip, fill):
  """payload u8[R, S] -> (y [R, M], status s32[L]) (ffi/segments.h): the target on CPU
  backends, `decode_xla` elsewhere."""
  return compat.platform_dependent(
      payload, skip, fill, cpu=lambda p, k, f: decode_target(p, codec_id, widths, slots, dtype, k, f),
      default=lambda p, k, f: decode_xla(p, codec_id, widths, slots, dtype, k, f))


def encode_xla(x, codec_id: int, widths, slots, skip):
  """`encode` by the codec's row custom call on each segment, XLA slices and one
  concatenate: the same bytes (skipped rows aside, unspecified in both), for the
  platforms the segment targets have no handler on (a GPU compiles slices fast)."""
  codec = CODECS[codec_id]
  rows = x.shape[0]
  pieces, used = [], []
  for (a, b), s in zip(_bounds(widths), slots):
    seg = x[:, a:b]
    u = jnp.int32(0)
    if s != 0:
      payload, st = codec.encode_rows(seg, skip=skip)
      u = jnp.max(jnp.where(skip == 0, st[:, row_ops.USED_COLUMN], 0), initial=0)
    pieces.append(payload[:, :s] if s > 0 else row_ops.copy_as(seg, jnp.uint8, (rows, (b - a) * x.dtype.itemsize)))
    used.append(u)
  # typed varying as the target's results are (the branches' types must match)
  return jnp.concatenate(pieces, axis=1), compat.pvary(jnp.stack(used), tuple(compat.varying_axes(x)))


def decode_xla(payload, codec_id: int, widths, slots, dtype, skip, fill):
  """`decode` as `encode_xla` does `encode`: the same results."""
  codec = CODECS[codec_id]
  rows, item = payload.shape[0], np.dtype(dtype).itemsize
  ys, status, off = [], [], 0
  for (a, b), s in zip(_bounds(widths), slots):
    n = s if s > 0 else (b - a) * item
    wire, f = payload[:, off:off + n], fill[:, a:b]
    off += n
    if s > 0:
      y, st = codec.decode_rows(wire, b - a, dtype, skip=skip, fill=f)
      status.append(jnp.max(st))
    else:   # raw words, of every row (no fill: ffi/segments.h)
      y = row_ops.copy_as(wire, dtype, (rows, b - a))
      status.append(jnp.int32(0))
    ys.append(row_ops.bits(y))
  return (row_ops.unbits(jnp.concatenate(ys, axis=1), dtype),
          compat.pvary(jnp.stack(status), tuple(compat.varying_axes(payload))))


def _register(trace, plans, where: str, rows: int, n_peers: int, check: bool):
  """The group's call sites: (the first site to record at, None: nothing to record;
  the segments' slot attributes)."""
  if not plans[0].compress:
    return None, [0] * len(plans)
  first, slots = None, []
  for p in plans:
    signature = planned_sites.signature(where, p, (rows, p.m), check, n_peers)
    k, slot = planned_sites.site(trace, signature, p.rungs, p.raw_row)
    first = k if first is None else first
    slots.append(MEASURE if slot is None else 0 if slot == planned_sites.RAW else slot)
  # Sites all planned raw record nothing, as a raw site alone does: a program of raw
  # sites is not validated, and its records would stay in the table.
  return (first if any(slots) else None), slots


def _part(plan, slot: int, rows_sent: int, elements: int):
  """The stats part of a segment (its rung is static, as a planned site's)."""
  if not plan.compress:
    return stats_lib.plain_part(rows_sent * plan.raw_row, plan.raw_row)
  info = transport.planned_info(slot if slot > 0 else None)
  return transport.stats_part(plan, info, rows_sent, elements)


def _record(got, used, status, first):
  if first is None:
    return got
  trace = planned_sites.active()
  return planned_sites.record(got, [used, status], trace.ledger, 2 * first, planned_sites.ELEMENTWISE)


def _codec_id(plans) -> int:
  # a raw group's segments are all copied: any codec that takes the dtype (window)
  return CODEC_IDS[plans[0].codec.module] if plans[0].compress else window.CODEC_ID


def _a2a_phase(x, plans, cfg):
  """The all-to-all of x [N, M] (row j for peer j, a segment per leaf): the received
  rows [N, M] (row i from peer i) and the segments' slots. The own row is neither
  coded nor sent: the decoder copies it from x."""
  n_peers, axes = cfg.n_peers, cfg.axes
  ms = [p.m for p in plans]
  me = lax.axis_index(axes).astype(jnp.int32)
  mine = (jnp.arange(n_peers) == me).astype(jnp.uint8)
  first, slots = _register(planned_sites.active(), plans, "an all_to_all", n_peers, n_peers,
                            cfg.opts.check_decode)
  payload, used = encode(x, _codec_id(plans), ms, slots, mine)
  moved = row_ops.a2a_slot(payload, payload.shape[1], axes, me)
  got, status = decode(moved, _codec_id(plans), ms, slots, x.dtype, mine, x)
  return _record(got, used, status, first), slots


def _gather_phase(row, plans, cfg):
  """The all-gather of row [1, M] (a segment per leaf): [N, M] typed invariant, row i
  from peer i (the own row copied, not decoded), and the segments' slots."""
  ms = [p.m for p in plans]
  first, slots = _register(planned_sites.active(), plans, "an all_gather", 1, cfg.n_peers,
                            cfg.opts.check_decode)
  payload, used = encode(row, _codec_id(plans), ms, slots, jnp.zeros((1,), jnp.uint8))
  moved = compat.all_gather_invariant(payload[0], cfg.axes)
  mine = (jnp.arange(cfg.n_peers) == lax.axis_index(cfg.axes)).astype(jnp.uint8)
  got, status = decode(moved, _codec_id(plans), ms, slots, row.dtype, mine, row)
  return _record(got, used, status, first), slots


def _a2a_parts(plans, slots, cfg):
  n = cfg.n_peers
  return [_part(p, s, row_ops.a2a_rows_sent(n), n * (n - 1) * p.m) for p, s in zip(plans, slots)]


def _gather_parts(plans, slots, cfg):
  return [_part(p, s, 1, cfg.n_peers * p.m) for p, s in zip(plans, slots)]


def _split(y, plans):
  """y [..., M] cut into the segments' [..., m_i]."""
  return row_ops.unpack(y, [p.m for p in plans]) if len(plans) > 1 else (y,)


def _stats(cfg, name, plans, *parts):
  if not cfg.stats:
    return [None] * len(plans)
  return [stats_lib.make_stats(name, p.name, tuple(ps)) for p, *ps in zip(plans, *parts)]


# Each collective, for one group: (rows of its leaves, plans, cfg) -> (results, stats).
# Rows and results are the buckets' (buckets.Item): psum and all_gather flat [n_i]
# -> [n_i] and [N, n_i]; psum_scatter and all_to_all [N, m_i] -> [m_i] and [N, m_i].


def _psum(flats, plans, cfg):
  n_peers = cfg.n_peers
  rows = [jnp.pad(f, (0, n_peers * p.m - f.size)).reshape(n_peers, p.m) if n_peers * p.m != f.size
          else f.reshape(n_peers, p.m) for f, p in zip(flats, plans)]
  got, s1 = _a2a_phase(pack(rows), plans, cfg)
  gplans = [plan_lib.with_ladder(p, p.chunks, all_to_all=False) if p.compress else p for p in plans]
  got, s2 = _gather_phase(transport.ordered_sum(got, flats[0].dtype)[None], gplans, cfg)
  ys = [y.reshape(-1)[:f.size] if y.size != f.size else y.reshape(-1)
        for y, f in zip(_split(got, plans), flats)]
  return ys, _stats(cfg, "psum", plans, _a2a_parts(plans, s1, cfg), _gather_parts(gplans, s2, cfg))


def _psum_scatter(rows, plans, cfg):
  got, s1 = _a2a_phase(pack(rows), plans, cfg)
  ys = _split(transport.ordered_sum(got, rows[0].dtype), plans)
  return list(ys), _stats(cfg, "psum_scatter", plans, _a2a_parts(plans, s1, cfg))


def _all_to_all(rows, plans, cfg):
  got, s1 = _a2a_phase(pack(rows), plans, cfg)
  return list(_split(got, plans)), _stats(cfg, "all_to_all", plans, _a2a_parts(plans, s1, cfg))


def _all_gather(flats, plans, cfg):
  got, s1 = _gather_phase(pack([f[None] for f in flats]), plans, cfg)
  ys = [compat.pvary(y, cfg.axes) if cfg.to == "varying" else y for y in _split(got, plans)]
  return ys, _stats(cfg, "all_gather", plans, _gather_parts(plans, s1, cfg))


# kind -> (the group's function, the planner's collective name, all_to_all ladder)
_KINDS = {"psum": (_psum, "psum", True), "psum_scatter": (_psum_scatter, "psum_scatter", True),
          "all_to_all": (_all_to_all, "all_to_all", True), "all_gather": (_all_gather, "all_gather", False)}


def _plan(kind: str, row, cfg):
  """The plan of a leaf's rows, and whether the targets can move it (no chunks, a
  codec they code)."""
  _, collective, a2a = _KINDS[kind]
  m = -(-row.size // cfg.n_peers) if kind == "psum" else row.shape[-1]
  p = plan_lib.plan(cfg.fn, row.dtype, m, cfg.opts, collective=collective, n_peers=cfg.n_peers,
                    all_to_all=a2a)
  return p, not p.parts and (not p.compress or p.codec.module in CODEC_IDS)


def group(kind: str, rows, cfg):
  """The segmented collective `kind` of leaves' rows, the forward pass of its
  autodiff twin: one transport (set) per (dtype, codec); a leaf the targets cannot
  code (a transposed call planned otherwise than its forward) moves raw words.
  Returns (results, stats) per leaf."""
  fun = _KINDS[kind][0]
  plans = [p if ok else p._replace(compress=False) for p, ok in (_plan(kind, r, cfg) for r in rows)]
  groups = {}
  for i, (r, p) in enumerate(zip(rows, plans)):
    groups.setdefault((np.dtype(r.dtype).name, p.codec.name if p.compress else None), []).append(i)
  ys, sts = [None] * len(rows), [None] * len(rows)
  for members in groups.values():
    got, st = fun([rows[i] for i in members], [plans[i] for i in members], cfg)
    for i, y, t in zip(members, got, st):
      ys[i], sts[i] = y, t
  return ys, sts


def run(kind: str, rows, cfg, twin):
  """The rows of leaves (buckets.Item's) that the targets can move, moved by
  twin(tuple of rows, cfg) -> (results, stats) (the differentiable `group`).
  Returns (result, stats) per leaf, None for a leaf left to its own transport (a
  chunked plan, or a codec the targets do not code)."""
  take = [i for i, r in enumerate(rows) if _plan(kind, r, cfg)[1]]
  outs = [None] * len(rows)
  if take:
    ys, sts = twin(tuple(rows[i] for i in take), cfg)
    for i, y, st in zip(take, ys, sts):
      outs[i] = (y, st)
  return outs
