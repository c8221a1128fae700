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

Where: a pytree psum under `zipccl_jax.jit` on a mesh whose devices are CPUs (the
targets have CPU handlers only; elsewhere and outside `zipccl_jax.jit` every leaf
keeps its own transport). Leaves are grouped per (dtype, codec); the leaves a plan
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
from zipccl_jax._src import transport
from zipccl_jax._src.codecs import base

ENCODE_TARGET = "zipccl_segments_encode"
DECODE_TARGET = "zipccl_segments_decode"
CODEC_IDS = (1, 2)      # the codecs the targets code (window, entropy; docs/format.md)
MEASURE = -1            # a segment's slot in the measuring program


def available() -> bool:
  """Whether a call traced now may use segmented transports: under `zipccl_jax.jit`
  on a mesh whose devices are known to be CPUs."""
  if planned_sites.active() is None:
    return False
  try:
    dev = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
  except (AttributeError, ValueError):  # pragma: no cover - older / future JAX
    return False
  return str(getattr(dev, "platform", "") or "").lower() == "cpu"


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


def encode(x, codec_id: int, widths, slots, skip):
  """x [R, M] -> (payload u8[R, S], used s32[L]) (ffi/segments.h)."""
  _ffi.register()
  rows = x.shape[0]
  out = (base.result_type((rows, wire_width(widths, slots, x.dtype.itemsize)), jnp.uint8, x),
         base.result_type((len(widths),), jnp.int32, x))
  return jax.ffi.ffi_call(ENCODE_TARGET, out, vmap_method="sequential")(
      x, skip, **_attrs(codec_id, widths, slots))


def decode(payload, codec_id: int, widths, slots, dtype, skip, fill):
  """payload u8[R, S] -> (y [R, M], status s32[L]) (ffi/segments.h)."""
  _ffi.register()
  rows = payload.shape[0]
  out = (base.result_type((rows, sum(widths)), dtype, payload),
         base.result_type((len(widths),), jnp.int32, payload))
  return jax.ffi.ffi_call(DECODE_TARGET, out, vmap_method="sequential")(
      payload, skip, fill, **_attrs(codec_id, widths, slots))


def _register(trace, plans, where: str, rows: int, check: bool):
  """The group's call sites: (the first site to record at, None: nothing to record;
  the segments' slot attributes)."""
  if not plans[0].compress:
    return None, [0] * len(plans)
  first, slots = None, []
  for p in plans:
    signature = (where, p.codec.name, np.dtype(p.dtype).name, (rows, p.m), tuple(p.chunk), bool(check))
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
  rung = plan.rungs.index(slot) if slot > 0 else len(plan.rungs)
  return transport._part(plan, (jnp.int32(rung), jnp.int32(-1), jnp.int32(-1), None, 0), rows_sent,
                         elements)


def _psum_group(flats, plans, cfg):
  """psum of the flat leaves flats[i] [n_i], one group: (results, stats per leaf)."""
  trace = planned_sites.active()
  n_peers, axes = cfg.n_peers, cfg.axes
  check = cfg.opts.check_decode
  ms = [p.m for p in plans]
  dtype = flats[0].dtype
  rows = [jnp.pad(f, (0, n_peers * m - f.size)).reshape(n_peers, m) if n_peers * m != f.size
          else f.reshape(n_peers, m) for f, m in zip(flats, ms)]
  x = pack(rows)                                       # [N, M]: leaf i's row j in segment i
  cid = plans[0].codec.CODEC_ID if plans[0].compress else CODEC_IDS[0]
  me = lax.axis_index(axes).astype(jnp.int32)
  mine = (jnp.arange(n_peers) == me).astype(jnp.uint8)
  # the reduce-scatter: every leaf's row j goes to peer j; the own row stays here
  gplans = [plan_lib.with_ladder(p, p.chunks, all_to_all=False) if p.compress else p for p in plans]
  k1, s1 = _register(trace, plans, "an all_to_all", n_peers, check)
  payload, used = encode(x, cid, ms, s1, mine)
  moved = transport.a2a_slot(payload, payload.shape[1], axes, me)
  got, status = decode(moved, cid, ms, s1, dtype, mine, x)
  if k1 is not None:
    got = planned_sites.record(got, [used, status], trace.ledger, 2 * k1, planned_sites.ELEMENTWISE)
  mine_sum = transport.ordered_sum(got, dtype)[None]   # [1, M]: this device's sums
  # the all-gather of the sums
  k2, s2 = _register(trace, gplans, "an all_gather", 1, check)
  payload, used = encode(mine_sum, cid, ms, s2, jnp.zeros((1,), jnp.uint8))
  moved = compat.all_gather_invariant(payload[0], axes)
  got, status = decode(moved, cid, ms, s2, dtype, mine, mine_sum)
  if k2 is not None:
    got = planned_sites.record(got, [used, status], trace.ledger, 2 * k2, planned_sites.ELEMENTWISE)
  pieces = transport.unpack(got, ms) if len(ms) > 1 else (got,)
  ys = [p.reshape(-1)[:f.size] if p.size != f.size else p.reshape(-1) for p, f in zip(pieces, flats)]
  sts = [None] * len(flats)
  if cfg.stats:
    sent = n_peers - 1 if n_peers > 1 and transport.a2a_by_permutes() else n_peers
    sts = [stats_lib.make_stats("psum", p.name, (_part(p, a, sent, n_peers * (n_peers - 1) * p.m),
                                                 _part(g, b, 1, n_peers * g.m)))
           for p, g, a, b in zip(plans, gplans, s1, s2)]
  return ys, sts


def _psum_plan(flat, cfg):
  return plan_lib.plan(cfg.fn, flat.dtype, -(-flat.size // cfg.n_peers), cfg.opts, collective="psum",
                       n_peers=cfg.n_peers, all_to_all=True)


def psum_group(flats, cfg):
  """The segmented psum of one group's flat leaves (`run`'s groups), the forward
  pass of `autodiff.spsum`: (results, stats per leaf)."""
  return _psum_group(flats, [_psum_plan(f, cfg) for f in flats], cfg)


def run(rows, cfg, collective):
  """The leaves rows[i] (flat [n_i]) moved by segmented transports, grouped per
  (dtype, codec): collective(tuple of a group's rows, cfg) -> (results, stats).
  Returns (result, stats) per leaf, None for a leaf left to its own transport (a
  chunked plan, or a codec the targets do not code)."""
  groups = {}
  for i, r in enumerate(rows):
    p = _psum_plan(r, cfg)
    if p.parts or (p.compress and p.codec.CODEC_ID not in CODEC_IDS):
      continue
    groups.setdefault((np.dtype(r.dtype).name, p.codec.name if p.compress else None), []).append(i)
  outs = [None] * len(rows)
  for members in groups.values():
    ys, sts = collective(tuple(rows[i] for i in members), cfg)
    for i, y, st in zip(members, ys, sts):
      outs[i] = (y, st)
  return outs
