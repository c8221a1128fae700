"""The zipccl codec: `encode`, `decode`, the static-size contract and `analyze`.

A tensor of n bf16/fp16/fp32 elements becomes one *row* (docs/format.md, version 4):
sign and mantissa bits verbatim, the exponent as a 3-bit code (three bit planes)
against a per-block window of 7 exponents, and the escaped exponents (outside the
window) as w-bit distances from it (w per block, version 4) in an escape section
that comes last. The encoder writes into a static
buffer of `max_nbytes(dtype, n)` bytes and records in the header how many it used
(`used_nbytes`, a multiple of 128): the first `used_nbytes` bytes decode on their
own, so a transport may send any prefix at least that long. A row that needs more
escape bytes than the buffer holds reports DOES_NOT_FIT (status 1; its data barely
compresses, a transport sends it uncompressed).

The work is done by the XLA FFI custom calls "zipccl_zipccl_encode" /
"zipccl_zipccl_decode" (C++ on CPU, CUDA on GPU), which treat every leading
dimension as a row: the collectives encode one row per destination in one call.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi

# ---- static-size contract (mirror of ffi/codec_format.h) ---------------------------

FORMAT_VERSION = 4
CODEC_ID = 1            # the window codec's id in the common row header (byte 6)
BLOCK = 2048            # elements per block
# The encoder's count statistic (stats column 1, CollectiveStats.escape_count): what
# it counts and how many elements one count stands for (its rate's unit).
COUNT_NAME, COUNT_UNIT = "escape", 1          # escaped exponents, per element
_ALIGN = 128            # section alignment and used_nbytes unit, bytes
_HEADER_BYTES = 128
_RECORD_BYTES = 8
_PLANE_BYTES = BLOCK // 8
_MAX_ELEMS = 2**56      # the layout arithmetic's bound (codec_format.h: kMaxElems)
STATS_WIDTH = 4         # encode_rows' stats row: (status, escapes, used_units, 0)

# Encoder statuses (header byte 7, stats[..., 0]).
STATUS_OK = 0
STATUS_DOES_NOT_FIT = 1

# Layout per dtype code (docs/format.md): (sign+mantissa bytes per element in the
# raw section, bit planes per block). The dtype facts themselves live in dtypes.py.
_LAYOUT = {1: (1, 3), 2: (1, 6), 3: (3, 3)}

# Default escape capacity of the fixed-slot transport, as a fraction of n. Gaussian
# data escapes ~2.45% with the block window
# (benchmarks/results/window_calibration.md); pretrained weights run about half a
# point above that. 3.75% leaves >= 0.75 points of margin over such weights.
DEFAULT_ESCAPE_RATE = (3, 80)   # 3.75 %, kept as an integer fraction (exact)
_DEFAULT_ESCAPE_SLACK = 64      # absolute slots: binomial noise of small rows

_CAPACITY_DEPRECATED = ("escape_capacity is deprecated and ignored: the payload is now sized "
                        "automatically (max_nbytes(dtype, n), with the used size in the header)")


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


def _check_n(n, where: str) -> int:
  n = _check_count(n, f"{where}: n")
  if n > _MAX_ELEMS:
    raise ValueError(f"{where}: n must be <= 2^56, got {n}")
  return n


# A row holds fewer than 2^31 elements (int32 shapes and counts in the FFI handlers),
# and an escape slot holds one element's exponent: no row can use more slots than this.
MAX_ESCAPE_CAPACITY = 2**31 - 1


def row_capacity_limit(n: int) -> int:
  """The most escape slots worth reserving for n elements: align128(n), at least one
  128-slot section (the section is 128-byte aligned anyway), below 2^31."""
  return min(max(_align(n), _ALIGN), MAX_ESCAPE_CAPACITY)


def check_escape_capacity(value, name: str = "escape_capacity") -> int:
  """THE validation of a user's escape capacity (the collectives' options).

  A static int in [0, MAX_ESCAPE_CAPACITY]: no row has 2^31 elements, so no row
  can use more slots. Larger values only allocated memory (2^31 slots = 2 GiB per
  row) or overflowed the size arithmetic. Per row, `row_capacity_limit(m)` is all
  a row of m elements can use (the collectives clamp to it). `encode` ignores the
  deprecated argument (a warning), so it needs no bound there.

  Raises:
    TypeError: a traced value.
    ValueError: not a non-negative int, or above the bound; the message names `name`.
  """
  cap = _check_count(value, name)
  if cap > MAX_ESCAPE_CAPACITY:
    raise ValueError(f"{name}={cap} is larger than any row can need (no row has 2^31 "
                     f"elements, so at most {MAX_ESCAPE_CAPACITY} slots)")
  return cap


def min_nbytes(dtype, n: int) -> int:
  """The fixed part of a row (header, block table, raw bytes, planes), in bytes.

  The smallest `used_nbytes` any row of n elements can have. Mirrors
  `zipccl::min_nbytes` in ffi/codec_format.h (tested to agree).
  """
  _, raw_bytes, planes = _dtype_info(dtype)
  n = _check_n(n, "min_nbytes")
  nb = -(-n // BLOCK)
  # Full blocks' planes are _PLANE_BYTES each; the last block's 16 * ceil(len / 128)
  # (format version 3), the plane section padded to 128.
  last = n - BLOCK * (nb - 1) if nb else 0
  plane_section = planes * ((nb - 1) * _PLANE_BYTES + 16 * -(-last // 128)) if nb else 0
  return _HEADER_BYTES + _align(_RECORD_BYTES * nb) + _align(raw_bytes * n) + _align(plane_section)


def max_escape_capacity(dtype, n: int) -> int:
  """Escape bytes of the encoder's buffer: `max_nbytes(dtype, n) - min_nbytes(dtype, n)`.

  What brings the row to align128(raw bytes), and at least 128 when n > 0.
  """
  fixed = min_nbytes(dtype, n)
  raw = _align(np.dtype(dtype).itemsize * n)
  area = max(raw - fixed, 0)
  return _ALIGN if n > 0 and area < _ALIGN else area


def max_nbytes(dtype, n: int) -> int:
  """Static payload row size of `encode_rows`: the fixed part plus the escape area.

  About the raw size (at least align128(raw bytes)); a row whose escapes do not
  fit reports DOES_NOT_FIT. Mirrors `zipccl::max_nbytes` (tested to agree).
  """
  return min_nbytes(dtype, n) + max_escape_capacity(dtype, n)


def encoded_nbytes(dtype, n: int, escape_capacity: int | None = None) -> int:
  """Bytes of a row prefix with room for `escape_capacity` escape bytes (a fixed slot).

  `min(min_nbytes + align128(escape_capacity), max_nbytes)`: a row whose escape
  streams take at most that many bytes decodes from its first `encoded_nbytes(...)`
  bytes (format v4 packs escapes into w-bit values, w <= 8, so that many escapes
  always fit). This is the v1 row size, now the slot of a fixed-slot transport.
  `escape_capacity=None` means `default_escape_capacity(n)`.
  """
  _dtype_info(dtype)
  n = _check_n(n, "encoded_nbytes")
  cap = default_escape_capacity(n) if escape_capacity is None else _check_count(
      escape_capacity, "escape_capacity")
  return min(min_nbytes(dtype, n) + _align(cap), max_nbytes(dtype, n))


def default_escape_capacity(n: int) -> int:
  """Default escape bytes of a fixed slot: ceil(3.75% n) + 64, rounded up to 128.

  Rounding to the 128-byte alignment costs nothing; a capacity >= n can never
  be exceeded.
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
    payload: uint8[..., max_nbytes], what a collective moves (or any prefix of it
      of at least `used_nbytes` bytes). Leading dimensions are independent rows.
    escape_count: int32[...], the codec's count per row: escapes for "zipccl"
      (saturated at 2^31-1), blocks stored raw for "entropy".
    status: int32[...], 0 = OK, 1 = DOES_NOT_FIT (the escapes exceed the payload's
      escape area: the row is not decodable; its data barely compresses).
    used_units: int32[...], used_nbytes / 128 per row (max_nbytes / 128 + 1 when
      status = 1).
    shape: static, the logical shape of one row's tensor.
    dtype: static, its dtype.
    codec: static, the codec's name ("zipccl", "entropy", ...) or "raw"
      (identity encoding, same shapes contract).
  """
  payload: jax.Array
  escape_count: jax.Array
  status: jax.Array
  used_units: jax.Array
  shape: tuple = dataclasses.field(metadata=dict(static=True))
  dtype: Any = dataclasses.field(metadata=dict(static=True))
  codec: str = dataclasses.field(metadata=dict(static=True), default="zipccl")

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


# ---- FFI calls ------------------------------------------------------------------------


def _result_type(shape, dtype, like) -> jax.ShapeDtypeStruct:
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


# The FFI targets take a per-row skip mask (and the decoder a fill): the transport
# leaves its own row uncoded (docs/format.md, "Skipped rows").
SKIP_ROWS = True


def _skip_operand(skip, lead: tuple, where: str):
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


def _fill_operand(fill, lead: tuple, n: int, dtype, where: str):
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


def encode_rows(x: jax.Array, escape_capacity: int | None = None, skip=None):
  """Encodes every row x[..., :] independently. Returns (payload, stats).

  Args:
    x: bf16/f16/f32 array [..., n]; every leading index is a row.
    escape_capacity: deprecated and ignored (the payload is sized automatically).
    skip: optional bool/int array of x.shape[:-1]: rows to leave uncoded (a
      transport's own row, which never leaves the device). On the CPU their
      payload bytes are unspecified and their stats zero; the GPU encodes them
      anyway (docs/format.md, "Skipped rows").

  Returns:
    payload: uint8[..., max_nbytes(dtype, n)], bytes past each row's used_nbytes zero.
    stats: int32[..., 4] = (status, escape_count, used_units, 0) with status 0 OK /
      1 DOES_NOT_FIT, escape_count saturated at 2^31-1, used_units =
      used_nbytes / 128 (max_nbytes / 128 + 1 for a row that does not fit).

  Keeps shard_map's varying type of x; works under jit and vmap.
  """
  if escape_capacity is not None:
    warnings.warn(_CAPACITY_DEPRECATED, DeprecationWarning, stacklevel=2)
  _ffi.register()
  _dtype_info(x.dtype, "encode_rows: x")
  n = x.shape[-1]
  lead = x.shape[:-1]
  call = jax.ffi.ffi_call(
      _ffi.ENCODE_TARGET,
      (_result_type(lead + (max_nbytes(x.dtype, n),), jnp.uint8, x),
       _result_type(lead + (STATS_WIDTH,), jnp.int32, x),
       _result_type(lead + (workspace_nbytes(n),), jnp.uint8, x)),
      vmap_method="broadcast_all")
  payload, stats, _ = call(x, _skip_operand(skip, lead, "encode_rows"))
  return payload, stats


def decode_rows(payload: jax.Array, n: int, dtype, escape_capacity: int | None = None,
                skip=None, fill=None):
  """Decodes every row payload[..., :L] (any static L >= the rows' used_nbytes).

  Args:
    payload: uint8[..., L]: rows from `encode_rows`, or prefixes of them.
    n: elements per row (static).
    dtype: the rows' dtype.
    escape_capacity: deprecated and ignored.
    skip: optional bool/int array of payload.shape[:-1]: rows not to decode; each
      takes its row of `fill` instead (status 0), or is unspecified without fill.
      The GPU decodes them anyway, which gives the same bits when the row is the
      encoding of its fill row (a transport's own row).
    fill: optional dtype[F, n] (or [..., n] with F leading rows), F dividing the
      number of rows R: skipped row r takes fill row r // (R // F).

  Returns:
    (values[..., n], status int32[...]); a row whose status is not 0 holds all-one
    bits (a NaN). Bytes past a row's used_nbytes are never read.
  """
  if escape_capacity is not None:
    warnings.warn(_CAPACITY_DEPRECATED, DeprecationWarning, stacklevel=2)
  _ffi.register()
  _dtype_info(dtype, "decode_rows: dtype")
  n = _check_n(n, "decode_rows")
  if payload.dtype != jnp.uint8:
    raise TypeError(f"decode_rows: payload must be uint8, got {payload.dtype}")
  L = payload.shape[-1]
  if L % 16:
    # used_nbytes is a multiple of 128, so bytes past the last multiple of 128 are
    # never used; cutting them keeps every row 16-byte aligned for the GPU decoder.
    payload = payload[..., :L // _ALIGN * _ALIGN]
  lead = payload.shape[:-1]
  call = jax.ffi.ffi_call(
      _ffi.DECODE_TARGET,
      (_result_type(lead + (n,), dtype, payload),
       _result_type(lead, jnp.int32, payload),
       _result_type(lead + (workspace_nbytes(n),), jnp.uint8, payload)),
      vmap_method="broadcast_all")
  y, status, _ = call(payload, _skip_operand(skip, lead, "decode_rows"),
                      _fill_operand(fill, lead, n, dtype, "decode_rows"))
  return y, status


# ---- public API -----------------------------------------------------------------------

_DECODE_ERRORS = {
    1: "bad magic, format version or codec id (not a zipccl v4 window-codec payload)",
    2: "dtype or block size differ from what the decoder expects",
    3: "n differs from what the decoder expects, or used_nbytes exceeds the payload, "
       "is not a multiple of 128 or is below min_nbytes",
    4: "the encoder reported DOES_NOT_FIT: the row needs more escape bytes than max_nbytes "
       "holds, so it is not decodable (its data barely compresses: use codec='raw')",
    5: "invalid header (status byte, escape count or bytes, capacity, used_nbytes or "
       "reserved bytes)",
    6: "inconsistent block table (window, escape offset, count, width or split)",
    7: "code planes disagree with the block table, an escape names no exponent of the "
       "dtype, or a stream's padding bits are set (corrupted planes or escapes)",
    8: "checksum mismatch (corrupted bytes)",
    9: "nonzero padding after a matching checksum (a crafted or mis-encoded payload)",
}


def decode_error_message(status: int) -> str:
  """Human-readable text of a decoder status (0 = OK)."""
  return "OK" if status == 0 else _DECODE_ERRORS.get(int(status), f"unknown status {status}")


def _check_codec(codec: str, where: str) -> str:
  """"raw" or a registered codec name ("zipccl", "entropy", ...)."""
  from zipccl_jax._src import registry  # pylint: disable=g-import-not-at-top (registry -> codec)
  if codec != "raw" and (not isinstance(codec, str) or codec not in registry.names()):
    raise ValueError(f"{where}: codec must be one of {('raw',) + registry.names()}, "
                     f"got {codec!r}")
  return codec


def _row_codec(codec: str):
  """The contract functions (encode_rows/decode_rows) of a registered codec."""
  if codec == "zipccl":
    return None     # this module's own functions
  from zipccl_jax._src import registry  # pylint: disable=g-import-not-at-top
  return registry.get(codec)


def encode(x, *, codec: str = "zipccl", escape_capacity: int | None = None) -> Encoded:
  """Encodes a bf16/fp16/fp32 array losslessly.

  Works eagerly, under jit and vmap, and inside shard_map (per-device, keeping
  the varying type).

  Args:
    x: array of dtype bfloat16, float16 or float32, any shape.
    codec: "zipccl" (the window codec), any other registered codec such as
      "entropy" (bf16/fp16), or "raw" (identity bytes, same contract).
    escape_capacity: deprecated and ignored (a DeprecationWarning): the payload
      is sized automatically, `max_nbytes(x.dtype, x.size)` bytes of which the
      first `used_nbytes` matter.

  Returns:
    An `Encoded` pytree. Its `status` is 1 (DOES_NOT_FIT, not decodable) when the
    data has more escapes than the payload holds (data that barely compresses,
    e.g. random bits).

  Raises:
    TypeError: x has another dtype.
    ValueError: a bad codec name, or x has 2^31 elements or more.
  """
  _check_codec(codec, "encode")
  if escape_capacity is not None:
    warnings.warn(_CAPACITY_DEPRECATED, DeprecationWarning, stacklevel=2)
  x = jnp.asarray(x)
  _dtype_info(x.dtype, "encode: x")
  n = x.size
  if n >= 2**31:
    raise ValueError(f"encode: x must have fewer than 2^31 elements, got {n}")
  if codec == "raw":
    payload = jax.lax.bitcast_convert_type(x.reshape(n), jnp.uint8).reshape(-1)
    zero = jnp.zeros((), jnp.int32)
    units = jnp.int32(_align(payload.size) // _ALIGN)
    return Encoded(payload, zero, zero, units, tuple(x.shape), np.dtype(x.dtype), "raw")
  other = _row_codec(codec)
  if other is not None and not other.supports(x.dtype):
    raise TypeError(f"encode: codec {codec!r} does not encode {np.dtype(x.dtype).name}")
  payload, stats = (encode_rows if other is None else other.encode_rows)(x.reshape(1, n))
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
    ValueError: eagerly, when the payload is malformed or does not fit.
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
    other = _row_codec(enc.codec)
    rows = enc.payload.reshape(-1, enc.payload.shape[-1])
    y, status = (decode_rows if other is None else other.decode_rows)(rows, n, enc.dtype)
    y = y.reshape(lead + tuple(enc.shape))
    status = status.reshape(lead)
    if not isinstance(status, jax.core.Tracer):
      bad = np.asarray(status)
      if np.any(bad != 0):
        first = int(bad.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]])
        raise ValueError(f"{enc.codec} decode failed: {decode_error_message(first)} "
                         f"(status {first})")
  return (y, status) if return_status else y
