"""Numpy oracles and data generators shared by the tests (no JAX here).

Bit comparisons go through raw uint16/uint32 words and report the first mismatch
in hex; sums are modelled as XLA:CPU computes them (float32, subnormals flushed).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = [BF16, F16, F32]
# (exponent bits, mantissa bits) per dtype
FIELDS = {BF16: (8, 7), F16: (5, 10), F32: (8, 23)}


def uint(dtype):
  """The same-width unsigned dtype of dtype."""
  return np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32


def words(a) -> np.ndarray:
  """The raw words of a (same shape)."""
  a = np.asarray(a)
  return a.view(uint(a.dtype))


def assert_bits_equal(got, want, what=""):
  """got and want hold the same shape and the same words; else the first mismatch in hex."""
  g, w = words(got), words(want)
  assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
  bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
  if bad.size:
    i = bad[0]
    raise AssertionError(f"{what}: {bad.size} words differ; first at flat index {i}: "
                         f"got {g.reshape(-1)[i]:#x}, want {w.reshape(-1)[i]:#x}")


def assert_same_or_both_nan(got, want, what=""):
  """Same words, except that NaNs match any NaN (sums: NaN payloads are the platform's)."""
  g = np.asarray(got).astype(np.float32)
  w = np.asarray(want).astype(np.float32)
  nan = np.isnan(g) & np.isnan(w)
  same = (words(np.asarray(got)) == words(np.asarray(want))) | nan
  if not same.all():
    i = np.flatnonzero(~same.reshape(-1))[0]
    raise AssertionError(f"{what}: {(~same).sum()} elements differ; first at {i}: "
                         f"got {g.reshape(-1)[i]!r}, want {w.reshape(-1)[i]!r}")


# ---- sums as XLA:CPU computes them --------------------------------------------------------


def ftz32(a):
  """XLA:CPU runs float math with subnormals flushed to (signed) zero."""
  a = np.asarray(a, np.float32).copy()
  tiny = np.abs(a) < np.float32(2.0**-126)
  a[tiny] = np.copysign(np.float32(0), a[tiny])
  return a


def ordered_sum(chunks, dtype):
  """Sum in rank order with float32 accumulation, rounded once to dtype (one chunk: no
  add, nothing flushed)."""
  if len(chunks) == 1:
    return np.asarray(chunks[0]).astype(dtype)
  acc = ftz32(np.asarray(chunks[0]).astype(np.float32))
  with np.errstate(all="ignore"):
    for c in chunks[1:]:
      acc = ftz32(acc + ftz32(np.asarray(c).astype(np.float32)))
    return acc.astype(dtype)


# ---- data ------------------------------------------------------------------------------------


def special_words(dtype, extended: bool = False) -> list:
  """+-0, +-inf, NaNs with distinct payloads, subnormals of dtype (as ints).

  extended adds a signed NaN, a negative subnormal, the largest subnormal and the
  smallest normal above 1 ulp.
  """
  dtype = np.dtype(dtype)
  ebits, mbits = FIELDS[dtype]
  expo = ((1 << ebits) - 1) << mbits
  sign = 1 << (8 * dtype.itemsize - 1)
  if not extended:
    return [0, sign, expo, expo | sign, expo | 1, expo | (1 << (mbits - 1)) | 5, 1, sign | 3]
  return [0, sign, expo, expo | sign, expo | 1, expo | (1 << (mbits - 1)) | 5,
          expo | sign | 3, 1, sign | 1, (1 << mbits) - 1, (1 << mbits) | 1]


def gaussian(shape, dtype, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def sprinkle_specials(x, seed=1, count=6):
  """Puts +-0, +-inf, NaNs with distinct payloads, a subnormal into x (few: no overflow)."""
  x = x.copy()
  flat = words(x).reshape(-1)
  specials = special_words(x.dtype)
  rng = np.random.default_rng(seed)
  idx = rng.choice(flat.size, size=count * len(specials), replace=False)
  flat[idx] = np.array(specials * count, dtype=np.uint64).astype(uint(x.dtype))
  return x


def random_bits(shape, dtype, rng) -> np.ndarray:
  """Uniformly random words (incompressible, NaNs and infs included)."""
  u = uint(dtype)
  return rng.integers(0, np.iinfo(u).max, size=shape, dtype=u, endpoint=True).view(dtype)


def spread_exponents(g: np.ndarray, rng) -> np.ndarray:
  """g's signs and mantissas with exponents uniform over the finite range (nearly every
  element escapes a 7-exponent window; built from bits: no float overflow)."""
  dtype = g.dtype
  u = uint(dtype)
  ebits, man = FIELDS[np.dtype(dtype)]
  e = rng.integers(1, (1 << ebits) - 1, size=g.shape).astype(u)
  keep = ~np.array(((1 << ebits) - 1) << man, dtype=np.uint64).astype(u)
  return ((words(g) & keep) | (e << man)).astype(u).view(dtype)


def bad_block(shape, dtype, kind, seed=7):
  """Data that does not compress (or compresses oddly): one device gets this."""
  rng = np.random.default_rng(seed)
  if kind == "random_bits":
    return random_bits(shape, dtype, rng)
  if kind == "zeros":
    return np.zeros(shape, dtype)
  if kind == "outliers":
    return spread_exponents(gaussian(shape, dtype, seed), rng)
  raise ValueError(kind)


def make(dist: str, n: int, dtype, seed: int = 0, sigma: float = 1.0) -> np.ndarray:
  """n elements of a named distribution (the codec tests' data sets)."""
  rng = np.random.default_rng(seed)
  dtype = np.dtype(dtype)
  if dist == "gauss":
    x = rng.standard_normal(n) * sigma
  elif dist == "laplace":
    x = rng.laplace(size=n) * sigma
  elif dist == "student_t3":
    x = rng.standard_t(3, size=n) * sigma
  elif dist == "relu":
    x = np.maximum(rng.standard_normal(n), 0) * sigma
  elif dist == "zeros":
    x = np.zeros(n)
  elif dist == "constant":
    x = np.full(n, 3.25)
  elif dist == "random_bits":
    return rng.integers(0, 2**(8 * dtype.itemsize), n, dtype=np.uint64).astype(
        uint(dtype)).view(dtype)
  elif dist == "outlier":
    x = rng.standard_normal(n) * sigma
    if n:
      x[rng.integers(n)] = 1e30 if dtype != F16 else 6e4
  elif dist == "specials":
    pats = special_words(dtype, extended=True)
    base = rng.standard_normal(n).astype(dtype)
    wv = base.view(uint(dtype)).copy()
    idx = rng.integers(0, max(n, 1), size=min(n, 4 * len(pats)))
    for k, i in enumerate(idx):
      wv[i] = pats[k % len(pats)]
    return wv.view(dtype)
  else:
    raise ValueError(dist)
  return x.astype(dtype)
