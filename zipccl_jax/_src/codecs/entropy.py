"""The "entropy" codec (codec id 2): per-block canonical Huffman over exponents.

A row of n bf16/fp16 elements is cut into blocks of 4096 elements. Each block
codes its exponents (fp16: with the top mantissa bit, format version 4) or sign and
exponent jointly, whichever is smaller, with a
canonical Huffman code of at most 11 bits, in 8 independent bit streams of 512
elements, and keeps the remaining raw bits in byte-aligned planes; a block
without subnormals may drop the raw bits of its zeros (kind Z, format version
3: ReLU outputs); a block whose code would not pay is stored verbatim. Rows are prefix-decodable: the encoder
writes into a `max_nbytes` buffer and reports `used_nbytes` (a multiple of 128);
the decoder reads any buffer of at least that many bytes. docs/format.md
("Entropy codec (codec id 2)") specifies the bytes.

The work is done by the XLA FFI custom calls "zipccl_entropy_encode" /
"zipccl_entropy_decode", which treat every leading dimension as a row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src.codecs import base

ENCODE_TARGET = "zipccl_entropy_encode"
DECODE_TARGET = "zipccl_entropy_decode"

CODEC_ID = 2
# Entropy rows carry version 5 (the directory follows the 56-byte header); the window
# codec's rows carry their own, 4.
FORMAT_VERSION = 5
BLOCK = 4096            # elements per block
COUNT_NAME, COUNT_UNIT = "raw_block", BLOCK   # the count statistic: blocks stored RAW
STREAMS = 8             # bit streams per Huffman block
MAX_CODE_LEN = 11       # bits
_ALIGN = base.ALIGN
_HEADER_BYTES = 56      # the header; the directory (u16 per block) follows it
_BLOCK_HEAD = 4         # mode byte, zero byte, u16

# dtype -> (format dtype code, exponent bits E, mantissa bits M, q): the symbols code
# the exponent with the top q mantissa bits (docs/format.md, "Symbols and raw bits").
_DTYPES = {
    np.dtype(ml_dtypes.bfloat16): (1, 8, 7, 0),
    np.dtype(np.float16): (2, 5, 10, 1),
}

# Decoder statuses (shared numbering with the window codec, docs/format.md).
DECODE_ERRORS = {
    1: "bad magic, format version or codec id (not an entropy-codec format version 5 payload)",
    2: "dtype differs from what the decoder expects",
    3: "n differs, or used_nbytes exceeds the buffer, is not a multiple of 128 or is "
       "outside [min_nbytes, max_nbytes]",
    4: "the row was marked not decodable by its encoder",
    5: "invalid header (status byte, codec fields, data size, reserved byte or the "
       "directory's padding)",
    6: "invalid block directory or block header (sizes, mode, code lengths, raw-plane size)",
    7: "a bit stream does not end at its stored length, or a zero-elided (kind Z) block's "
       "raw planes do not match its decoded symbols (corrupted stream)",
    8: "checksum mismatch (corrupted bytes)",
}


_align = base.align


def _dtype_info(dtype, where: str = "dtype"):
  try:
    dt = np.dtype(dtype)
  except TypeError:
    dt = None
  if dt not in _DTYPES:
    raise TypeError(f"{where} must be bfloat16 or float16 for the entropy codec, got {dtype}")
  return _DTYPES[dt]


_check_count = base.check_count


def _data_offset(n: int) -> int:
  """The first block's offset: 56 + align8(2 nb) (header, directory, zero padding)."""
  return _HEADER_BYTES + -(-2 * (-(-n // BLOCK)) // 8) * 8


def max_nbytes(dtype, n: int) -> int:
  """Static payload row size: every block stored verbatim (RAW), so no row is larger.

  Mirrors `zipccl::ent::max_nbytes` (ffi/entropy_format.h; a test checks both agree):
  align128(56 + align8(2 nb) + 4 nb + 2 n) with nb = ceil(n / 4096).
  """
  _dtype_info(dtype)
  n = _check_count(n, "n")
  nb = -(-n // BLOCK)
  return _align(_data_offset(n) + _BLOCK_HEAD * nb + 2 * n)


def min_nbytes(dtype, n: int) -> int:
  """Static lower bound of used_nbytes: every block CONST-Z (all +0 or all -0).

  Mirrors `zipccl::ent::min_nbytes` (ffi/entropy_format.h): align128(56 +
  align8(2 nb) + 4 nb), a CONST-Z block being its 4-byte head alone.
  """
  _dtype_info(dtype)
  n = _check_count(n, "n")
  nb = -(-n // BLOCK)
  return _align(_data_offset(n) + _BLOCK_HEAD * nb)


# The best ratio (raw / used) real data reaches with this codec, per dtype: the
# slot ladder starts there instead of at min_nbytes (all blocks CONST-Z, which real
# tensors never are), so its rungs sit where rows land. Measured
# (benchmarks/entropy_ratio.py): bf16 1.46-1.54 on weights, gradients,
# GELU and softmax; fp16 1.15-1.25 (format version 4). Half-zero ReLU outputs
# reach 2.72 (bf16) / 2.05 (fp16) since format version 3 (kind Z) but keep this
# floor (activations are one data kind among many in a step). A row that
# compresses better still moves on the first rung: at this ratio, not worse.
_LADDER_BEST = {"bfloat16": (8, 5), "float16": (13, 10)}   # 1.6, 1.3


def ladder_floor(dtype, n: int) -> int:
  """The slot ladder's first rung for rows of n elements (bytes; see _LADDER_BEST)."""
  num, den = _LADDER_BEST[np.dtype(dtype).name]
  raw = n * np.dtype(dtype).itemsize
  return max(min_nbytes(dtype, n), raw * den // num)


def workspace_nbytes(n: int) -> int:
  """Workspace bytes per row of both custom calls: 128 + align128(8 (nb + 1)).

  The CUDA handlers keep per-row counters and one u64 per block there (look-back
  states when encoding, block offsets when decoding); the CPU handlers ignore it.
  Mirrors `zipccl::ent::workspace_nbytes` (ffi/entropy_format.h).
  """
  n = _check_count(n, "n")
  return 128 + _align(8 * (-(-n // BLOCK) + 1))


# The FFI targets take a per-row skip mask and the decoder a fill (base.py).
SKIP_ROWS = True


def encode_rows(x: jax.Array, skip=None):
  """Encodes every row x[..., :] independently.

  Args:
    x: bfloat16 or float16 array; the last dimension is the row.
    skip: optional rows to leave uncoded, as in the window codec's `encode_rows`.

  Returns:
    (payload uint8[..., max_nbytes(dtype, n)], stats int32[..., 4]) with stats =
    (status, raw_blocks, used_nbytes / 128, 0). status is always 0 (a row never
    exceeds max_nbytes); bytes of a row past used_nbytes are zero.

  Raises:
    TypeError: x has another dtype.
  """
  _dtype_info(x.dtype, "entropy.encode_rows: x")
  if x.ndim == 0:
    raise ValueError("entropy.encode_rows: x must have at least one dimension (the row)")
  _ffi.register()
  n = x.shape[-1]
  lead = x.shape[:-1]
  call = jax.ffi.ffi_call(
      ENCODE_TARGET,
      (base.result_type(lead + (max_nbytes(x.dtype, n),), jnp.uint8, x),
       base.result_type(lead + (4,), jnp.int32, x),
       base.result_type(lead + (workspace_nbytes(n),), jnp.uint8, x)),
      vmap_method="broadcast_all")
  payload, stats, _ = call(x, base.skip_operand(skip, lead, "entropy.encode_rows"))
  return payload, stats


def decode_rows(payload: jax.Array, n: int, dtype, skip=None, fill=None):
  """Decodes every row payload[..., :L] (any static L; only used_nbytes are read).

  Args:
    payload: uint8[..., L].
    n: elements per row (static).
    dtype: bfloat16 or float16.
    skip, fill: rows not to decode and what they take instead, as in
      the window codec's `decode_rows`.

  Returns:
    (values[..., n] of dtype, status int32[...]); status 0 = OK, else see
    `DECODE_ERRORS`; a row with a nonzero status is all-one bits (a NaN pattern).

  Raises:
    TypeError: payload is not uint8 or dtype is unsupported.
  """
  _dtype_info(dtype, "entropy.decode_rows: dtype")
  n = _check_count(n, "entropy.decode_rows: n")
  if payload.dtype != jnp.uint8 or payload.ndim == 0:
    raise TypeError(f"entropy.decode_rows: payload must be uint8[..., L], got {payload.dtype}"
                    f"{list(payload.shape)}")
  _ffi.register()
  lead = payload.shape[:-1]
  call = jax.ffi.ffi_call(
      DECODE_TARGET,
      (base.result_type(lead + (n,), np.dtype(dtype), payload),
       base.result_type(lead, jnp.int32, payload),
       base.result_type(lead + (workspace_nbytes(n),), jnp.uint8, payload)),
      vmap_method="broadcast_all")
  y, status, _ = call(payload, base.skip_operand(skip, lead, "entropy.decode_rows"),
                      base.fill_operand(fill, lead, n, dtype, "entropy.decode_rows"))
  return y, status
