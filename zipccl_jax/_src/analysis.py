"""`analyze`: what the window codec does to one tensor (entropy bound, ratios, escapes).

Used by the CLI (`zipccl-jax analyze`), the examples and the benchmarks.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src.codec import decode, default_escape_capacity, encode, encoded_nbytes


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
  actual_nbytes: int           # encoded size with capacity = the escapes found
  static_nbytes: int           # encoded size with the default capacity
  ratio: float                 # raw / actual_nbytes
  static_ratio: float          # raw / static_nbytes (what a collective moves)
  overflow: bool               # the default capacity would overflow
  roundtrip_ok: bool           # decode(encode(x)) == x bit for bit


def _entropy(counts: np.ndarray) -> float:
  p = counts[counts > 0].astype(np.float64)
  p /= p.sum()
  return float(-(p * np.log2(p)).sum())


def analyze(x) -> Analysis:
  """Measures the codec on x: entropy bound, ratios, escape rate, round trip.

  Eager only (it reads values back to the host).
  """
  x = np.asarray(x)
  d = dtypes.info(x.dtype, "analyze: x")
  n = x.size
  bits = d.bits
  words = x.reshape(-1).view(d.word)
  man, ebits = d.mantissa_bits, d.exponent_bits
  e = (words >> man) & ((1 << ebits) - 1)
  h_exp = _entropy(np.bincount(e.astype(np.int64), minlength=1 << ebits)) if n else 0.0
  if bits == 16:
    h = _entropy(np.bincount(words.astype(np.int64), minlength=1 << 16)) if n else 0.0
  else:  # 2^32 symbols is too many for a histogram: exponent entropy + raw bits
    h = h_exp + (bits - ebits)
  big = 2**31 - 1
  cap = min(n, big) if n else 0
  enc = encode(jnp.asarray(x), escape_capacity=cap)  # capacity n: never overflows
  esc = int(enc.escape_count)
  y = decode(enc)
  ok = np.array_equal(np.asarray(y).reshape(-1).view(words.dtype), words)
  raw = n * x.dtype.itemsize
  actual = encoded_nbytes(x.dtype, n, esc)
  static = encoded_nbytes(x.dtype, n)
  return Analysis(
      dtype=x.dtype.name, n=n, entropy_bits=h, entropy_ratio=bits / h if h else float("inf"),
      exponent_entropy_bits=h_exp, escape_count=esc, escape_rate=esc / n if n else 0.0,
      actual_nbytes=actual, static_nbytes=static, ratio=raw / actual if n else 0.0,
      static_ratio=raw / static if n else 0.0, overflow=esc > default_escape_capacity(n),
      roundtrip_ok=bool(ok))
