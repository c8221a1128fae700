"""The codec-level API: one tensor in, one `Encoded` out, for any registered codec.

`encode` / `decode` turn a tensor into one row of a codec and back (the `Encoded`
pytree); `encode_rows` / `decode_rows` expose the row contract (base.py) of any
registered codec by name, as the transport uses it. `codec="raw"` is the identity
encoding with the same shapes contract.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src.codecs import base
from zipccl_jax._src.codecs import registry

DEFAULT_CODEC = "zipccl"     # the codec-level functions' default: the window codec


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Encoded:
  """An encoded tensor (or a batch of rows of one).

  Attributes:
    payload: uint8[..., max_nbytes], what a collective moves (or any prefix of it
      of at least `used_nbytes` bytes). Leading dimensions are independent rows.
    escape_count: int32[...], the codec's count per row (`COUNT_NAME`): escapes for
      "zipccl" (saturated at 2^31-1), blocks stored raw for "entropy".
    status: int32[...], 0 = OK, 1 = DOES_NOT_FIT (the row does not fit its payload
      and is not decodable; its data barely compresses).
    used_units: int32[...], used_nbytes / 128 per row (max_nbytes / 128 + 1 when
      status = 1).
    shape: static, the logical shape of one row's tensor.
    dtype: static, its dtype.
    codec: static, the codec's name ("zipccl", "entropy", ...) or "raw".
  """
  payload: jax.Array
  escape_count: jax.Array
  status: jax.Array
  used_units: jax.Array
  shape: tuple = dataclasses.field(metadata=dict(static=True))
  dtype: Any = dataclasses.field(metadata=dict(static=True))
  codec: str = dataclasses.field(metadata=dict(static=True), default=DEFAULT_CODEC)

  @property
  def used_nbytes(self) -> jax.Array:
    """Bytes of each row that matter (a multiple of 128; > payload size when status = 1).

    uint32 (int64 with jax_enable_x64): exact for rows up to 4 GiB.
    """
    wide = jnp.int64 if jax.config.jax_enable_x64 else jnp.uint32
    return jnp.asarray(self.used_units).astype(wide) * 128

  @property
  def overflowed(self) -> jax.Array:
    """True where a row does not fit its payload (DOES_NOT_FIT: not decodable)."""
    return self.status != 0

  @property
  def size(self) -> int:
    return math.prod(self.shape)


def _codec(codec, where: str) -> registry.Codec:
  if not isinstance(codec, str) or codec not in registry.names():
    raise ValueError(f"{where}: codec must be one of {registry.names()}, got {codec!r}")
  return registry.get(codec)


def encode_rows(x, *, codec: str = DEFAULT_CODEC, skip=None):
  """Encodes every row x[..., :] with a registered codec: (payload, stats).

  Args:
    x: array [..., n] of a dtype the codec takes; every leading index is a row.
    codec: a registered codec name (default the window codec).
    skip: optional flags of x.shape[:-1]: rows to leave uncoded (docs/format.md,
      "Skipped rows").

  Returns:
    payload uint8[..., max_nbytes(dtype, n)] (bytes past each row's used size are
    zero) and stats int32[..., 4] = (status, count, used_units, 0).
  """
  c = _codec(codec, "encode_rows")
  x = jnp.asarray(x)
  if not c.supports(x.dtype):
    raise TypeError(f"encode_rows: codec {codec!r} does not encode {np.dtype(x.dtype).name}")
  return c.encode_rows(x, skip=skip)


def decode_rows(payload, n: int, dtype, *, codec: str = DEFAULT_CODEC, skip=None, fill=None):
  """Decodes every row payload[..., :L] of a registered codec: (values, status).

  Args:
    payload: uint8[..., L], L at least every row's used size.
    n: elements per row (static).
    dtype: the rows' dtype.
    codec: the codec that encoded them (default the window codec).
    skip, fill: rows not to decode and the values they take instead.

  Returns:
    values[..., n] and status int32[...]; a row whose status is not 0 holds all-one
    bits (`decode_error_message(status, codec)` says why).
  """
  c = _codec(codec, "decode_rows")
  return c.decode_rows(payload, n, dtype, skip=skip, fill=fill)


def decode_error_message(status: int, codec: str = DEFAULT_CODEC) -> str:
  """Human-readable text of a decoder status (0 = OK) of the named codec."""
  return _codec(codec, "decode_error_message").decode_error_message(status)


def encode(x, *, codec: str = DEFAULT_CODEC) -> Encoded:
  """Encodes a bf16/fp16/fp32 array losslessly into one row.

  Works eagerly, under jit and vmap, and inside shard_map (per device, keeping
  the varying type).

  Args:
    x: array of dtype bfloat16, float16 or float32, any shape.
    codec: "zipccl" (the window codec, the default), any other registered codec
      such as "entropy" (bf16/fp16), or "raw" (identity bytes, same contract).

  Returns:
    An `Encoded` pytree. Its `status` is 1 (DOES_NOT_FIT, not decodable) when the
    data does not fit the payload (data that barely compresses, e.g. random bits).

  Raises:
    TypeError: x has a dtype the codec does not take.
    ValueError: a bad codec name, or x has 2^31 elements or more.
  """
  if codec != "raw":
    c = _codec(codec, "encode")
  x = jnp.asarray(x)
  dtypes.info(x.dtype, "encode: x")
  n = x.size
  if n >= 2**31:
    raise ValueError(f"encode: x must have fewer than 2^31 elements, got {n}")
  if codec == "raw":
    payload = jax.lax.bitcast_convert_type(x.reshape(n), jnp.uint8).reshape(-1)
    zero = jnp.zeros((), jnp.int32)
    units = jnp.int32(base.align(payload.size) // base.ALIGN)
    return Encoded(payload, zero, zero, units, tuple(x.shape), np.dtype(x.dtype), "raw")
  if not c.supports(x.dtype):
    raise TypeError(f"encode: codec {codec!r} does not encode {np.dtype(x.dtype).name}")
  payload, stats = c.encode_rows(x.reshape(1, n))
  return Encoded(payload[0], stats[0, 1], stats[0, 0], stats[0, 2], tuple(x.shape),
                 np.dtype(x.dtype), codec)


def decode(enc: Encoded, *, return_status: bool = False):
  """Decodes an `Encoded` back to the exact original array.

  Args:
    enc: from `encode` (possibly moved through a collective; its payload may be
      cut to any length >= used_nbytes).
    return_status: also return the int32 decoder status (0 = OK; see
      docs/format.md). Under jit this is the only way to see an error; the
      values of a row that failed are all-one bits (a NaN).

  Returns:
    The array (and the status if asked).

  Raises:
    ValueError: eagerly, when the payload is malformed or does not fit; the
      message names the codec and its status text.
  """
  if not isinstance(enc, Encoded):
    raise TypeError(f"decode: enc must be an Encoded, got {type(enc).__name__}")
  n = enc.size
  if enc.codec == "raw":
    y = jax.lax.bitcast_convert_type(
        enc.payload.reshape(n, np.dtype(enc.dtype).itemsize), enc.dtype).reshape(enc.shape)
    status = jnp.zeros((), jnp.int32)
  else:
    c = _codec(enc.codec, "decode")
    lead = enc.payload.shape[:-1]
    rows = enc.payload.reshape(-1, enc.payload.shape[-1])
    y, status = c.decode_rows(rows, n, enc.dtype)
    y = y.reshape(lead + tuple(enc.shape))
    status = status.reshape(lead)
    if not isinstance(status, jax.core.Tracer):
      bad = np.asarray(status).reshape(-1)
      if np.any(bad != 0):
        first = int(bad[np.flatnonzero(bad)[0]])
        raise ValueError(f"{enc.codec} decode failed: {c.decode_error_message(first)} "
                         f"(status {first})")
  return (y, status) if return_status else y
