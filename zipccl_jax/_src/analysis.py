"""`analyze`: what a codec does to one tensor (entropy bound, ratios, wire bytes).

Any registered codec (`codec=`, default the window codec "zipccl"). Used by the
CLI (`zipccl-jax analyze`), the examples and the benchmarks.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src import ladder
from zipccl_jax._src.codecs import registry


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
  wire_nbytes: int             # the slot a compressed collective moves for this row: the
                               # first rung of the codec's ladder at or above actual_nbytes,
                               # or the raw bytes (the raw rung)
  ratio: float                 # raw / actual_nbytes
  wire_ratio: float            # raw / wire_nbytes (what a collective of this tensor reaches)
  fits: bool                   # the row fits max_nbytes (encode's status is 0)
  roundtrip_ok: bool           # decode(encode(x)) == x bit for bit
  codec: str = "zipccl"        # the codec measured
  count: int = 0               # the codec's count statistic (window: escapes)


def _entropy(counts: np.ndarray) -> float:
  p = counts[counts > 0].astype(np.float64)
  p /= p.sum()
  return float(-(p * np.log2(p)).sum())


def wire_nbytes(codec: str, dtype, n: int, used: int | None) -> int:
  """The bytes a compressed all-gather moves for one row of n elements whose used
  size is `used` (None: the row does not fit): the first rung of the codec's ladder
  at or above it, else the raw row (the raw rung)."""
  raw = n * np.dtype(dtype).itemsize
  if used is None or n == 0:
    return raw
  return next((r for r in ladder.codec_ladder(codec, dtype, n) if r >= used), raw)


def analyze(x, codec: str = "zipccl") -> Analysis:
  """Measures a codec on x: entropy bound, ratios, wire bytes, escape rate, round trip.

  Eager only. The window codec ("zipccl") runs its C++ row codec on host buffers
  with an escape area as large as the data needs, so that every tensor is
  measured and round-tripped. Any other registered codec runs its contract
  functions (`encode_rows` / `decode_rows`, jitted on the default device) on x as
  one row. `wire_nbytes` is what a compressed collective moves for the tensor as
  one row (its ladder's slot; `wire_ratio` the ratio it reaches).

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
  fits = used <= c.max_nbytes(x.dtype, n)
  wire = wire_nbytes(codec, x.dtype, n, used if fits else None)
  return Analysis(
      escape_count=esc, escape_rate=esc / n if n else 0.0,
      actual_nbytes=used, wire_nbytes=wire, ratio=raw / used if n else 0.0,
      wire_ratio=raw / wire if n else 0.0, fits=fits, roundtrip_ok=bool(ok),
      count=int(esc), **common)


def _analyze_rows(c, x, words, raw: int, common: dict) -> Analysis:
  """A codec through its contract functions: x as one row, encoded and decoded."""
  n = x.size
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
  wire = wire_nbytes(c.name, x.dtype, n, used if fits else None)
  return Analysis(
      escape_count=None, escape_rate=None, actual_nbytes=used, wire_nbytes=wire,
      ratio=raw / used if n else 0.0, wire_ratio=raw / wire if n else 0.0,
      fits=fits, roundtrip_ok=bool(ok), count=count, **common)
