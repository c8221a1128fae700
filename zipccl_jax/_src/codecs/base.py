"""The codec contract: what every codec module provides, and the helpers they share.

A codec is a Python module registered under a name (`registry.py`). The transport
and the collectives use a codec only through this contract, so that adding a codec
is adding a module and a registry entry. Sizes are pure functions of (dtype, n):
every encoded array is an XLA static shape.

    max_nbytes(dtype, n) -> int    bytes of the worst-case row (the encode buffer)
    min_nbytes(dtype, n) -> int    bytes of the best-case row (the ladder's first rung)
    ladder_floor(dtype, n) -> int  optional: where real rows land, when far above
                                   min_nbytes (the ladder starts there)
    encode_rows(x[..., n], skip=None) -> (payload u8[..., max_nbytes], stats s32[..., 4])
        stats = (status, count, used_units, 0); used_units * 128 = the row's used
        bytes; the first used bytes decode on their own and the rest are zero
    decode_rows(payload u8[..., L], n, dtype, skip=None, fill=None)
        -> (values[..., n], status s32[...]); any L >= the used bytes; a row with
        a nonzero status is all-one bits; never reads outside its L bytes
    DECODE_ERRORS: {status: text}     what each nonzero decoder status means
    FORMAT_VERSION, CODEC_ID          the row header's version and codec bytes
    COUNT_NAME, COUNT_UNIT            what stats[..., 1] counts, and elements per count
    SKIP_ROWS                         True: `skip` rows are left uncoded and decoded
                                      rows take `fill` (a transport's own row)

`Codec` below states it as a Protocol for type checkers; `registry.Codec` is the
registered entry whose attributes forward to the module.
"""
from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import ffi as _ffi

ALIGN = 128      # used sizes and sections are multiples of 128 bytes (docs/format.md)


class Codec(Protocol):
  """What a codec module provides (see the module docstring)."""
  FORMAT_VERSION: int
  CODEC_ID: int
  COUNT_NAME: str
  COUNT_UNIT: int
  SKIP_ROWS: bool
  DECODE_ERRORS: dict

  def max_nbytes(self, dtype, n: int) -> int: ...
  def min_nbytes(self, dtype, n: int) -> int: ...
  def encode_rows(self, x, skip=None): ...
  def decode_rows(self, payload, n: int, dtype, skip=None, fill=None): ...


def align(x: int) -> int:
  """x rounded up to a multiple of ALIGN."""
  return (x + ALIGN - 1) // ALIGN * ALIGN


def check_count(value, name: str) -> int:
  """A static non-negative Python int (element counts, capacities)."""
  if isinstance(value, jax.core.Tracer):
    raise TypeError(f"{name} must be a static Python int, got a traced value; "
                    "pass it as a static argument")
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
    raise ValueError(f"{name} must be a non-negative int, got {value!r}")
  return int(value)


def result_type(shape, dtype, like) -> jax.ShapeDtypeStruct:
  """A result type that keeps shard_map's varying-ness of `like`.

  Plain ShapeDtypeStructs inside shard_map are typed replicated, and then a wrong
  out_specs=P() would be silently accepted (docs/jax-notes.md, trap 1).
  """
  aval = jax.typeof(like)
  mat = getattr(aval, "mat", None)
  if mat is not None and getattr(aval.sharding, "mesh", None) is not None and mat.varying:
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat,
                                sharding=jax.sharding.NamedSharding(aval.sharding.mesh,
                                                                    jax.sharding.PartitionSpec()))
  return jax.ShapeDtypeStruct(shape, dtype)


def skip_operand(skip, lead: tuple, where: str):
  """The targets' skip operand: uint8[lead], nonzero = skip the row (all zero for
  None). A uint8 mask passes unchanged (the handlers read any nonzero byte as
  skip): no op, so a mask made once outside a switch adds no kernel per branch."""
  if skip is None:
    return jnp.zeros(lead, jnp.uint8)
  skip = jnp.asarray(skip)
  if skip.shape != tuple(lead):
    raise ValueError(f"{where}: skip must have shape {tuple(lead)} (one flag per row), "
                     f"got {skip.shape}")
  if skip.dtype == jnp.uint8:
    return skip
  return (skip != 0).astype(jnp.uint8)


def fill_operand(fill, lead: tuple, n: int, dtype, where: str):
  """The decode targets' fill operand: dtype[F, n], F = 0 (None) or F dividing the rows."""
  dtype = np.dtype(dtype)
  if fill is None:
    return jnp.zeros((0, n), dtype)
  fill = jnp.asarray(fill)
  rows = int(np.prod(lead, dtype=np.int64))
  if fill.dtype != dtype or fill.ndim < 1 or fill.shape[-1] != n:
    raise ValueError(f"{where}: fill must be {dtype}[..., {n}], got {fill.dtype}{list(fill.shape)}")
  f = fill.size // n if n else int(np.prod(fill.shape[:-1], dtype=np.int64))
  if f and rows % f:
    raise ValueError(f"{where}: fill's {f} rows must divide the payload's {rows} rows")
  return fill.reshape(f, n)


def call_target(name: str, shape, dtype, like, *args, vmap_method=None, **attrs):
  """One result dtype[shape] of the FFI target `name` called on args (attrs: its
  attributes), typed varying like `like` (`result_type`)."""
  _ffi.register()
  return jax.ffi.ffi_call(name, result_type(tuple(shape), dtype, like),
                          vmap_method=vmap_method)(*args, **attrs)
