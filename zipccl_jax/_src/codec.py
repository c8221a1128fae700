"""The zipccl window codec: `encode`, `decode` and the static-size contract.

A tensor of n bf16/fp16/fp32 elements becomes one *row* of `encoded_nbytes(dtype,
n, escape_capacity)` bytes (docs/format.md): sign and mantissa bits verbatim, the
exponent as a 3-bit code (three bit planes) against a per-block window of 7
exponents, and escaped exponents (outside the window) in a capacity-bounded
escape section. The size is a pure function of (dtype, n, capacity), so the row is
an XLA static shape that collectives can move.

The work is done by the XLA FFI custom calls "zipccl_zipccl_encode" /
"zipccl_zipccl_decode" (C++ on CPU, CUDA on GPU), which treat every leading
dimension as a row: the collectives encode one row per destination in one call.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi

# ---- static-size contract (mirror of ffi/codec_format.h) ---------------------------

FORMAT_VERSION = 1
BLOCK = 2048            # elements per block
_ALIGN = 128            # section alignment, bytes
_HEADER_BYTES = 128
_RECORD_BYTES = 8
_PLANE_BYTES = BLOCK // 8

# Layout per dtype code (docs/format.md): (sign+mantissa bytes per element in the
# raw section, bit planes per block). The dtype facts themselves live in dtypes.py.
_LAYOUT = {1: (1, 3), 2: (1, 6), 3: (3, 3)}

# Default escape capacity, as a fraction of n. Gaussian data escapes ~2.45% with
# the block window (benchmarks/results/window_calibration.md); pretrained weights
# run about half a point above that. 3.75% leaves >= 0.75 points of margin over
# such weights and still meets the 1.41x static ratio on Gaussian bf16.
DEFAULT_ESCAPE_RATE = (3, 80)   # 3.75 %, kept as an integer fraction (exact)
_DEFAULT_ESCAPE_SLACK = 64      # absolute slots: binomial noise of small rows


def _align(x: int) -> int:
  return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def _dtype_info(dtype, where: str = "dtype"):
  """(format dtype code, raw bytes per element, bit planes per block); TypeError otherwise."""
  code = dtypes.info(dtype, where).code
  return (code,) + _LAYOUT[code]


def _check_count(value, name: str) -> int:
  if isinstance(value, jax.core.Tracer):
    raise TypeError(f"{name} must be a static Python int, got a traced value; "
                    "pass it as a static argument")
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
    raise ValueError(f"{name} must be a non-negative int, got {value!r}")
  return int(value)


def encoded_nbytes(dtype, n: int, escape_capacity: int | None = None) -> int:
  """Bytes of one encoded row: a pure function of (dtype, n, escape_capacity).

  Mirrors `zipccl::encoded_nbytes` in ffi/codec_format.h (a test checks that both
  agree). `escape_capacity=None` means `default_escape_capacity(n)`.
  """
  _, raw_bytes, planes = _dtype_info(dtype)
  n = _check_count(n, "n")
  cap = default_escape_capacity(n) if escape_capacity is None else _check_count(
      escape_capacity, "escape_capacity")
  nb = -(-n // BLOCK)
  return (_HEADER_BYTES + _align(_RECORD_BYTES * nb) + _align(raw_bytes * n) +
          nb * planes * _PLANE_BYTES + _align(cap))


def default_escape_capacity(n: int) -> int:
  """Default escape slots for n elements: ceil(3.75% n) + 64, rounded up to 128.

  Rounding to the 128-byte section alignment costs nothing; rows that small
  enough to hold every element (cap >= n) can never overflow.
  """
  n = _check_count(n, "n")
  num, den = DEFAULT_ESCAPE_RATE
  return min(_align(-(-num * n // den) + _DEFAULT_ESCAPE_SLACK), _align(n))


def workspace_nbytes(n: int) -> int:
  """Scratch bytes per row given to the FFI handlers (mirror of the C++ function)."""
  return _align(16 * (-(-n // BLOCK)) + 128)


# ---- the Encoded pytree ---------------------------------------------------------------

CODECS = ("zipccl", "raw")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Encoded:
  """An encoded tensor (or a batch of rows of one).

  Attributes:
    payload: uint8[..., nbytes], what a collective moves. Leading dimensions are
      independent rows (one per peer in the collectives).
    escape_count: int32[...], escapes found per row (saturated at 2^31-1).
    status: int32[...], 0 = OK, 1 = OVERFLOW (more escapes than the capacity:
      the row is not decodable and callers must take an uncompressed path).
    shape: static, the logical shape of one row's tensor.
    dtype: static, its dtype.
    escape_capacity: static, escape slots per row.
    codec: static, "zipccl" or "raw" (identity encoding, same shapes contract).
  """
  payload: jax.Array
  escape_count: jax.Array
  status: jax.Array
  shape: tuple = dataclasses.field(metadata=dict(static=True))
  dtype: Any = dataclasses.field(metadata=dict(static=True))
  escape_capacity: int = dataclasses.field(metadata=dict(static=True))
  codec: str = dataclasses.field(metadata=dict(static=True), default="zipccl")

  @property
  def overflowed(self) -> jax.Array:
    """True where a row overflowed its escape capacity (not decodable)."""
    return self.status != 0

  @property
  def size(self) -> int:
    return math.prod(self.shape)


# ---- FFI calls ------------------------------------------------------------------------


def _result_type(shape, dtype, like) -> jax.ShapeDtypeStruct:
  """A result type that keeps shard_map's varying-ness of `like`.

  Plain ShapeDtypeStructs inside shard_map are typed replicated, and then a wrong
  out_specs=P() is silently accepted (../shared/jax-notes.md, trap 1).
  """
  aval = jax.typeof(like)
  mat = getattr(aval, "mat", None)
  if mat is not None and getattr(aval.sharding, "mesh", None) is not None and mat.varying:
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat,
                                sharding=jax.sharding.NamedSharding(aval.sharding.mesh,
                                                                    jax.sharding.PartitionSpec()))
  return jax.ShapeDtypeStruct(shape, dtype)


def encode_rows(x: jax.Array, escape_capacity: int):
  """Encodes every row x[..., :] independently. Returns (payload, stats).

  payload is uint8[..., nbytes]; stats is int32[..., 2] = (status, escape_count).
  Internal building block of `encode` and the collectives (one call encodes the
  per-destination rows straight into the layout a collective sends).
  """
  _ffi.register()
  n = x.shape[-1]
  lead = x.shape[:-1]
  nbytes = encoded_nbytes(x.dtype, n, escape_capacity)
  call = jax.ffi.ffi_call(
      _ffi.ENCODE_TARGET,
      (_result_type(lead + (nbytes,), jnp.uint8, x),
       _result_type(lead + (2,), jnp.int32, x),
       _result_type(lead + (workspace_nbytes(n),), jnp.uint8, x)),
      vmap_method="broadcast_all")
  payload, stats, _ = call(x, escape_capacity=np.int64(escape_capacity))
  return payload, stats


def decode_rows(payload: jax.Array, n: int, dtype, escape_capacity: int):
  """Decodes every row payload[..., :]. Returns (values[..., n], status int32[...])."""
  _ffi.register()
  lead = payload.shape[:-1]
  want = encoded_nbytes(dtype, n, escape_capacity)
  if payload.shape[-1] != want:
    raise ValueError(f"decode: payload rows must be {want} bytes for {np.dtype(dtype).name} "
                     f"n={n} escape_capacity={escape_capacity}, got {payload.shape[-1]}")
  call = jax.ffi.ffi_call(
      _ffi.DECODE_TARGET,
      (_result_type(lead + (n,), dtype, payload),
       _result_type(lead, jnp.int32, payload),
       _result_type(lead + (workspace_nbytes(n),), jnp.uint8, payload)),
      vmap_method="broadcast_all")
  y, status, _ = call(payload, escape_capacity=np.int64(escape_capacity))
  return y, status


# ---- public API -----------------------------------------------------------------------

_DECODE_ERRORS = {
    1: "bad magic or format version (not a zipccl v1 payload)",
    2: "dtype or block size differ from what the decoder expects",
    3: "n, escape capacity or total size differ from what the decoder expects",
    4: "the encoder overflowed its escape capacity: this payload is not decodable "
       "(re-encode with a larger escape_capacity)",
    5: "invalid header (status byte, escape count or reserved bytes)",
    6: "inconsistent block table (window, escape offset or escape count)",
    7: "code planes disagree with the block table (corrupted planes)",
    8: "checksum mismatch (corrupted bytes)",
}


def decode_error_message(status: int) -> str:
  """Human-readable text of a decoder status (0 = OK)."""
  return "OK" if status == 0 else _DECODE_ERRORS.get(int(status), f"unknown status {status}")


def _check_codec(codec: str, where: str) -> str:
  if codec not in CODECS:
    raise ValueError(f"{where}: codec must be one of {CODECS}, got {codec!r}")
  return codec


def encode(x, *, codec: str = "zipccl", escape_capacity: int | None = None) -> Encoded:
  """Encodes a bf16/fp16/fp32 array losslessly.

  Works eagerly, under jit and vmap, and inside shard_map (per-device, keeping
  the varying type).

  Args:
    x: array of dtype bfloat16, float16 or float32, any shape.
    codec: "zipccl" (compress) or "raw" (identity bytes, same contract).
    escape_capacity: escape slots (exponents outside the block windows) the
      static payload reserves; default `default_escape_capacity(x.size)`. If
      the data needs more, `status` is 1 (OVERFLOW) and the payload must not be
      decoded.

  Returns:
    An `Encoded` pytree whose `payload` is uint8[encoded_nbytes(...)].

  Raises:
    TypeError: x has another dtype, or escape_capacity is traced.
    ValueError: a bad codec name or escape_capacity.
  """
  _check_codec(codec, "encode")
  x = jnp.asarray(x)
  _dtype_info(x.dtype, "encode: x")
  n = x.size
  if n >= 2**31:
    raise ValueError(f"encode: x must have fewer than 2^31 elements, got {n}")
  cap = default_escape_capacity(n) if escape_capacity is None else _check_count(
      escape_capacity, "encode: escape_capacity")
  if codec == "raw":
    payload = jax.lax.bitcast_convert_type(x.reshape(n), jnp.uint8).reshape(-1)
    zero = jnp.zeros((), jnp.int32)
    return Encoded(payload, zero, zero, tuple(x.shape), np.dtype(x.dtype), 0, "raw")
  payload, stats = encode_rows(x.reshape(1, n), cap)
  return Encoded(payload[0], stats[0, 1], stats[0, 0], tuple(x.shape), np.dtype(x.dtype), cap)


def decode(enc: Encoded, *, return_status: bool = False):
  """Decodes an `Encoded` back to the exact original array.

  Args:
    enc: from `encode` (possibly moved through a collective).
    return_status: also return the int32 decoder status (0 = OK; see
      docs/format.md). Under jit this is the only way to see an error.

  Returns:
    The array (and the status if asked).

  Raises:
    ValueError: eagerly, when the payload is malformed or overflowed.
  """
  if not isinstance(enc, Encoded):
    raise TypeError(f"decode: enc must be an Encoded, got {type(enc).__name__}")
  n = enc.size
  if enc.codec == "raw":
    y = jax.lax.bitcast_convert_type(
        enc.payload.reshape(n, np.dtype(enc.dtype).itemsize), enc.dtype).reshape(enc.shape)
    status = jnp.zeros((), jnp.int32)
  else:
    lead = enc.payload.shape[:-1]
    y, status = decode_rows(enc.payload.reshape(-1, enc.payload.shape[-1]), n, enc.dtype,
                            enc.escape_capacity)
    y = y.reshape(lead + tuple(enc.shape))
    status = status.reshape(lead)
    if not isinstance(status, jax.core.Tracer):
      bad = np.asarray(status)
      if np.any(bad != 0):
        first = int(bad.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]])
        raise ValueError(f"zipccl decode failed: {decode_error_message(first)} (status {first})")
  return (y, status) if return_status else y
