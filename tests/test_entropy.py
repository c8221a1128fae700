"""The entropy codec (codec id 2): bit-exact round trips, byte identity with the
reference implementation of docs/format.md, the size contract, prefix decoding,
malformed payloads (differential fuzz against the reference decoder) and the JAX
transformations (jit, vmap, shard_map)."""
from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import ffi as zffi
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src.codecs import window as W

ent = zc.codecs.get("entropy")   # the entropy codec's contract functions
from tests import reference_entropy as ref

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


@functools.cache
def _enc(n, dtype):
  return jax.jit(ent.encode_rows)


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


# ---- size contract ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_size_contract_matches_native(dtype):
  for n in list(range(0, 40)) + [4095, 4096, 4097, 8191, 8192, 8193, 10**6, 2**31 - 1, 2**32 - 1]:
    assert ent.max_nbytes(dtype, n) == NATIVE.entropy_max_nbytes(CODE[dtype], n), n
    assert ent.min_nbytes(dtype, n) == NATIVE.entropy_min_nbytes(CODE[dtype], n), n
    assert ent.min_nbytes(dtype, n) <= ent.max_nbytes(dtype, n)
    assert ent.max_nbytes(dtype, n) % 128 == 0 and ent.min_nbytes(dtype, n) % 128 == 0
    # a row never exceeds raw by more than the header, directory and 4 bytes a block
    assert ent.max_nbytes(dtype, n) <= 2 * n + 256 + 6 * (-(-n // 4096)) + 128


def test_bad_arguments():
  with pytest.raises(TypeError, match="bfloat16 or float16"):
    ent.encode_rows(jnp.zeros((2, 8), jnp.float32))
  with pytest.raises(TypeError, match="bfloat16 or float16"):
    ent.max_nbytes(np.float32, 8)
  with pytest.raises(ValueError, match="non-negative"):
    ent.max_nbytes(BF16, -1)
  with pytest.raises(TypeError, match="uint8"):
    ent.decode_rows(jnp.zeros((2, 8), jnp.int32), 8, BF16)
  with pytest.raises(TypeError, match="bfloat16 or float16"):
    ent.decode_rows(jnp.zeros((2, 128), jnp.uint8), 8, np.float32)


# ---- round trips through XLA ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dist", DISTS)
def test_roundtrip(dtype, dist):
  for k, n in enumerate(SIZES):
    x = make(dist, n, dtype, seed=k)
    payload, stats = jax.jit(ent.encode_rows)(jnp.asarray(x)[None])
    payload, stats = np.asarray(payload)[0], np.asarray(stats)[0]
    assert payload.shape == (ent.max_nbytes(dtype, n),)
    used = int(stats[2]) * 128
    assert stats[0] == 0 and stats[3] == 0
    assert ent.min_nbytes(dtype, n) <= used <= payload.size
    assert int.from_bytes(payload[16:24].tobytes(), "little") == used
    assert not payload[used:].any(), "bytes past used_nbytes must be zero"
    assert int(stats[1]) == int.from_bytes(payload[36:40].tobytes(), "little")
    y, status = jax.jit(ent.decode_rows, static_argnums=(1, 2))(jnp.asarray(payload)[None], n, dtype)
    assert int(status[0]) == 0, (n, int(status[0]))
    assert_bits_equal(y[0], x)


def test_ratio_and_modes():
  """Gaussian bf16 compresses to >= 1.50; random bits go RAW; one-signed data uses
  the joint (sign+exponent) kind, constant data CONST blocks."""
  n = 1 << 18
  out, _, raws, used = native_encode(make("gauss", n, BF16))
  assert 2 * n / used >= 1.50 and raws == 0
  out, _, raws, used = native_encode(make("random_bits", n, BF16))
  assert raws == n // 4096 and used == ent.max_nbytes(BF16, n)
  out, _, _, used = native_encode(make("softmax", 4096, BF16))
  assert out[64] == 2 | 1 << 2  # the block (at data_off = 56 + align8(2) = 64): HUFF, kind J
  out, _, _, used = native_encode(make("constant", 4096, BF16))
  assert out[64] == 1 | 1 << 2  # CONST, kind J (7 raw bits per element)


def test_large_row():
  n = 4 * 1024 * 1024 + 3
  x = make("student_t3", n, BF16, seed=3)
  payload, stats = jax.jit(ent.encode_rows)(jnp.asarray(x))
  y, status = jax.jit(ent.decode_rows, static_argnums=(1, 2))(payload, n, BF16)
  assert int(status) == 0
  assert_bits_equal(y, x)
  assert 2 * n / (int(stats[2]) * 128) > 1.4


# ---- the reference implementation ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_identical_bytes(dtype):
  cases = [(d, n) for d in DISTS for n in (0, 1, 9, 4097)] + [("gauss", 2 * 4096 + 700),
                                                               ("mixscale", 3 * 4096)]
  for k, (dist, n) in enumerate(cases):
    x = make(dist, n, dtype, seed=100 + k)
    out, status, raws, used = native_encode(x)
    row, rraws = ref.encode_row(words(x), CODE[dtype])
    assert len(row) == used and raws == rraws, (dist, n, len(row), used)
    if bytes(out[:used]) != row:
      i = int(np.flatnonzero(np.frombuffer(row, np.uint8) != out[:used])[0])
      raise AssertionError(f"{dist} n={n}: first differing byte at {i}: {out[i]:#x} != {row[i]:#x}")
    # both decoders read the other's rows
    yr, st = ref.decode_row(bytes(out), n, CODE[dtype])
    assert st == 0
    assert_bits_equal(yr, x)
    yc, st = native_decode(np.frombuffer(row, np.uint8), n, dtype)
    assert st == 0
    assert_bits_equal(yc, x)


def _span_row(dtype, emin: int, span: int, neg: float, blocks: int, seed: int) -> np.ndarray:
  """Full blocks whose coded exponents (format v4: bf16 e, fp16 e << 1 | m9) take
  exactly the span values [emin, emin + span): skewed towards emin (so HUFF wins),
  both ends present in every block; each sign negative with probability neg;
  random low mantissas."""
  rng = np.random.default_rng(seed)
  mb = 7 if dtype == BF16 else 9  # L = M - q, the low mantissa bits
  n = blocks * 4096
  off = np.minimum(rng.geometric(0.25, n) - 1, span - 1)
  off[::4096] = 0
  off[1::4096] = span - 1
  w = ((emin + off) << mb) | rng.integers(0, 1 << mb, n)
  w |= (rng.random(n) < neg).astype(np.int64) << 15
  return w.astype(np.uint16).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pair_path_boundaries_match_reference(dtype):
  """The encoder's pair path (blocks whose exponents span <= 32 values: pair histogram
  and pair writer, kinds E and J) and the single-code path just past it write the
  reference's bytes; the mode bytes show which kind each case exercises."""
  d = 56 + 8  # data_off of a 2-block row: the 56-byte header + align8(2 nb) directory bytes
  cases = [(100, 32), (100, 33), (110, 8)] if dtype == BF16 else [(0, 32), (20, 33), (10, 8), (31, 32)]
  for k, (emin, span) in enumerate(cases):
    for neg, mode in ((0.5, 2), (0.03, 2 | 1 << 2)):  # symmetric: HUFF-E; skewed: HUFF-J
      x = _span_row(dtype, emin, span, neg, 2, seed=300 + k)
      out, status, raws, used = native_encode(x)
      row, rraws = ref.encode_row(words(x), CODE[dtype])
      assert status == 0 and raws == rraws == 0 and len(row) == used, (emin, span, neg)
      assert out[d] == mode, (emin, span, neg, out[d])
      if bytes(out[:used]) != row:
        i = int(np.flatnonzero(np.frombuffer(row, np.uint8) != out[:used])[0])
        raise AssertionError(f"span {span} neg {neg}: first differing byte at {i}: {out[i]:#x} != {row[i]:#x}")
      y, st = native_decode(out, x.size, dtype)
      assert st == 0
      assert_bits_equal(y, x)


def test_code_lengths_network_equals_merge(tmp_path):
  """The encoder's AVX2 package-merge (sorting networks over keys weight << 7 | tag,
  used for 2..64 present symbols) gives the same code lengths as the scalar merge
  and the normative code_lengths of entropy_format.h on random and adversarial
  histograms (ties of leaves with leaves and with packages, powers of two,
  geometric and Fibonacci counts, sparse symbols): tests/entropy_pm_check.cc
  includes ffi/entropy_cpu.cc and compares all three. (The checker catches a wrong
  tie rule or a wrong slot table: both mutations tried give thousands of
  mismatches.)"""
  import shutil
  import subprocess
  gxx = shutil.which("g++") or shutil.which("c++")
  if gxx is None:
    pytest.skip("no host C++ compiler")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  exe = tmp_path / "pm_check"
  subprocess.run([gxx, "-std=c++17", "-O1", "-I" + os.path.join(root, "ffi"), "-isystem", jax.ffi.include_dir(),
                  os.path.join(root, "tests", "entropy_pm_check.cc"), "-o", str(exe), "-lpthread"],
                 check=True, timeout=300)
  res = subprocess.run([str(exe), "300000", "5"], capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
  if "no AVX2" in res.stdout:
    pytest.skip(res.stdout.strip())
  m = re.search(r"cases=(\d+) network=(\d+) mismatches=(\d+)", res.stdout)
  assert m and int(m.group(3)) == 0 and int(m.group(2)) > 200000, res.stdout[-2000:]


# ---- format version 4: fp16 symbols carry the top mantissa bit (q = 1) --------------------------------


def test_v4_symbol_facts():
  """The format's per-dtype facts (docs/format.md "Symbols and raw bits"): q, the
  coded exponent's width, alphabets, raw widths and planes; every one of the 2^16
  words splits into (symbol, raw) and joins back exactly, in both kinds."""
  assert ref.VERSION == ent.FORMAT_VERSION == 5   # (the symbols are those of version 4)
  assert ref.QBITS == {1: 0, 2: 1}
  from zipccl_jax._src.codecs import entropy as ent_module
  assert {ent_module._DTYPES[d][0]: ent_module._DTYPES[d][3] for d in DTYPES} == {1: 0, 2: 1}
  assert ref.coded_bits(1) == (8, 7) and ref.coded_bits(2) == (6, 9)
  # (byte plane?, packed width): bf16 E byte plane only, J 7 packed; fp16 E byte
  # plane + 2 (s, m8), J byte plane + 1 (m8)
  assert [ref.raw_layout(1, k) for k in (0, 1)] == [(True, 0), (False, 7)]
  assert [ref.raw_layout(2, k) for k in (0, 1)] == [(True, 2), (True, 1)]
  w = np.arange(1 << 16, dtype=np.uint16)
  for dcode, alphabets in ((1, (256, 512)), (2, (64, 128))):
    for kind, a in zip((0, 1), alphabets):
      sym, raw = ref.split(w, dcode, kind)
      assert sym.min() == 0 and sym.max() == a - 1 and np.unique(sym).size == a
      bp, pw = ref.raw_layout(dcode, kind)
      assert raw.max() == (1 << ((8 if bp else 0) + pw)) - 1
      assert_bits_equal(ref.join(sym, raw, dcode, kind), w)
  # fp16: the symbol holds e and m9 (bits 14..9), the raw value m[8:0] (+ s in kind E)
  v = np.array([0x3E00, 0x3C00, 0xBDFF, 0x0200, 0x8001], np.uint16)
  assert ref.split(v, 2, 0)[0].tolist() == [0x1F, 0x1E, 0x1E, 0x01, 0x00]
  assert ref.split(v, 2, 0)[1].tolist() == [0, 0, 0x3FF, 0, 0x201]
  assert ref.split(v, 2, 1)[0].tolist() == [0x3E, 0x3C, 0x3D, 0x02, 0x01]


def test_v4_fp16_block_widths_in_cpp():
  """The C++ encoder's fp16 raw planes have the v4 widths: CONST-E = 4 + len + 2 len / 8
  (byte plane m[7:0] + packed s, m8), CONST-J = 4 + len + len / 8 (+ m8), CONST-E /
  CONST-J symbols are coded exponents (e << 1 | m9); bytes equal the reference's."""
  rng = np.random.default_rng(5)
  n = 4096
  # one coded exponent c = 0x1E << 1 | 1 (m9 = 1), both signs: CONST-E
  low = rng.integers(0, 1 << 9, n).astype(np.uint16)
  x = ((0x1E << 10) | (1 << 9) | low | (rng.integers(0, 2, n).astype(np.uint16) << 15)).view(F16)
  out = _both_encode(x)
  assert _block_modes(out, n) == [(1, 0x3D, 4 + n + 2 * n // 8)]
  # the same with one sign: CONST-J, symbol c << 1 | s
  x = ((0x1E << 10) | (1 << 9) | low | 0x8000).view(F16)
  assert _block_modes(_both_encode(x), n) == [(1 | 1 << 2, 0x3D << 1 | 1, 4 + n + n // 8)]
  # one element: CONST-J (6 bytes) ties with RAW (6 bytes) and wins (RAW comes last)
  # (1.5 = 0x3E00: e 15, m9 1, sign +: J symbol (15 << 1 | 1) << 1 | 0)
  assert _block_modes(_both_encode(np.array([1.5], F16)), 1) == [(1 | 1 << 2, 0xF << 2 | 1 << 1, 6)]


def _fp16_specials(n: int, seed: int) -> np.ndarray:
  """Gaussian fp16 words with +-0, +-inf, NaNs with distinct payloads (quiet and
  signalling: m9 set and clear), subnormals with m9 = 0 / 1, the largest finite
  values, each at random positions."""
  rng = np.random.default_rng(seed)
  w = (rng.standard_normal(n) * 0.02).astype(F16).view(np.uint16).copy()
  pats = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7C01, 0x7D55, 0x7E00, 0x7FFF, 0xFE01, 0xFDAA, 0x0001,
          0x01FF, 0x0200, 0x03FF, 0x8001, 0x83FF, 0x7BFF, 0xFBFF, 0x0400, 0x8400]
  for k, i in enumerate(rng.permutation(n)[:min(n, 3 * len(pats))]):
    w[i] = pats[k % len(pats)]
  return w.view(F16)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 9, 4095, 4097, 2 * 4096 + 77])
def test_v4_fp16_specials_identical_and_exact(n):
  """fp16 specials (NaN payloads, +-inf, +-0, subnormals of either m9) in odd sizes:
  C++ bytes == reference bytes, both decoders bit-exact."""
  _both_encode(_fp16_specials(n, seed=n))


def test_v4_fp16_all_kinds():
  """fp16 blocks of every mode (CONST-E/J/Z, HUFF-E/J/Z, RAW) encode to the reference's
  bytes and decode exactly; HUFF-Z blocks keep the raw values of elements with c != 0
  only (m9 is in the symbol, so a ReLU block's raw planes are 9 bits an element)."""
  rng = np.random.default_rng(8)
  g = (rng.standard_normal(4096) * 0.02).astype(F16)
  blocks = [
      np.full(4096, 1.5, F16),                                   # CONST-J
      np.where(rng.random(4096) < 0.5, 1.5, -1.5).astype(F16),  # CONST-E
      np.zeros(4096, F16),                                       # CONST-Z
      g,                                                         # HUFF-E
      np.abs(g),                                                 # HUFF-J
      np.maximum(rng.standard_normal(4096), 0).astype(F16),      # HUFF-Z
      rng.integers(0, 1 << 16, 4096).astype(np.uint16).view(F16),  # RAW
  ]
  x = np.concatenate(blocks)
  out = _both_encode(x)
  modes = [m for m, _, _ in _block_modes(out, x.size)]
  assert modes == [5, 1, 9, 2, 6, 10, 0], modes
  relu = blocks[5]
  nz = int((relu.view(np.uint16) & 0x7FFF != 0).sum())
  _, _, size = _block_modes(out, x.size)[5]
  nib_and_area = size - 20 - (nz + -(-nz // 8))  # kind J planes of nz values: 9 bits each
  assert 0 < nib_and_area < 4096, size


def test_v4_fp16_corrupted_statuses_equal():
  """Corrupted fp16 rows (all kinds, specials) with the checksum recomputed: the C++ and
  reference decoders report the same status and the same words."""
  rng = np.random.default_rng(44)
  rows = []
  for x in (_fp16_specials(2 * 4096 + 5, 1), np.maximum(rng.standard_normal(4096 + 33), 0).astype(F16),
            make("mixscale", 4096, F16, seed=3), make("softmax", 4096, F16, seed=4)):
    out, _, _, used = native_encode(x)
    rows.append((x, out, used))
  counts = {}
  for it in range(160):
    x, out, used = rows[it % len(rows)]
    b = out.copy()
    for _ in range(int(rng.integers(1, 3))):
      i = int(rng.integers(56, used))  # past the header: directory and block data
      b[i] ^= np.uint8(1 << int(rng.integers(8)))
    _fix_checksum(b)
    st, sr = _statuses(b, x.size, F16)
    assert st == sr, (it, st, sr)
    counts[st] = counts.get(st, 0) + 1
  assert counts.get(0, 0) > 0 and sum(v for s, v in counts.items() if s in (6, 7)) > 0, counts


# ---- kind Z (zero elision, format version 3) -------------------------------------------------------


def _block_modes(out: np.ndarray, n: int) -> list:
  """(mode byte, bytes 2..3, size) of every block of an encoded row."""
  nb = -(-n // 4096)
  doff = 56 + -(-2 * nb // 8) * 8
  sizes = np.frombuffer(out[56:56 + 2 * nb].tobytes(), "<u2").astype(int)
  offs = doff + np.concatenate([[0], np.cumsum(sizes)])
  return [(int(out[o]), int(out[o + 2]) | int(out[o + 3]) << 8, int(z)) for o, z in zip(offs[:-1], sizes)]


def _both_encode(x):
  """Encodes x by C++ and by the reference; asserts identical bytes, both decoders
  exact; returns the C++ row."""
  out, status, raws, used = native_encode(x)
  row, rraws = ref.encode_row(words(x), CODE[x.dtype])
  assert status == 0 and len(row) == used and raws == rraws
  if bytes(out[:used]) != row:
    i = int(np.flatnonzero(np.frombuffer(row, np.uint8) != out[:used])[0])
    raise AssertionError(f"first differing byte at {i}: {out[i]:#x} != {row[i]:#x}")
  y, st = native_decode(out[:used], x.size, x.dtype)
  assert st == 0
  assert_bits_equal(y, x)
  yr, st = ref.decode_row(row, x.size, CODE[x.dtype])
  assert st == 0
  assert_bits_equal(yr, x)
  return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_kind_z_modes(dtype):
  """Which blocks elide their zeros: all-+0 / all--0 blocks are CONST-Z (4 bytes,
  symbol 0 / 1), ReLU blocks (either sign of zero) HUFF-Z, a block with a subnormal
  never kind Z; bytes equal the reference's."""
  n = 2 * 4096 + 5
  for dist, sym in (("zeros", 0), ("negzeros", 1)):
    modes = _block_modes(_both_encode(make(dist, n, dtype)), n)
    assert modes == [(9, sym, 4)] * 3, modes
  for dist in ("relu", "relu_neg", "zero_mix"):
    x = make(dist, 4 * 4096, dtype, seed=3)
    w = words(x)
    modes = _block_modes(_both_encode(x), x.size)
    for b, (mode, _, _) in enumerate(modes):
      blk = w[4096 * b:4096 * (b + 1)]
      sub = ((blk & 0x7FFF) > 0) & ((blk & 0x7FFF) < (1 << (7 if dtype == BF16 else 10)))
      if sub.any():  # (fp16 ReLU data has an occasional subnormal)
        assert mode >> 2 != 2, (dist, b, mode)
      else:
        assert mode == 10, (dist, b, mode)
  x = make("relu_sub", 4 * 4096, dtype, seed=4)
  modes = _block_modes(_both_encode(x), x.size)
  assert [m >> 2 == 2 for m, _, _ in modes][1::2] == [False, False], modes  # blocks with a subnormal
  assert modes[0][0] == 10, modes
  # +0 and -0 only (no raw planes at all): HUFF-Z of 2 one-bit codes
  x = np.where(np.random.default_rng(5).random(4096) < 0.5, 0.0, -0.0).astype(dtype)
  (mode, sym_end, size), = _block_modes(_both_encode(x), 4096)
  assert (mode, sym_end, size) == (10, 2, 20 + 1 + 512)
  for n in (1, 2, 7, 9, 4095, 4097):  # short blocks, odd sizes
    for dist in ("relu", "zero_mix", "negzeros", "relu_sub"):
      _both_encode(make(dist, n, dtype, seed=n))


def _paired_block(dtype, z: int, seed: int) -> np.ndarray:
  """4096 elements: (4096 - z) / 2 Gaussian magnitudes with both signs and z / 2
  zeros of each sign, shuffled: every exponent's sign counts are equal, so the
  sign imbalance is 0 and kind J's lengths are computed only by the zero rule."""
  rng = np.random.default_rng(seed)
  m = (4096 - z) // 2
  mag = np.abs(rng.standard_normal(m)) + 1e-3
  v = np.concatenate([mag, -mag, np.zeros(z // 2), -np.zeros(z - z // 2)])
  return rng.permutation(v).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kind_z_choice_rule(dtype):
  """Kind Z is a candidate exactly when the format says: with balanced signs (no
  imbalance) a block with z = 254 zeros stays HUFF-E although HUFF-Z would be
  smaller (16 z < len: kind J's lengths are not computed), z = 256 is HUFF-Z."""
  for z, mode in ((254, 2), (256, 10)):
    x = _paired_block(dtype, z, seed=z)
    w = words(x)
    assert ((w & 0x7FFF) == 0).sum() == z
    (got, _, size), = _block_modes(_both_encode(x), 4096)
    assert got == mode, (z, got)
  # the same 254 zeros with one extra +0 in place of a -0 (imbalance 2: 16 * 2 < 4096)
  # changes nothing; + 1 subnormal in the 256-zero block: no Z (HUFF-E)
  x = words(_paired_block(dtype, 256, seed=256)).copy()
  x[np.flatnonzero(x == 0)[0]] = 1
  (got, _, _), = _block_modes(_both_encode(x.view(dtype)), 4096)
  assert got == 2, got


def _huff_raw_part(blk: bytes) -> int:
  """r = a HUFF block's bytes after its code lengths and bit streams (raw planes)."""
  sym_end = int.from_bytes(blk[2:4], "little")
  _, nib = ref.parse_nibbles(blk[20:], sym_end, 512)
  total = sum(int.from_bytes(blk[4 + 2 * i:6 + 2 * i], "little") for i in range(8))
  return len(blk) - 20 - nib - -(-total // 8)


def test_kind_z_ties_go_to_huff_j():
  """bf16 kind J packs 8 mantissas in 7 bytes: one zero in a 4090-element block
  saves no whole group (ceil(4089 / 8) = ceil(4090 / 8) = 512 groups), so HUFF-Z
  ties HUFF-J and the tie goes to HUFF-J (mode 6, 3584 raw bytes); two zeros save
  a group: HUFF-Z (mode 10), 511 groups = 3577 raw bytes."""
  rng = np.random.default_rng(8)
  base = (np.abs(rng.standard_normal(4090)) + 1e-3).astype(BF16)  # one-signed: kind J
  for z, mode, r in ((0, 6, 3584), (1, 6, 3584), (2, 10, 3577)):
    w = words(base).copy()
    w[[100, 2000][:z]] = 0
    out = _both_encode(w.view(BF16))
    (got, _, size), = _block_modes(out, 4090)
    assert got == mode, (z, got)
    assert _huff_raw_part(out[64:64 + size].tobytes()) == r, z   # data_off of one block: 64


def _rewrite_last_block(b: np.ndarray, n: int, delta: int) -> np.ndarray:
  """A copy of the row b whose last block is delta bytes longer (zeros appended)
  or shorter, with the directory, data_bytes, used_nbytes and checksum updated."""
  b = b.copy()
  nb = -(-n // 4096)
  doff = 56 + -(-2 * nb // 8) * 8
  sizes = np.frombuffer(b[56:56 + 2 * nb].tobytes(), "<u2").astype(int)
  data = int(sizes.sum())
  sizes[-1] += delta
  b[56 + 2 * (nb - 1):56 + 2 * nb] = np.frombuffer(int(sizes[-1]).to_bytes(2, "little"), np.uint8)
  if delta > 0:
    b[doff + data:doff + data + delta] = 0
  data += delta
  used = -(-(doff + data) // 128) * 128
  b[doff + data:used] = 0
  b[used:] = 0
  b[48:56] = np.frombuffer(data.to_bytes(8, "little"), np.uint8)
  b[16:24] = np.frombuffer(used.to_bytes(8, "little"), np.uint8)
  _fix_checksum(b)
  return b


def _statuses(b: np.ndarray, n: int, dtype):
  y, st = native_decode(b, n, dtype)
  yr, sr = ref.decode_row(b.tobytes(), n, CODE[dtype])
  if st:
    assert (y == 0xFFFF).all()
  assert_bits_equal(y, yr)
  return st, sr


@pytest.mark.parametrize("dtype", DTYPES)
def test_kind_z_corrupted_blocks(dtype):
  """Malformed kind Z blocks give the format's statuses in both decoders: CONST-Z with
  a symbol >= 2 or a size other than 4, HUFF-Z raw planes (r) outside [0,
  raw_bytes(J, len)] -> 6; r in range but != raw_bytes(J, nz) -> 7; RAW with kind
  bits and kind 3 -> 6."""
  n = 2 * 4096
  out = native_encode(make("zeros", n, dtype))[0]
  assert [m for m, _, _ in _block_modes(out, n)] == [9, 9]
  last = 64 + 4  # the last block's offset (data_off 56 + align8(2 * 2) = 64, block 0: 4 bytes)
  for sym, want in ((1, 0), (2, 6), (0xFFFF, 6)):
    b = out.copy()
    b[last + 2:last + 4] = np.frombuffer(sym.to_bytes(2, "little"), np.uint8)
    _fix_checksum(b)
    assert _statuses(b, n, dtype) == (want, want), sym
  assert _statuses(_rewrite_last_block(out, n, 1), n, dtype) == (6, 6)
  for mode in (8, 13, 14, 11):  # RAW with kind Z bits; kind 3 CONST / HUFF; coding 3
    b = out.copy()
    b[last] = mode
    _fix_checksum(b)
    assert _statuses(b, n, dtype) == (6, 6), mode

  x = make("relu", n, dtype, seed=21)
  out = native_encode(x)[0]
  (m0, _, s0), (m1, _, s1) = _block_modes(out, n)
  assert m1 == 10
  nz = int(((words(x)[4096:] & 0x7FFF) != 0).sum())
  mb = 7 if dtype == BF16 else 9  # kind J raw width M - q (format v4: fp16 q = 1)
  raw_j = lambda k: (k if mb >= 8 else 0) + -(-k // 8) * (mb - 8 if mb >= 8 else mb)
  r = raw_j(nz)
  for delta, want in ((0, 0), (1, 7), (-1, 7), (raw_j(4096) - r, 7), (raw_j(4096) - r + 1, 6), (-r, 7),
                      (-r - 1, 6)):
    assert _statuses(_rewrite_last_block(out, n, delta), n, dtype) == (want, want), delta
  # r = 0 exactly is a valid size for a block whose elements are all +-0 only


# ---- prefix decoding and malformed rows -------------------------------------------------------------


@pytest.mark.parametrize("dist", ["gauss", "relu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefix_decoding(dtype, dist):
  n = 3 * 4096 + 77
  x = make(dist, n, dtype, seed=5)
  out, _, _, used = native_encode(x)
  for L in (used, used + 1, used + 128, used + 1000, out.size):
    buf = np.zeros(L, np.uint8)
    buf[:min(L, out.size)] = out[:min(L, out.size)]
    y, st = native_decode(buf, n, dtype)
    assert st == 0, L
    assert_bits_equal(y, x)
  # bytes past used are ignored, whatever they hold
  buf = out.copy()
  buf[used:] = 0xAB
  y, st = native_decode(buf, n, dtype)
  assert st == 0
  for L in (0, 1, 127, 128, used - 128, used - 1):
    y, st = native_decode(out[:L], n, dtype)
    assert st == 3, (L, st)
    assert (y == 0xFFFF).all()
  # through XLA with a static L that is a prefix of the row
  p, s = jax.jit(ent.encode_rows)(jnp.asarray(x)[None])
  L = int(s[0, 2]) * 128
  y, st = jax.jit(ent.decode_rows, static_argnums=(1, 2))(p[:, :L], n, dtype)
  assert int(st[0]) == 0
  assert_bits_equal(y[0], x)


def test_header_errors():
  n = 5000
  x = make("gauss", n, BF16)
  out, _, _, used = native_encode(x)

  def status(mut, dtype=BF16, nn=n):
    b = out.copy()
    mut(b)
    return native_decode(b, nn, dtype)[1]

  assert status(lambda b: b.__setitem__(0, 0)) == 1
  assert status(lambda b: b.__setitem__(4, 1)) == 1
  assert status(lambda b: b.__setitem__(6, 1)) == 1
  assert status(lambda b: None, dtype=F16) == 2
  assert status(lambda b: None, nn=n + 1) == 3
  assert status(lambda b: b.__setitem__(16, 1)) == 3
  assert status(lambda b: b.__setitem__(7, 1)) == 4
  assert status(lambda b: b.__setitem__(7, 2)) == 5
  assert status(lambda b: b.__setitem__(33, 4)) == 5
  assert status(lambda b: b.__setitem__(35, 1)) == 5      # the reserved byte
  assert status(lambda b: b.__setitem__(63, 1)) == 5      # the directory's padding (nb = 2: 60..63)
  assert status(lambda b: b.__setitem__(56, b[56] + 1)) == 6   # block 0's size
  assert status(lambda b: b.__setitem__(used - 1, 1)) == 8


def _fix_checksum(b: np.ndarray) -> None:
  used = int.from_bytes(b[16:24].tobytes(), "little")
  if used % 128 == 0 and 128 <= used <= b.size:
    b[24:32] = np.frombuffer(ref.checksum(b[:used].tobytes()).to_bytes(8, "little"), np.uint8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fuzz_corrupted(dtype):
  """Seeded corruption: every change inside [0, used) is reported (checksum); with the
  checksum recomputed, the C++ and reference decoders agree on status and values."""
  rng = np.random.default_rng(1234)
  rows = []
  for dist, n in (("gauss", 4096 + 300), ("gelu", 2 * 4096), ("constant", 40), ("zeros", 9000),
                  ("random_bits", 600), ("softmax", 4096), ("streamskew", 2 * 4096 + 700),
                  ("relu", 2 * 4096 + 300), ("zero_mix", 4096 + 9)):
    x = make(dist, n, dtype, seed=int(rng.integers(1000)))
    out, _, _, used = native_encode(x)
    rows.append((x, out, used))
  counts = {}
  for it in range(300):
    x, out, used = rows[it % len(rows)]
    n = x.size
    b = out.copy()
    k = int(rng.integers(1, 4))
    for _ in range(k):
      i = int(rng.integers(0, used))
      b[i] ^= np.uint8(1 << int(rng.integers(8))) if rng.integers(2) else np.uint8(rng.integers(1, 256))
    changed = (b[:used] != out[:used]).any()
    y, st = native_decode(b, n, dtype)
    if changed:
      assert st != 0, it
      assert (y == 0xFFFF).all()
    if it % 2 == 0 and changed:
      _fix_checksum(b)
      y, st = native_decode(b, n, dtype)
      yr, sr = ref.decode_row(b.tobytes(), n, CODE[dtype])
      assert st == sr, (it, st, sr)
      assert_bits_equal(y, yr)
      counts[st] = counts.get(st, 0) + 1
  # the differential half exercised both structural errors and silent value changes
  assert counts.get(0, 0) > 0 and sum(v for s, v in counts.items() if s in (5, 6, 7)) > 0, counts


def test_fuzz_garbage_rows():
  """Random bytes behind a valid header never crash; statuses only."""
  rng = np.random.default_rng(99)
  x = make("gauss", 3 * 4096, BF16)
  out, _, _, used = native_encode(x)
  for it in range(60):
    b = out.copy()
    lo = 56 if it % 2 else 64    # the directory (3 blocks: 56..61, padding to 64), or past it
    b[lo:used] = rng.integers(0, 256, used - lo).astype(np.uint8)
    _fix_checksum(b)
    y, st = native_decode(b, x.size, BF16)
    if st:
      assert (y == 0xFFFF).all()
    yr, sr = ref.decode_row(b.tobytes(), x.size, 1)
    assert st == sr, (it, st, sr)


# ---- JAX transformations ---------------------------------------------------------------------------


def test_vmap_and_batched_rows():
  xs = np.stack([make(d, 5000, BF16, seed=i) for i, d in enumerate(["gauss", "gelu", "zeros"])])
  p1, s1 = jax.jit(ent.encode_rows)(jnp.asarray(xs))
  p2, s2 = jax.jit(jax.vmap(ent.encode_rows))(jnp.asarray(xs))
  np.testing.assert_array_equal(np.asarray(p1), np.asarray(p2))
  np.testing.assert_array_equal(np.asarray(s1), np.asarray(s2))
  y, st = jax.vmap(lambda p: ent.decode_rows(p, 5000, BF16))(p1)
  assert not np.asarray(st).any()
  assert_bits_equal(y, xs)


def test_shard_map(mesh8):
  n = 4096 + 5
  x = np.stack([make("laplace", n, BF16, seed=i) for i in range(8)])

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh8, in_specs=P("x"), out_specs=(P("x"), P("x"), P("x")))
  def f(xs):
    payload, stats = ent.encode_rows(xs)
    used = stats[:, 2:3] * 128
    # the largest used size on any device, then a prefix of it: the ladder's shape
    y, status = ent.decode_rows(payload, n, BF16)
    return y, status, used

  y, status, used = f(jnp.asarray(x))
  assert not np.asarray(status).any()
  assert_bits_equal(y, x)
  assert np.asarray(used).shape == (8, 1)


def test_registry_entry():
  import zipccl_jax as zc
  c = zc.codecs.get("entropy")
  assert c.codec_id == 2 and c.encode_target == ent.ENCODE_TARGET
  assert c.decode_target == ent.DECODE_TARGET
  assert c.supports(BF16) and c.supports(F16) and not c.supports(np.float32)
  assert c.max_nbytes(BF16, 5000) == ent.max_nbytes(BF16, 5000)


def test_collectives_move_entropy_rows_on_the_ladder(mesh8):
  """codec="entropy" through the slot ladder: bit-identical gathers, a compressed rung
  for bf16; fp32 (not an entropy dtype) moves raw words."""
  import zipccl_jax as zc

  def f(x):
    return zc.compressed_all_gather(x, "x", tiled=True, to="invarying", codec="entropy",
                                    policy="always", stats=True)

  g = jax.jit(jax.shard_map(f, mesh=mesh8, in_specs=P("x"), out_specs=(P(), P())))
  x = make("gauss", 8 * 8192, BF16, seed=5).reshape(64, 1024)
  y, s = g(jnp.asarray(x))
  assert_bits_equal(np.asarray(y), x)
  assert s.codec == "entropy" and s.compressed and not bool(s.raw_rung)
  assert int(s.wire_bytes) < 2 * 8192
  assert "raw_block_rate=0.0000 " in s.summary() and "escape_rate" not in s.summary()
  x32 = make("gauss", 8 * 4096, np.float32, seed=6).reshape(64, 512)
  y32, s32 = g(jnp.asarray(x32))
  assert_bits_equal(np.asarray(y32), x32)
  assert not s32.compressed


def test_zero_heavy_rows_take_the_rungs_below_the_floor(mesh8):
  """ReLU rows (half +0: kind Z, ratio ~2.7) under the entropy codec go on a rung
  below the ladder's floor (1.6): the wire ratio of the gather is above 2, on an
  all-to-all transport (psum_scatter) above 1.9; every result exact."""
  import zipccl_jax as zc
  x = make("relu", 8 * 65536, BF16, seed=7).reshape(512, 1024)
  g = jax.jit(jax.shard_map(
      lambda v: zc.compressed_all_gather(v, "x", tiled=True, to="invarying", codec="entropy",
                                         policy="always", stats=True),
      mesh=mesh8, in_specs=P("x"), out_specs=(P(), P())))
  y, s = g(jnp.asarray(x))
  assert_bits_equal(np.asarray(y), x)
  ladder = zc.codec_ladder("entropy", BF16, 65536)
  floor = -(-ent.impl.ladder_floor(BF16, 65536) // 128) * 128
  assert int(np.asarray(s.rung)[0]) < ladder.index(floor)
  assert float(s.ratio) > 2.0, float(s.ratio)
  r = jax.jit(jax.shard_map(
      lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec="entropy", policy="always",
                                           stats=True),
      mesh=mesh8, in_specs=P("x"), out_specs=(P("x"), P())))
  raw = jax.jit(jax.shard_map(lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec="raw"),
                              mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  got, st = r(jnp.asarray(x))
  assert_bits_equal(np.asarray(got), np.asarray(raw(jnp.asarray(x))))
  assert float(st.ratio) > 1.9, float(st.ratio)


def test_codec_ladder_is_what_the_transport_compiles():
  import zipccl_jax as zc
  for a2a in (False, True):
    lad = zc.codec_ladder("entropy", BF16, 8192, all_to_all=a2a)
    n_low = ladder_lib.ALL_TO_ALL_LOW_RUNGS if a2a else ladder_lib.LOW_RUNGS
    floor = -(-ent.impl.ladder_floor(BF16, 8192) // 128) * 128
    assert lad.index(floor) == n_low
    assert lad[n_low:] == ladder_lib.ladder(ent.impl.ladder_floor(BF16, 8192), 2 * 8192, all_to_all=a2a)
    assert all(a % 128 == 0 and a >= ent.min_nbytes(BF16, 8192) for a in lad)
    assert all(b <= a * 5 / 4 + 128 for a, b in zip(lad[:n_low + 1], lad[1:n_low + 1]))
  assert zc.codec_ladder("zipccl", BF16, 8192) == ladder_lib.ladder(W.min_nbytes(BF16, 8192), 16384)
  with pytest.raises(ValueError, match="codec must be one of"):
    zc.codec_ladder("zstd", BF16, 8192)
  with pytest.raises(TypeError, match="does not take dtype float32"):
    zc.codec_ladder("entropy", np.float32, 8192)
  with pytest.raises(ValueError, match="m must be a positive int"):
    zc.codec_ladder("entropy", BF16, 0)


def test_threads_give_identical_bytes(tmp_path):
  """A row big enough for several threads, with RAW blocks in every thread's range:
  the bytes equal a single-threaded encoding (run in a subprocess, since the thread
  count is read once per process), and it round-trips."""
  import subprocess
  import sys
  n = (1 << 21) + 4096 * 3 + 17
  x = make("gauss", n, BF16, seed=11)
  w = words(x).copy()
  w[::4096 * 7] = 0x7FC1                     # a NaN payload now and then
  w[4096 * 5:4096 * 6] = np.random.default_rng(2).integers(0, 1 << 16, 4096)  # one RAW block
  w[-4096 * 300:-4096 * 299] = np.random.default_rng(3).integers(0, 1 << 16, 4096)
  x = w.view(BF16)
  out, status, raws, used = native_encode(x)
  assert status == 0 and raws >= 2  # (+ the 17-element tail block, RAW when smaller)
  y, st = native_decode(out[:used], n, BF16)
  assert st == 0
  assert_bits_equal(y, x)
  np.save(tmp_path / "x.npy", w)
  code = ("import numpy as np, sys; import zipccl_jax as zc; import ml_dtypes;"
          "w = np.load(sys.argv[1]); from zipccl_jax._src import ffi as zffi; N = zffi.native();"
          "out = np.zeros(zc.codecs.get('entropy').max_nbytes(ml_dtypes.bfloat16, w.size), np.uint8);"
          "s = N.entropy_encode_into(1, w.view(np.uint8), w.size, out);"
          "out.tofile(sys.argv[2])")
  env = dict(os.environ, ZIPCCL_NUM_THREADS="1")
  subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.npy"), str(tmp_path / "one")],
                 check=True, env=env, timeout=120)
  one = np.fromfile(tmp_path / "one", np.uint8)
  assert one.size == out.size
  bad = np.flatnonzero(one != out)
  assert bad.size == 0, f"{bad.size} bytes differ from the 1-thread encoding; first at {bad[0]}"


def test_short_payload_under_jit():
  """L = 0 and L < used through XLA: status 3 (BAD_SIZE), rows all-one bits."""
  dec = jax.jit(ent.decode_rows, static_argnums=(1, 2))
  y, st = dec(jnp.zeros((2, 0), jnp.uint8), 5, BF16)
  assert np.asarray(st).tolist() == [3, 3]
  assert (words(y) == 0xFFFF).all()
  p, s = jax.jit(ent.encode_rows)(jnp.asarray(make("gauss", 3000, F16))[None])
  used = int(s[0, 2]) * 128
  y, st = dec(p[:, :used - 128], 3000, F16)
  assert int(st[0]) == 3 and (words(y) == 0xFFFF).all()
  y, st = dec(p, 3000, BF16)  # the wrong dtype
  assert int(st[0]) == 2 and (words(y) == 0xFFFF).all()


def test_portable_path_identical(tmp_path):
  """ZIPCCL_DISABLE_SIMD=1 (read once per process, so in a subprocess) selects the
  portable block code and checksum: its encodings are byte-identical to this
  process's (AVX2 where the CPU has it), and each path decodes the other's bytes."""
  import subprocess
  import sys
  cases = [("gauss", 70001, BF16), ("specials", 3 * 4096 + 511, BF16), ("gelu", 2 * 4096 + 5, BF16),
           ("softmax", 12345, F16), ("specials", 4097, F16), ("constant", 5000, BF16),
           ("random_bits", 4096 + 1, F16), ("laplace", 9, BF16), ("mixscale", 8 * 4096, F16),
           ("relu", 3 * 4096 + 13, BF16), ("zero_mix", 2 * 4096 + 3, F16), ("relu_sub", 4 * 4096, BF16),
           ("negzeros", 4097, F16)]
  names = []
  for k, (dist, n, dtype) in enumerate(cases):
    x = make(dist, n, dtype, seed=40 + k)
    out, status, _, used = native_encode(x)
    assert status == 0
    np.save(tmp_path / f"x{k}.npy", words(x))
    np.save(tmp_path / f"p{k}.npy", out[:used])
    names.append(f"{k}:{CODE[np.dtype(dtype)]}")
  code = (
      "import numpy as np, sys; import zipccl_jax as zc; from zipccl_jax._src import ffi as zffi; N = zffi.native(); d = sys.argv[1]\n"
      "for item in sys.argv[2:]:\n"
      "  k, c = map(int, item.split(':')); w = np.load(f'{d}/x{k}.npy'); n = w.size\n"
      "  out = np.zeros(N.entropy_max_nbytes(c, n), np.uint8)\n"
      "  s, raws, used = N.entropy_encode_into(c, w.view(np.uint8), n, out)\n"
      "  np.save(f'{d}/q{k}.npy', out[:used])\n"
      "  y = np.zeros(n, np.uint16)\n"
      "  st = N.entropy_decode_into(c, np.load(f'{d}/p{k}.npy'), n, y.view(np.uint8))\n"
      "  np.save(f'{d}/y{k}.npy', np.append(y, np.uint16(st)))\n")
  env = dict(os.environ, ZIPCCL_DISABLE_SIMD="1", ZIPCCL_NUM_THREADS="1")
  subprocess.run([sys.executable, "-c", code, str(tmp_path)] + names, check=True, env=env, timeout=120)
  for k, (dist, n, dtype) in enumerate(cases):
    p, q = np.load(tmp_path / f"p{k}.npy"), np.load(tmp_path / f"q{k}.npy")
    assert p.size == q.size, (dist, n, p.size, q.size)
    bad = np.flatnonzero(p != q)
    assert bad.size == 0, f"{dist} n={n}: portable bytes differ at {bad[0]}: {q[bad[0]]:#04x} != {p[bad[0]]:#04x}"
    y = np.load(tmp_path / f"y{k}.npy")
    assert y[-1] == 0, f"{dist} n={n}: portable decoder status {y[-1]}"
    assert_bits_equal(y[:-1], words(make(dist, n, dtype, seed=40 + k)))
    y2, st = native_decode(q, n, dtype)
    assert st == 0
    assert_bits_equal(y2, words(make(dist, n, dtype, seed=40 + k)))


# ---- the public encode/decode take codec="entropy" -------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_public_encode_decode_with_the_entropy_codec(dtype):
  rng = np.random.default_rng(11)
  x = (rng.standard_normal((3, 5000)) * 0.02).astype(np.float32).astype(dtype)
  enc = zc.encode(x, codec="entropy")
  assert enc.codec == "entropy" and int(enc.status) == 0
  assert enc.payload.shape == (ent.max_nbytes(dtype, x.size),)
  used = int(enc.used_nbytes)
  assert used < x.nbytes    # it compresses
  assert_bits_equal(np.asarray(zc.decode(enc)), x)
  # a prefix of used bytes is enough (what a collective's slot carries)
  cut = zc.Encoded(enc.payload[:used], enc.escape_count, enc.status, enc.used_units,
                   enc.shape, enc.dtype, "entropy")
  assert_bits_equal(np.asarray(jax.jit(zc.decode)(cut)), x)
  # too short a prefix: an error eagerly, all-one bits under jit
  short = zc.Encoded(enc.payload[:used - 128], enc.escape_count, enc.status, enc.used_units,
                     enc.shape, enc.dtype, "entropy")
  with pytest.raises(ValueError, match="entropy decode failed"):
    zc.decode(short)
  y, st = jax.jit(functools.partial(zc.decode, return_status=True))(short)
  assert int(st) != 0 and np.all(np.asarray(y).view(np.uint16) == 0xFFFF)


def test_public_encode_rejects_what_the_entropy_codec_does_not_take():
  with pytest.raises(TypeError, match="does not encode float32"):
    zc.encode(np.zeros(16, np.float32), codec="entropy")
  with pytest.raises(ValueError, match="codec must be one of"):
    zc.encode(np.zeros(16, np.float32), codec="huffman")


# ---- analyze(x, codec="entropy") ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_analyze_with_the_entropy_codec(dtype):
  """analyze measures the entropy codec through its contract functions: used bytes as
  the native row encoder reports them, the ladder's slot as the wire, the round trip."""
  for dist, n in (("gauss", 3 * 4096 + 17), ("random_bits", 5000), ("zeros", 1), ("gauss", 0)):
    x = make(dist, n, dtype, seed=5)
    a = zc.analyze(x, codec="entropy")
    _, status, raws, used = native_encode(x)
    assert a.codec == "entropy" and a.roundtrip_ok and a.fits
    assert a.actual_nbytes == used and a.count == raws
    rungs = zc.codec_ladder("entropy", dtype, n) if n else ()
    assert a.wire_nbytes == next((r for r in rungs if r >= used), 2 * n)
    assert a.escape_count is None and a.escape_rate is None
    if n:
      assert a.ratio == pytest.approx(2 * n / used)
  assert zc.analyze(make("gauss", 50_000, dtype), codec="entropy").ratio > 1.1


def test_analyze_refuses_what_the_codec_does_not_take():
  with pytest.raises(ValueError, match="codec 'entropy' takes bfloat16, float16, got x of dtype float32"):
    zc.analyze(np.zeros(8, np.float32), codec="entropy")
  with pytest.raises(ValueError, match="analyze: codec must be one of"):
    zc.analyze(np.zeros(8, np.float32), codec="nope")


# ---- the unused tail of a row on every kind of output memory --------------------------------


def test_tail_is_zero_on_any_output_memory(tmp_path):
  """A large unused tail (>= 1 MiB) is zeroed without touching pages that are absent
  from a private anonymous mapping (mincore + MADV_FREE); every other kind of memory
  gets stores. Bytes must equal an encoding into a zeroed buffer whatever the buffer
  held: dirty heap memory, fresh anonymous pages, and mappings whose absent pages
  read back nonzero contents (a private or shared file mapping with its page cache
  dropped, a shared anonymous mapping)."""
  import mmap
  n = 1 << 24  # all-zero input: CONST blocks, ~17 MB of tail (> 4096 pages: mincore chunks)
  x = np.zeros(n, np.uint16)
  size = NATIVE.entropy_max_nbytes(1, n)
  want = np.zeros(size, np.uint8)
  _, _, used = NATIVE.entropy_encode_into(1, x.view(np.uint8), n, want)
  assert size - used >= 1 << 20

  def check(buf, what):
    _, _, u = NATIVE.entropy_encode_into(1, x.view(np.uint8), n, buf)
    got = np.asarray(buf)
    bad = np.flatnonzero(got != want)
    assert u == used and bad.size == 0, f"{what}: byte {bad[0]} is {got[bad[0]]:#04x}, expected {want[bad[0]]:#04x}"

  check(np.full(size, 0xAB, np.uint8), "dirty heap buffer")
  m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  a = np.frombuffer(m, np.uint8)
  a[: size // 2] = 0xCD  # half resident and dirty, half never touched
  check(a, "private anonymous mapping")
  m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
  check(np.frombuffer(m, np.uint8), "shared anonymous mapping")
  path = tmp_path / "payload.bin"
  for flags in (mmap.MAP_PRIVATE, mmap.MAP_SHARED):
    path.write_bytes(b"\xab" * size)
    fd = os.open(path, os.O_RDWR)
    try:
      os.fsync(fd)
      os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # absent pages read 0xAB back
      m = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
      m.madvise(mmap.MADV_RANDOM)  # no readahead: the tail's pages stay absent until read
    finally:
      os.close(fd)
    check(np.frombuffer(m, np.uint8), f"file mapping (flags {flags})")
