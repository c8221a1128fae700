"""Data and native entry points shared by the entropy codec's tests (test_entropy.py,
test_entropy_format.py): distributions of training-like and adversarial values, and
the native encoder and decoder called on numpy buffers."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import zipccl_jax as zc
from zipccl_jax._src import ffi as zffi

ent = zc.codecs.get("entropy")   # the entropy codec's contract functions

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
DTYPES = [BF16, F16]
CODE = {BF16: 1, F16: 2}
NATIVE = zffi.native()


def words(x) -> np.ndarray:
  return np.asarray(x).reshape(-1).view(np.uint16)


def assert_bits_equal(a, b):
  wa, wb = words(a), words(b)
  assert wa.shape == wb.shape, (wa.shape, wb.shape)
  bad = np.flatnonzero(wa != wb)
  if bad.size:
    i = bad[0]
    raise AssertionError(f"{bad.size} words differ; first at {i}: {wa[i]:#06x} != {wb[i]:#06x}")


def gelu(v):
  return 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v**3)))


def make(dist: str, n: int, dtype, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  dtype = np.dtype(dtype)
  if dist == "gauss":
    x = rng.standard_normal(n)
  elif dist == "laplace":
    x = rng.laplace(size=n) * 1e-3
  elif dist == "student_t3":
    x = rng.standard_t(3, size=n)
  elif dist == "gelu":
    x = gelu(rng.standard_normal(n))
  elif dist == "softmax":
    z = rng.standard_normal(-(-n // 1024) * 1024).reshape(-1, 1024) * 2
    p = np.exp(z - z.max(1, keepdims=True))
    x = (p / p.sum(1, keepdims=True)).reshape(-1)[:n]
  elif dist == "mixscale":
    m = -(-n // 1024) * 1024
    x = (rng.standard_normal(m).reshape(-1, 1024) *
         np.exp2(rng.uniform(-20, 0, (m // 1024, 1)))).reshape(-1)[:n]
  elif dist == "relu":
    x = np.maximum(rng.standard_normal(n), 0)
  elif dist == "relu_neg":  # -relu: the zeros are -0, the rest negative
    x = -np.maximum(rng.standard_normal(n), 0)
  elif dist == "zero_mix":  # 40% zeros of either sign among Gaussian values
    x = np.where(rng.random(n) < 0.4, np.where(rng.random(n) < 0.5, 0.0, -0.0), rng.standard_normal(n))
  elif dist == "negzeros":
    x = np.full(n, -0.0)
  elif dist == "relu_sub":
    # ReLU outputs with one subnormal in every other block (blocks 1, 3, ..): those
    # blocks may not elide their zeros (kind Z), the others may.
    w = np.maximum(rng.standard_normal(n), 0).astype(dtype).view(np.uint16).copy()
    w[4096 + 100::8192] = 3  # exponent 0, mantissa 3
    return w.view(dtype)
  elif dist == "streamskew":
    # Every third 512-element bit stream spreads its exponents wide (long codes),
    # the others sit on one exponent (1-bit codes): the 8 streams a block decodes
    # interleaved end at very different rates (the decoder's round/tail split).
    m = -(-n // 512) * 512
    seg = np.arange(m) // 512
    wide = rng.standard_normal(m) * np.exp2(rng.integers(-30, 12, m).astype(np.float64))
    x = np.where(seg % 3 == 1, wide, 1.0 + 0.5 * rng.random(m))[:n]
  elif dist == "zeros":
    x = np.zeros(n)
  elif dist == "constant":
    x = np.full(n, -3.25)
  elif dist == "random_bits":
    return rng.integers(0, 1 << 16, n).astype(np.uint16).view(dtype)
  elif dist == "subnormal":
    w = rng.integers(0, 1 << (7 if dtype == BF16 else 10), n).astype(np.uint16)
    w |= (rng.integers(0, 2, n).astype(np.uint16) << 15)
    return w.view(dtype)
  elif dist == "specials":
    mb = 7 if dtype == BF16 else 10
    expo = (0xFF if dtype == BF16 else 0x1F) << mb
    pats = [0, 0x8000, expo, expo | 0x8000, expo | 1, expo | (1 << (mb - 1)) | 5,
            expo | 0x8000 | 3, 1, 0x8001, (1 << mb) - 1, (1 << mb) | 1]
    w = rng.standard_normal(n).astype(dtype).view(np.uint16).copy()
    idx = rng.integers(0, max(n, 1), size=min(n, 4 * len(pats)))
    for k, i in enumerate(idx):
      w[i] = pats[k % len(pats)]
    return w.view(dtype)
  else:
    raise ValueError(dist)
  return x.astype(dtype)


DISTS = ["gauss", "laplace", "student_t3", "gelu", "softmax", "mixscale", "relu", "zeros",
         "constant", "random_bits", "subnormal", "specials", "streamskew", "relu_neg", "zero_mix",
         "negzeros", "relu_sub"]
SIZES = [0, 1, 7, 8, 9, 511, 4095, 4096, 4097, 3 * 4096 + 511]


def native_encode(x):
  x = np.asarray(x)
  n = x.size
  out = np.zeros(ent.max_nbytes(x.dtype, n), np.uint8)
  status, raws, used = NATIVE.entropy_encode_into(CODE[x.dtype], words(x).view(np.uint8), n, out)
  return out, status, raws, used


def native_decode(buf, n, dtype):
  y = np.zeros(n, np.uint16)
  st = NATIVE.entropy_decode_into(CODE[np.dtype(dtype)], np.array(buf, np.uint8), n,
                                  y.view(np.uint8))
  return y, st
