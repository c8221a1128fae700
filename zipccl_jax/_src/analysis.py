"""`analyze`: what a codec does to one tensor (entropy bound, ratios, escapes).

Any registered codec (`codec=`, default the window codec "zipccl"). Used by the
CLI (`zipccl-jax analyze`), the examples and the benchmarks.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src import registry
from zipccl_jax._src.codec import encoded_nbytes, max_nbytes


@dataclasses.dataclass(frozen=True)
class Analysis:
  """What the codec does to one tensor (all sizes in bytes).

  The escape fields are the window codec's ("zipccl"); for other codecs they are
  None and `count` holds the codec's own count statistic (docs/format.md: the
  entropy codec's is the number of blocks stored raw).
  """
  dtype: str
  n: int
  entropy_bits: float          # order-0 entropy per element (bits)
  entropy_ratio: float         # raw bits / entropy: the order-0 bound on the ratio
  exponent_entropy_bits: float
  escape_count: int | None     # window codec: exponents outside the block windows
  escape_rate: float | None    # escapes / n
  actual_nbytes: int           # used_nbytes of the row (window: escape area as large as needed)
  static_nbytes: int           # a fixed slot: window encoded_nbytes(dtype, n) at the default
                               # capacity; other codecs max_nbytes(dtype, n)
  ratio: float                 # raw / actual_nbytes
  static_ratio: float          # raw / static_nbytes (what a fixed-slot collective moves)
  overflow: bool               # the fixed slot would not hold the row
  fits: bool                   # the row fits max_nbytes (encode's status is 0)
  roundtrip_ok: bool           # decode(encode(x)) == x bit for bit
  codec: str = "zipccl"        # the codec measured
  count: int = 0               # the codec's count statistic (window: escapes)


def _entropy(counts: np.ndarray) -> float:
  p = counts[counts > 0].astype(np.float64)
  p /= p.sum()
  return float(-(p * np.log2(p)).sum())


def analyze(x, codec: str = "zipccl") -> Analysis:
  """Measures a codec on x: entropy bound, ratios, escape rate, round trip.

  Eager only. The window codec ("zipccl") runs its C++ row codec on host buffers
  with an escape area as large as the data needs, so that every tensor is
  measured and round-tripped. Any other registered codec runs its contract
  functions (`encode_rows` / `decode_rows`, jitted on the default device) on x as
  one row: actual_nbytes is the row's used_nbytes and static_nbytes its
  `max_nbytes(dtype, n)`.

  Args:
    x: an array of a dtype the codec takes (bfloat16, float16, float32 for the
      window codec; bfloat16, float16 for "entropy").
    codec: a registered codec name (`zipccl_jax.codec_names()` lists them).

  Returns:
    An `Analysis`.

  Raises:
    ValueError: unknown codec, a dtype the codec does not take, or >= 2^32 elements.
  """
  c = registry.get(codec, "analyze: codec")
  x = np.asarray(x)
  d = dtypes.info(x.dtype, "analyze: x")
  if not c.supports(x.dtype):
    raise ValueError(f"analyze: codec {codec!r} takes "
                     f"{', '.join(np.dtype(t).name for t in c.dtypes)}, got x of dtype {x.dtype.name}")
  n = x.size
  if n >= 2**32:
    raise ValueError(f"analyze: x must have fewer than 2^32 elements, got {n}")
  bits = d.bits
  words = np.ascontiguousarray(x).reshape(-1).view(d.word)
  man, ebits = d.mantissa_bits, d.exponent_bits
  e = (words >> man) & ((1 << ebits) - 1)
  h_exp = _entropy(np.bincount(e.astype(np.int64), minlength=1 << ebits)) if n else 0.0
  if bits == 16:
    h = _entropy(np.bincount(words.astype(np.int64), minlength=1 << 16)) if n else 0.0
  else:  # 2^32 symbols is too many for a histogram: exponent entropy + raw bits
    h = h_exp + (bits - ebits)
  raw = n * x.dtype.itemsize
  common = dict(dtype=x.dtype.name, n=n, entropy_bits=h,
                entropy_ratio=bits / h if h else float("inf"), exponent_entropy_bits=h_exp,
                codec=codec)
  if codec != "zipccl":
    return _analyze_rows(c, x, words, raw, common)
  native = _ffi.native()
  buf = np.empty(native.row_nbytes(d.code, n, n), np.uint8)  # capacity n: always fits
  _, esc, used = native.encode_into(d.code, words.view(np.uint8), n, n, buf)
  y = np.empty_like(words)
  status = native.decode_into(d.code, buf[:used], n, y.view(np.uint8))
  ok = status == 0 and np.array_equal(y, words)
  static = encoded_nbytes(x.dtype, n)
  return Analysis(
      escape_count=esc, escape_rate=esc / n if n else 0.0,
      actual_nbytes=used, static_nbytes=static, ratio=raw / used if n else 0.0,
      static_ratio=raw / static if n else 0.0, overflow=used > static,
      fits=used <= max_nbytes(x.dtype, n), roundtrip_ok=bool(ok), count=int(esc),
      **common)


def _analyze_rows(c, x, words, raw: int, common: dict) -> Analysis:
  """A codec through its contract functions: x as one row, encoded and decoded."""
  import jax  # imported late: the window codec's path and the CLI's --help need no jax
  import jax.numpy as jnp

  n = x.size
  static = int(c.max_nbytes(x.dtype, n))
  payload, stats = jax.jit(c.encode_rows)(jnp.asarray(x.reshape(1, n)))
  status, count, used_units = (int(v) for v in np.asarray(stats)[0, :3])
  fits = status == 0
  if fits:
    used = used_units * 128
    y, st = jax.jit(c.decode_rows, static_argnums=(1, 2))(payload[:, :used], n, x.dtype)
    ok = int(np.asarray(st)[0]) == 0 and np.array_equal(np.asarray(y).reshape(-1).view(words.dtype),
                                                        words)
  else:  # DOES_NOT_FIT: the transport would send the row raw (its raw rung)
    used, ok = raw, True
  return Analysis(
      escape_count=None, escape_rate=None, actual_nbytes=used, static_nbytes=static,
      ratio=raw / used if n else 0.0, static_ratio=raw / static if n else 0.0,
      overflow=not fits, fits=fits, roundtrip_ok=bool(ok), count=count, **common)
