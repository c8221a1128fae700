"""`CollectiveStats`: what compression did in one collective call (opt-in, `stats=True`).

Sizes are static Python ints (exact at any size); the arrays hold only small
per-call facts (the rung each transport took, counts). Byte totals are derived
from both: exactly on the host (eager), as int32 under tracing.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src.codecs import registry

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CollectiveStats:
  """What compression did in one call (returned when the call gets `stats=True`).

  A call runs one or two *transports* (psum: a reduce-scatter, then an
  all-gather), each in C chunks with `chunks=C` (one transport entry per chunk,
  in order: T = C, or 2C for psum). Each transport encodes its rows, agrees with
  its peers on the largest used size and moves one slot size of a static ladder
  (the *rung*); the top rung moves the raw words (docs/design.md, "Transport: the slot
  ladder"). Byte totals add up over all of them.

  The array fields are identical on every participant (typed invariant over
  `axis_name`), so they can leave shard_map with `out_specs=P()` when the input
  varies over no other axis.

  Attributes:
    rung: int32[T], the rung each transport took (T = len(slots)); slots[t][-1]
      is the raw rung.
    used_units: int32[T], the largest used size of an encoded row among the
      participants, in units of 128 bytes (0 when not compressed).
    escape_count: int32[], the codec's count (window codec: escaped exponents) in
      all rows encoded for this call, summed over all participants.
    decode_errors: int32[], with `check_decode` on: received rows whose decoder
      status was not 0, summed over all participants (a failure also raises, so a
      call that returns reports 0). -1 without `check_decode`: not counted, since
      a count over the participants is one more collective, and stats must not
      change the program. Rows that fail to decode hold NaN (all-one bits).
    collective: static, "all_gather", "psum_scatter", "psum", "all_to_all" or
      "ppermute".
    codec: static, the codec name, "raw" or None (plain lax).
    compressed: static, the compressed ladder was tried (codec and policy).
    raw_bytes: static, operand bytes of the uncompressed path for this device (of
      a compressed call: its raw rungs'; on CPU an all-to-all transport's rungs,
      the raw one included, hand N - 1 rows to XLA, the own row staying on the
      device, elsewhere N).
    elements: static, elements encoded for this call over all participants.
    slots: static, per transport the bytes this device hands to XLA on each rung
      (the last entry is the raw rung).
    slot_sizes: static, per transport the row slot of each rung (bytes per row).
      Under `zipccl_jax.jit` a transport's ladder is its planned slot (rung 0), then
      the raw row; a site that moves raw words (or measures) has the raw row alone.
    agree_bytes: static, bytes of the tiny agreement collectives of this call.
  """
  rung: jax.Array
  used_units: jax.Array
  escape_count: jax.Array
  decode_errors: jax.Array
  collective: str = dataclasses.field(metadata=dict(static=True), default="")
  codec: Any = dataclasses.field(metadata=dict(static=True), default=None)
  compressed: bool = dataclasses.field(metadata=dict(static=True), default=False)
  raw_bytes: int = dataclasses.field(metadata=dict(static=True), default=0)
  elements: int = dataclasses.field(metadata=dict(static=True), default=0)
  slots: tuple = dataclasses.field(metadata=dict(static=True), default=())
  slot_sizes: tuple = dataclasses.field(metadata=dict(static=True), default=())
  agree_bytes: int = dataclasses.field(metadata=dict(static=True), default=0)

  @property
  def raw_rung(self) -> jax.Array:
    """bool[]: some transport of the call moved raw words (its data did not fit a
    compressed rung, or the call was not compressed)."""
    top = np.asarray([len(s) - 1 for s in self.slots], np.int32)
    if _concrete(self.rung):
      return np.any(_host(self.rung) >= top, axis=-1)
    return jnp.any(self.rung >= top, axis=-1)

  @property
  def fell_back(self) -> jax.Array:
    """Same as `raw_rung` for a compressed call (the name of the fixed-slot days)."""
    if not self.compressed:
      return np.zeros(np.shape(self.rung)[:-1], bool) if _concrete(self.rung) else \
          jnp.zeros(jnp.shape(self.rung)[:-1], bool)
    return self.raw_rung

  @property
  def wire_bytes(self):
    """Bytes this device handed to XLA collectives on the rungs taken (the operand
    bytes, the measure of `hlo_wire_bytes`), agreement included.

    Exact (numpy int64) when the stats are concrete; int32 under tracing.
    """
    return _lookup(self.slots, self.rung) + self.agree_bytes

  @property
  def slot_bytes(self):
    """Per transport, the row slot taken (bytes); the raw row size on the raw rung."""
    return _per_transport(self.slot_sizes, self.rung)

  @property
  def used_bytes(self):
    """Per transport, the largest used size among the participants (bytes)."""
    if _concrete(self.used_units):
      return _host(self.used_units).astype(np.int64) * 128
    return self.used_units * 128

  @property
  def ratio(self):
    """raw_bytes / wire_bytes: > 1 is a saving."""
    wire = self.wire_bytes
    if isinstance(wire, np.ndarray) or np.isscalar(wire):
      return np.float64(self.raw_bytes) / np.maximum(wire, 1)
    return jnp.float32(self.raw_bytes) / jnp.maximum(wire, 1).astype(jnp.float32)

  @property
  def escape_rate(self):
    """Fraction of encoded elements whose exponent escaped its block window."""
    return self.escape_count.astype(jnp.float32) / np.float32(max(self.elements, 1))

  def summary(self) -> str:
    """One line for logs (eager: reads the values back to the host)."""
    rung = _host(self.rung)
    return (f"{self.collective} codec={self.codec} compressed={self.compressed} "
            f"rung={rung.reshape(-1, rung.shape[-1])[0].tolist()} "
            f"raw_rung={bool(np.any(self.raw_rung))} "
            f"wire={int(np.max(self.wire_bytes))}B raw={self.raw_bytes}B "
            f"ratio={float(np.min(self.ratio)):.3f} "
            f"{self._count_text()} "
            f"decode_errors={int(np.max(_host(self.decode_errors)))}")

  def _count_text(self) -> str:
    """The codec's count as a rate, named by the codec module's COUNT_NAME and
    COUNT_UNIT (window codec: escape_rate, escaped exponents per element; entropy
    codec: raw_block_rate, blocks stored raw per block)."""
    impl = registry.get(self.codec).impl if self.codec in registry.names() else None
    name, unit = getattr(impl, "COUNT_NAME", "count"), getattr(impl, "COUNT_UNIT", 1)
    count = int(np.max(_host(self.escape_count)))
    return f"{name}_rate={count * unit / max(self.elements, 1):.4f}"


def _concrete(a) -> bool:
  return not isinstance(a, jax.core.Tracer)


def _host(a) -> np.ndarray:
  """A concrete stats array on the host. In a multi-process run a global array is not
  fully addressable: its fields are identical on every participant, so this
  process's first shard is the value."""
  if isinstance(a, jax.Array) and not a.is_fully_addressable:
    a = a.addressable_data(0)
  return np.asarray(a)


def _per_transport(tables, rung):
  """table[t][rung[t]] for every transport t (rung may have leading batch dims)."""
  if _concrete(rung):
    r = _host(rung)
    # (a rung past the table: the plan-mismatch branch, which moved nothing)
    return np.stack([np.append(np.asarray(tab, np.int64), 0)[np.minimum(r[..., t], len(tab))]
                     for t, tab in enumerate(tables)], axis=-1)
  return jnp.stack([jnp.asarray(np.asarray(tab, np.int64).clip(max=2**31 - 1), jnp.int32)[
      rung[..., t]] for t, tab in enumerate(tables)], axis=-1)


def _lookup(tables, rung):
  per = _per_transport(tables, rung)
  return per.sum(axis=-1)


class Part(NamedTuple):
  """Stats of one transport (combined into CollectiveStats)."""
  rung: Any            # int32[] rung index taken
  used_units: Any      # int32[] agreed used size / 128
  escapes: Any         # int32[] codec count over all participants
  decode_errors: Any   # int32[] failed rows over all participants; None: not counted
  slots: tuple         # bytes this device sends on each rung (static)
  slot_sizes: tuple    # row slot of each rung (static)
  agree_bytes: int
  raw_bytes: int
  elements: int
  compressed: bool


def make_stats(name: str, codec, parts) -> CollectiveStats:
  i32 = lambda v: jnp.asarray(v, jnp.int32)
  return CollectiveStats(
      rung=jnp.stack([i32(p.rung) for p in parts]),
      used_units=jnp.stack([i32(p.used_units) for p in parts]),
      escape_count=sum(i32(p.escapes) for p in parts),
      decode_errors=(jnp.int32(-1) if any(p.decode_errors is None for p in parts)
                     else sum(i32(p.decode_errors) for p in parts)),
      collective=name, codec=codec, compressed=any(p.compressed for p in parts),
      raw_bytes=sum(p.raw_bytes for p in parts), elements=sum(p.elements for p in parts),
      slots=tuple(p.slots for p in parts), slot_sizes=tuple(p.slot_sizes for p in parts),
      agree_bytes=sum(p.agree_bytes for p in parts))


def plain_part(nbytes: int, row_bytes: int = 0) -> Part:
  """An uncompressed transport: one rung, the raw one."""
  zero = jnp.int32(0)
  return Part(zero, zero, zero, zero, (nbytes,), (row_bytes,), 0, nbytes, 0, False)
