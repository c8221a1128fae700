"""`CollectiveStats`: what compression did in one collective call (opt-in, `stats=True`)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


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


class Part(NamedTuple):
  """Stats of one row transport (combined into CollectiveStats)."""
  fell_back: Any
  escapes: Any
  wire_bytes: Any
  raw_bytes: int
  elements: int
  compressed: bool


def make_stats(name: str, codec, parts) -> CollectiveStats:
  fell = functools.reduce(jnp.logical_or, [jnp.asarray(p.fell_back) for p in parts])
  esc = sum(jnp.asarray(p.escapes, jnp.int32) for p in parts)
  wire = sum(jnp.asarray(p.wire_bytes, jnp.int32) for p in parts)
  return CollectiveStats(
      fell_back=fell, escape_count=esc, wire_bytes=wire, collective=name, codec=codec,
      compressed=any(p.compressed for p in parts),
      raw_bytes=sum(p.raw_bytes for p in parts), elements=sum(p.elements for p in parts))


def plain_part(nbytes: int) -> Part:
  return Part(jnp.bool_(False), jnp.int32(0), jnp.int32(nbytes), nbytes, 0, False)
