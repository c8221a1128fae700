"""The window codec ("zipccl", codec id 1): the paper's per-block exponent window.

A row of n bf16/fp16/fp32 elements (docs/format.md, version 4): sign and mantissa
bits verbatim, the exponent as a 3-bit code (three bit planes) against a window of
7 exponents per 2048-element block, and the escaped exponents (outside the window)
as w-bit distances from it (w per block) in an escape section that comes last. The
encoder writes into a static buffer of `max_nbytes(dtype, n)` bytes and records in
the header how many it used (`used_nbytes`, a multiple of 128): the first
`used_nbytes` bytes decode on their own, so a transport may send any prefix at
least that long. A row whose escapes do not fit the buffer (data that barely
compresses) reports DOES_NOT_FIT (status 1).

The work is done by the XLA FFI custom calls "zipccl_zipccl_encode" /
"zipccl_zipccl_decode" (C++ on CPU, CUDA on GPU), which treat every leading
dimension as a row. This module implements the codec contract (base.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src.codecs import base

# ---- static-size contract (mirror of ffi/window_format.h) ---------------------------

FORMAT_VERSION = 4
CODEC_ID = 1            # the window codec's id in the common row header (byte 6)
BLOCK = 2048            # elements per block
# The encoder's count statistic (stats column 1, CollectiveStats.escape_count): what
# it counts and how many elements one count stands for (its rate's unit).
COUNT_NAME, COUNT_UNIT = "escape", 1          # escaped exponents, per element
_ALIGN = base.ALIGN     # section alignment and used_nbytes unit, bytes
_HEADER_BYTES = 128
_RECORD_BYTES = 8
_PLANE_BYTES = BLOCK // 8
_MAX_ELEMS = 2**56      # the layout arithmetic's bound (window_format.h: kMaxElems)
STATS_WIDTH = 4         # encode_rows' stats row: (status, escapes, used_units, 0)

# Encoder statuses (header byte 7, stats[..., 0]).
STATUS_OK = 0
STATUS_DOES_NOT_FIT = 1

# Layout per dtype code (docs/format.md): (sign+mantissa bytes per element in the
# raw section, bit planes per block). The dtype facts themselves live in dtypes.py.
_LAYOUT = {1: (1, 3), 2: (1, 6), 3: (3, 3)}

_align = base.align


def _dtype_info(dtype, where: str = "dtype"):
  """(format dtype code, raw bytes per element, bit planes per block); TypeError otherwise."""
  code = dtypes.info(dtype, where).code
  return (code,) + _LAYOUT[code]


def _check_n(n, where: str) -> int:
  n = base.check_count(n, f"{where}: n")
  if n > _MAX_ELEMS:
    raise ValueError(f"{where}: n must be <= 2^56, got {n}")
  return n


def min_nbytes(dtype, n: int) -> int:
  """The fixed part of a row (header, block table, raw bytes, planes), in bytes.

  The smallest `used_nbytes` any row of n elements can have. Mirrors
  `zipccl::min_nbytes` in ffi/window_format.h (tested to agree).
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


def workspace_nbytes(n: int) -> int:
  """Scratch bytes per row given to the FFI handlers (mirror of the C++ function)."""
  return _align(16 * (-(-n // BLOCK)) + 128)


# ---- FFI calls ------------------------------------------------------------------------

# The FFI targets take a per-row skip mask (and the decoder a fill): the transport
# leaves its own row uncoded (docs/format.md, "Skipped rows").
SKIP_ROWS = True


def encode_rows(x: jax.Array, skip=None):
  """Encodes every row x[..., :] independently. Returns (payload, stats).

  Args:
    x: bf16/f16/f32 array [..., n]; every leading index is a row.
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
  _ffi.register()
  _dtype_info(x.dtype, "encode_rows: x")
  n = x.shape[-1]
  lead = x.shape[:-1]
  call = jax.ffi.ffi_call(
      _ffi.ENCODE_TARGET,
      (base.result_type(lead + (max_nbytes(x.dtype, n),), jnp.uint8, x),
       base.result_type(lead + (STATS_WIDTH,), jnp.int32, x),
       base.result_type(lead + (workspace_nbytes(n),), jnp.uint8, x)),
      vmap_method="broadcast_all")
  payload, stats, _ = call(x, base.skip_operand(skip, lead, "encode_rows"))
  return payload, stats


def decode_rows(payload: jax.Array, n: int, dtype, skip=None, fill=None):
  """Decodes every row payload[..., :L] (any static L >= the rows' used_nbytes).

  Args:
    payload: uint8[..., L]: rows from `encode_rows`, or prefixes of them.
    n: elements per row (static).
    dtype: the rows' dtype.
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
      (base.result_type(lead + (n,), dtype, payload),
       base.result_type(lead, jnp.int32, payload),
       base.result_type(lead + (workspace_nbytes(n),), jnp.uint8, payload)),
      vmap_method="broadcast_all")
  y, status, _ = call(payload, base.skip_operand(skip, lead, "decode_rows"),
                      base.fill_operand(fill, lead, n, dtype, "decode_rows"))
  return y, status


# ---- decoder statuses ---------------------------------------------------------------

DECODE_ERRORS = {
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
