"""`analyze`: what the window codec does to one tensor (entropy bound, ratios, escapes).

Used by the CLI (`zipccl-jax analyze`), the examples and the benchmarks.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src.codec import default_escape_capacity, encoded_nbytes, max_escape_capacity


@dataclasses.dataclass(frozen=True)
class Analysis:
  """What the codec does to one tensor (all sizes in bytes)."""
  dtype: str
  n: int
  entropy_bits: float          # order-0 entropy per element (bits)
  entropy_ratio: float         # raw bits / entropy: the order-0 bound on the ratio
  exponent_entropy_bits: float
  escape_count: int
  escape_rate: float           # escapes / n
  actual_nbytes: int           # used_nbytes of the row (escape area as large as needed)
  static_nbytes: int           # encoded_nbytes(dtype, n): a fixed slot of the default capacity
  ratio: float                 # raw / actual_nbytes
  static_ratio: float          # raw / static_nbytes (what a fixed-slot collective moves)
  overflow: bool               # the default capacity (fixed slot) would overflow
  fits: bool                   # the row fits max_nbytes (encode's status is 0)
  roundtrip_ok: bool           # decode(encode(x)) == x bit for bit


def _entropy(counts: np.ndarray) -> float:
  p = counts[counts > 0].astype(np.float64)
  p /= p.sum()
  return float(-(p * np.log2(p)).sum())


def analyze(x) -> Analysis:
  """Measures the codec on x: entropy bound, ratios, escape rate, round trip.

  Eager only (it runs the C++ row codec on host buffers, with an escape area as
  large as the data needs, so that every tensor is measured and round-tripped).
  """
  x = np.asarray(x)
  d = dtypes.info(x.dtype, "analyze: x")
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
  native = _ffi.native()
  buf = np.empty(native.row_nbytes(d.code, n, n), np.uint8)  # capacity n: always fits
  _, esc, used = native.encode_into(d.code, words.view(np.uint8), n, n, buf)
  y = np.empty_like(words)
  status = native.decode_into(d.code, buf[:used], n, y.view(np.uint8))
  ok = status == 0 and np.array_equal(y, words)
  raw = n * x.dtype.itemsize
  static = encoded_nbytes(x.dtype, n)
  return Analysis(
      dtype=x.dtype.name, n=n, entropy_bits=h, entropy_ratio=bits / h if h else float("inf"),
      exponent_entropy_bits=h_exp, escape_count=esc, escape_rate=esc / n if n else 0.0,
      actual_nbytes=used, static_nbytes=static, ratio=raw / used if n else 0.0,
      static_ratio=raw / static if n else 0.0, overflow=esc > default_escape_capacity(n),
      fits=esc <= max_escape_capacity(x.dtype, n), roundtrip_ok=bool(ok))
