"""The zipccl codec: bit-exact round trips, byte-identity with the reference
implementation of docs/format.md, the static-size contract, rows that do not fit,
the AVX2 and portable paths, and the JAX transformations (jit, vmap, shard_map).
Malformed payloads: test_window_malformed.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src.codecs import window as W
from tests import reference_window as ref
from zipccl_jax._src.codecs import registry
from tests.reference import BF16, DTYPES, assert_bits_equal, make, special_words, uint, words  # noqa: F401
from tests.window_cases import CODE, NATIVE, _decode_status, check_against_reference, host_encode, roundtrip


# ---- round trips, byte-identical to the reference --------------------------------------

SIZES = [0, 1, 7, 301, 2047, 2048, 2049, 6143, 40_000]
DISTS = ["gauss", "laplace", "student_t3", "relu", "zeros", "constant", "random_bits",
         "outlier", "specials"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_sizes_match_reference(dtype, n):
  status, _, _ = check_against_reference(make("gauss", n, dtype, seed=n, sigma=0.02))
  assert status == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dist", DISTS)
def test_distributions_match_reference(dtype, dist):
  x = make(dist, 9000, dtype, seed=7)
  # The FFI encoder's bytes (random bits do not fit: DOES_NOT_FIT, still byte-exact)...
  status, count, _ = check_against_reference(x)
  esc_bytes = int(ref.encode(x)[0][56:64].view("<u8")[0])   # what the capacity counts (v4)
  assert status == (1 if esc_bytes > ref.max_capacity(dtype, x.size) else 0)
  if dist not in ("random_bits", "specials", "laplace", "student_t3"):
    assert status == 0
  # ...and every distribution round-trips with room for all escapes.
  assert check_against_reference(x, cap=x.size)[0] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sigma_sweep(dtype):
  lo = {BF16: -8, np.dtype(np.float16): -4, np.dtype(np.float32): -8}[dtype]
  hi = 3 if dtype != np.float16 else 3
  for k, sigma in enumerate(np.logspace(lo, hi, 12)):
    x = make("gauss", 5000, dtype, seed=k, sigma=sigma)
    _, count, _ = check_against_reference(x)
    if dtype != np.float16 or 1e-3 < sigma < 1e3:  # fp16 under/overflows outside
      assert count < 0.05 * x.size, (sigma, count)


def test_gaussian_escape_rate_and_ratio():
  n = 1 << 20
  x = make("gauss", n, BF16, seed=1, sigma=0.02)
  enc, y = roundtrip(x)
  assert_bits_equal(y, x)
  rate = int(enc.escape_count) / n
  assert 0.015 < rate < 0.03, rate
  assert 2 * n / int(enc.used_nbytes) > 1.40
  assert enc.payload.size == W.max_nbytes(BF16, n) >= 2 * n


def test_outlier_block_does_not_escape_whole_block():
  x = make("gauss", 2048, BF16, seed=3, sigma=0.01)
  x[100] = np.float32(1e30)
  _, count, _ = check_against_reference(x)
  assert count < 0.05 * 2048


def test_relu_uses_zero_mode():
  x = make("relu", 8192, BF16, seed=5)
  status, count, _ = check_against_reference(x)
  # half the elements are zero: zero mode codes them instead of escaping them
  assert status == 0 and count < 0.05 * x.size
  rec = np.asarray(zc.encode(jnp.asarray(x)).payload)[128:128 + 8 * 4].reshape(4, 8)
  assert (rec[:, 7] & 1 == 1).all()   # mode bit (bits 1..7: the escape split)


def test_nan_payloads_and_signed_zeros_bit_exact():
  pats = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7FA5, 0x0001,
                   0x8001, 0x007F, 0x3F80], np.uint16)
  x = np.tile(pats, 500).view(BF16)
  check_against_reference(x)
  assert check_against_reference(x, cap=x.size)[0] == 0


def test_small_rows_with_specials_fit():
  """max_nbytes leaves >= 128 escape bytes, so a small row with a few specials fits."""
  for dtype in DTYPES:
    w = uint(dtype)
    inf = {BF16: 0x7F80, np.dtype(np.float16): 0x7C00, np.dtype(np.float32): 0x7F800000}[dtype]
    x = np.array([inf], w).view(dtype)
    status, count, used = check_against_reference(x)
    assert (status, count) == (0, 1) and used == W.min_nbytes(dtype, 1) + 128


def test_large_row_16m():
  n = 16 * 1024 * 1024 + 3
  x = make("gauss", n, BF16, seed=11, sigma=0.05)
  enc, y = roundtrip(x)
  assert int(enc.status) == 0
  assert_bits_equal(y, x)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 0xFFFF), min_size=0, max_size=5000),
       st.sampled_from([0, 1, 64, None]))
def test_property_any_bf16_bits(vals, cap):
  x = np.array(vals, np.uint16).view(BF16)
  status, count, _ = check_against_reference(x, cap)
  room = ref.max_capacity(BF16, x.size) if cap is None else cap
  # The capacity counts escape-stream bytes (format v4: w-bit values, w <= 8).
  esc_bytes = int(ref.encode(x, cap)[0][56:64].view("<u8")[0])
  assert esc_bytes <= count
  assert status == (1 if esc_bytes > room else 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1,
                max_size=3000), st.sampled_from(DTYPES))
def test_property_any_floats(vals, dtype):
  with np.errstate(over="ignore"):
    x = np.array(vals, np.float32).astype(dtype)
  check_against_reference(x)
  assert check_against_reference(x, x.size)[0] == 0


# ---- static-size contract ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_size_contract_python_matches_cpp(dtype):
  for n in [0, 1, 2, 7, 2047, 2048, 2049, 4097, 10**6 + 1, 2**31 - 1, 2**40 + 5, 2**56]:
    mx, mn = W.max_nbytes(dtype, n), W.min_nbytes(dtype, n)
    assert (mx, mn) == (NATIVE.max_nbytes(CODE[dtype], n), NATIVE.min_nbytes(CODE[dtype], n)), n
    assert (mx, mn) == (ref.max_nbytes(dtype, n), ref.min_nbytes(dtype, n)), n
    assert mx % 128 == 0 and mn % 128 == 0 and mn <= mx
    assert mx >= -(-n * dtype.itemsize // 128) * 128          # at least the raw size
    assert mx - mn >= (128 if n else 0)
    for cap in [0, 1, 127, 128, 129, n]:
      assert NATIVE.row_nbytes(CODE[dtype], n, cap) == mn + -(-cap // 128) * 128
    assert W.workspace_nbytes(n) == NATIVE.workspace_nbytes(n)
  # Beyond the layout's range both refuse instead of wrapping.
  for n in [2**56 + 1, 2**64 - 1]:
    with pytest.raises(ValueError, match="n"):
      W.max_nbytes(dtype, n)
    with pytest.raises(ValueError, match="n must be"):
      NATIVE.max_nbytes(CODE[dtype], n)


def test_host_codec_rejects_sizes_that_would_wrap():
  """encode_into / decode_into check n and the capacity before any layout arithmetic
  (a capacity near 2^64 used to wrap the size check and write out of bounds)."""
  x = make("gauss", 1000, BF16)
  out = np.zeros(NATIVE.max_nbytes(1, 1000) + 4096, np.uint8)
  for cap in (2**64 - 1, 2**64 - 128, 2**63, 2**62 + 1):
    with pytest.raises(ValueError, match="capacity"):
      NATIVE.encode_into(1, x.view(np.uint8), 1000, cap, out)
    with pytest.raises(ValueError, match="capacity"):
      NATIVE.row_nbytes(1, 1000, cap)
  for n in (2**32, 2**63, 2**64 - 1):
    with pytest.raises(ValueError, match="n must be < 2\\^32"):
      NATIVE.encode_into(1, x.view(np.uint8), n, 0, out)
    with pytest.raises(ValueError, match="n must be < 2\\^32"):
      NATIVE.decode_into(1, out, n, np.zeros(8, np.uint8))
  with pytest.raises(ValueError, match="out must have >= "):
    NATIVE.encode_into(1, x.view(np.uint8), 1000, 2**40, out)
  assert NATIVE.encode_into(1, x.view(np.uint8), 1000, 128, out)[0] == 0


# ---- rows that do not fit ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_does_not_fit_guard_bytes_and_refusal(dtype):
  x = make("random_bits", 5000, dtype, seed=2)
  cap = 128
  nbytes = NATIVE.row_nbytes(CODE[dtype], x.size, cap)
  guard = 4096
  out = np.full(nbytes + guard, 0xA5, np.uint8)
  status, count, used = NATIVE.encode_into(CODE[dtype], x.view(np.uint8), x.size, cap, out)
  assert status == 1 and count > cap and used == nbytes   # escapes > cap, their bytes too
  assert (out[nbytes:] == 0xA5).all(), "encoder wrote past its output"
  want, rstatus, rcount, rused = ref.encode(x, cap)
  assert (rstatus, rcount, rused) == (status, count, used)
  assert (out[:nbytes] == want).all()
  assert _decode_status(dtype, out[:nbytes], x.size)[0] == 4
  # The FFI encoder: DOES_NOT_FIT at max_nbytes, used_units one past the payload.
  enc = zc.encode(jnp.asarray(x))
  assert int(enc.status) == 1 and bool(enc.overflowed)
  assert int(enc.used_units) == W.max_nbytes(dtype, x.size) // 128 + 1
  assert int(enc.used_nbytes) > enc.payload.size
  with pytest.raises(ValueError, match="DOES_NOT_FIT"):
    zc.decode(enc)


def test_exact_capacity_boundary():
  """The capacity counts escape-stream bytes (header field escape_bytes, format v4):
  a row fits exactly when they are at most the capacity."""
  x = make("gauss", 4096, BF16, seed=9)
  p = np.asarray(zc.encode(jnp.asarray(x)).payload)
  esc_bytes = int(p[56:64].view("<u8")[0])
  assert 0 < esc_bytes < int(zc.encode(jnp.asarray(x)).escape_count)   # < a byte per escape
  assert host_encode(x, esc_bytes)[1] == 0
  assert host_encode(x, esc_bytes - 1)[1] == 1
  check_against_reference(x, esc_bytes)
  check_against_reference(x, esc_bytes - 1)


# ---- AVX2 block paths vs the portable block code -----------------------------------------
#
# Full blocks of bf16 and fp16 take AVX2 kernels where the CPU has them; partial last
# blocks and ZIPCCL_DISABLE_SIMD=1 take the portable code. The variable is read once
# per process, so each path runs in a subprocess of its own, whatever this process's
# environment says, on the same inputs and the same (corrupted) buffers.

_PATH_SCRIPT = """
import json, sys
import numpy as np
import zipccl_jax as zc
from zipccl_jax._src import ffi as zffi; N = zffi.native(); d = sys.argv[1]; tag = sys.argv[2]
spec = json.load(open(f"{d}/spec.json"))
for k, (code, n, cap) in enumerate(spec["enc"]):
  w = np.load(f"{d}/x{k}.npy")
  out = np.zeros(N.row_nbytes(code, n, cap), np.uint8)
  status, count, used = N.encode_into(code, w.view(np.uint8), n, cap, out)
  np.save(f"{d}/{tag}_enc{k}.npy", np.concatenate([np.array([status, count, used], np.uint64).view(np.uint8), out]))
  y = np.full(n * w.itemsize, 0x5A, np.uint8)
  st = N.decode_into(code, out[:used], n, y) if status == 0 else -1
  np.save(f"{d}/{tag}_dec{k}.npy", np.append(y.view(w.dtype).astype(np.int64), st))
for k, (code, n, isz) in enumerate(spec["bad"]):
  q = np.load(f"{d}/q{k}.npy")
  y = np.full(n * isz, 0x5A, np.uint8)
  st = N.decode_into(code, q, n, y)
  np.save(f"{d}/{tag}_bad{k}.npy", np.append(y.astype(np.int64), st))
"""


def _run_paths(tmp_path, enc_items, bad_items):
  """Runs _PATH_SCRIPT with the SIMD path allowed and with ZIPCCL_DISABLE_SIMD=1 on
  the inputs enc_items [(x, capacity)] and the buffers bad_items [(buffer, n, dtype)].
  Returns {"simd": ..., "portable": ...}, each {"enc": [(status, count, used, row)],
  "dec": [(words, status)], "bad": [(row bytes, status)]}."""
  import json
  import os
  import subprocess
  import sys
  spec = {"enc": [], "bad": []}
  for k, (x, cap) in enumerate(enc_items):
    np.save(tmp_path / f"x{k}.npy", words(x))
    spec["enc"].append([CODE[x.dtype], int(x.size), int(cap)])
  for k, (q, n, dtype) in enumerate(bad_items):
    np.save(tmp_path / f"q{k}.npy", np.ascontiguousarray(q))
    spec["bad"].append([CODE[np.dtype(dtype)], int(n), np.dtype(dtype).itemsize])
  (tmp_path / "spec.json").write_text(json.dumps(spec))
  res = {}
  for tag in ("simd", "portable"):
    env = dict(os.environ, ZIPCCL_NUM_THREADS="1")
    env.pop("ZIPCCL_DISABLE_SIMD", None)
    if tag == "portable":
      env["ZIPCCL_DISABLE_SIMD"] = "1"
    subprocess.run([sys.executable, "-c", _PATH_SCRIPT, str(tmp_path), tag], check=True, env=env,
                   timeout=300)
    r = {"enc": [], "dec": [], "bad": []}
    for k in range(len(enc_items)):
      e = np.load(tmp_path / f"{tag}_enc{k}.npy")
      status, count, used = (int(v) for v in e[:24].view(np.uint64))
      r["enc"].append((status, count, used, e[24:]))
      dv = np.load(tmp_path / f"{tag}_dec{k}.npy")
      r["dec"].append((dv[:-1], int(dv[-1])))
    for k in range(len(bad_items)):
      b = np.load(tmp_path / f"{tag}_bad{k}.npy")
      r["bad"].append((b[:-1].astype(np.uint8), int(b[-1])))
    res[tag] = r
  return res


def _first_diff(a, b, what):
  bad = np.flatnonzero(a != b)
  assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[0]}: {int(a[bad[0]]):#x} != {int(b[bad[0]]):#x}"


def _simd_cases(dtype):
  """(name, x) inputs for the path comparison: every distribution at block-boundary
  sizes, full blocks followed by a partial one."""
  dtype = np.dtype(dtype)
  u = uint(dtype)
  ebits, mbits = {BF16: (8, 7), np.dtype(np.float16): (5, 10)}[dtype]
  rng = np.random.default_rng(20261201 + CODE[dtype])
  cases = []
  # Gaussians across the dtype's range: fp16 1e-6 is mostly subnormal, 1e-4 straddles
  # the normal range's bottom, 3e4 overflows to +-inf a third of the time.
  scales = [1e-6, 1e-4, 0.02, 1.0, 300.0, 3e4] if dtype != BF16 else [1e-30, 1e-3, 0.02, 1.0, 1e20]
  for k, s in enumerate(scales):
    with np.errstate(over="ignore"):  # the overflow to +-inf is the point
      cases.append((f"gauss{s:g}", make("gauss", 3 * 2048 + 5, dtype, seed=k, sigma=s)))
  for dist, n in [("laplace", 2 * 2048), ("student_t3", 4 * 2048 + 1), ("relu", 2048),
                  ("constant", 2 * 2048 + 2047), ("zeros", 2049), ("random_bits", 3 * 2048 + 7),
                  ("outlier", 2 * 2048 + 9), ("specials", 4 * 2048 + 3)]:
    cases.append((dist, make(dist, n, dtype, seed=n, sigma=0.02)))
  # zero-heavy: 90% +-0 between Gaussians (the zero mode, signed zeros)
  z = make("gauss", 3 * 2048 + 100, dtype, seed=3, sigma=0.02)
  w = words(z).copy()
  w[rng.random(w.size) < 0.9] = 0
  w[rng.random(w.size) < 0.3] |= u(1 << (8 * dtype.itemsize - 1))
  cases.append(("zero_heavy", w.view(dtype)))
  # subnormal-heavy: exponent 0, random sign and mantissa, with a few normals
  w = rng.integers(0, 1 << (8 * dtype.itemsize), 2 * 2048 + 33, dtype=np.uint64).astype(u)
  w &= u(~(((1 << ebits) - 1) << mbits) & ((1 << (8 * dtype.itemsize)) - 1))
  w[rng.random(w.size) < 0.05] |= u(7 << mbits)
  cases.append(("subnormal_heavy", w.view(dtype)))
  # all specials: +-0, +-inf, NaNs with distinct payloads, subnormals, nothing else
  pats = np.array(special_words(dtype, extended=True), np.uint64).astype(u)
  nan = np.arange(1, 2 * 2048 + 1, dtype=np.uint64).astype(u) & u((1 << mbits) - 1)
  nan |= u(((1 << ebits) - 1) << mbits)
  w = np.where(rng.random(nan.size) < 0.5, nan | u(1), rng.choice(pats, nan.size))
  cases.append(("all_specials", w.view(dtype)))
  # ramps: every bit pattern of the dtype in order, and a slow ramp over exponents
  cases.append(("ramp_all_words", np.arange(1 << 16, dtype=np.uint64).astype(u).view(dtype)))
  cases.append(("ramp_slow", (np.arange(3 * 2048, dtype=np.uint64) * 11).astype(u).view(dtype)))
  # a Gaussian whose scale changes every block (window moves from block to block)
  g = make("gauss", 6 * 2048, dtype, seed=5).astype(np.float32)
  sc = np.repeat(np.float32(2.0) ** np.arange(-9, 3, 2, dtype=np.float32), 2048)
  cases.append(("mixscale", (g * sc).astype(dtype)))
  for n in (0, 1, 7, 2047, 2048, 2049, 40_001):  # sizes: 0, 1, odd, around one block, large
    cases.append((f"n{n}", make("gauss", n, dtype, seed=n, sigma=0.02)))
  return cases


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=lambda d: d.name)
def test_simd_and_portable_paths_are_identical(tmp_path, dtype):
  """The AVX2 block kernels (full blocks of bf16 / fp16) against the portable block
  code: byte-identical rows and stats at three escape capacities (all escapes fit,
  the FFI encoder's, 128 bytes: DOES_NOT_FIT with the escape area cut short), and
  word-identical decodes, for every case of _simd_cases; each path decodes the
  other's rows; and the same statuses and words on corrupted rows (table, plane
  and escape bytes, raw planes; with and without a re-sealed checksum)."""
  dtype = np.dtype(dtype)
  cases = _simd_cases(dtype)
  enc_items = []
  for _, x in cases:
    n = x.size
    ffi_cap = W.max_nbytes(dtype, n) - W.min_nbytes(dtype, n)
    enc_items += [(x, n), (x, ffi_cap), (x, 128)]
  # Corrupted rows: mutations of valid encodings that reach the block decoder.
  rng = np.random.default_rng(77 + CODE[dtype])
  bad_items = []
  for name, x in cases:
    if x.size < 2048 or name == "ramp_all_words":
      continue
    n = x.size
    p, status, count, used = host_encode(x, n)
    assert status == 0
    p = p[:used]
    esc_bytes = int(p[56:64].view("<u8")[0])
    nb = -(-n // 2048)
    P = 6 if dtype == np.float16 else 3
    raw_off = 128 + -(-nb * 8 // 128) * 128
    plane_off = raw_off + -(-n // 128) * 128
    esc_off = W.min_nbytes(dtype, n)   # plane section: full blocks, the last one cut short
    for t in range(12):
      q = p.copy()
      kind = t % 4
      if kind == 0:    # one bit of a full block's planes (codes, or fp16's raw planes)
        i = plane_off + int(rng.integers((n // 2048) * P * 256))
        q[i] ^= np.uint8(1 << int(rng.integers(8)))
      elif kind == 1:  # a byte of the escape streams: random, or mostly ones
        if esc_bytes == 0:
          continue
        q[esc_off + int(rng.integers(esc_bytes))] = rng.choice([32, 0x80, 0xFF, int(rng.integers(256))])
      elif kind == 2:  # a window byte (base or mode) or the count byte of a record
        q[128 + 8 * int(rng.integers(nb)) + int(rng.choice([4, 6, 7]))] = rng.integers(256)
      else:            # a few random bytes anywhere in the table, raw, plane or escape sections
        k = int(rng.integers(1, 6))
        q[rng.integers(128, used, k)] = rng.integers(0, 256, k, np.uint8)
      bad_items.append((q, n, dtype))
      bad_items.append((ref.reseal(q), n, dtype))
  res = _run_paths(tmp_path, enc_items, bad_items)
  s, p = res["simd"], res["portable"]
  for k, (x, cap) in enumerate(enc_items):
    what = f"{cases[k // 3][0]} n={x.size} cap={cap}"
    (s_st, s_cnt, s_used, s_row), (p_st, p_cnt, p_used, p_row) = s["enc"][k], p["enc"][k]
    assert (s_st, s_cnt, s_used) == (p_st, p_cnt, p_used), (what, s["enc"][k][:3], p["enc"][k][:3])
    assert s_row.size == p_row.size
    _first_diff(s_row, p_row, f"{what}: encoded bytes, AVX2 vs portable")
    if s_st == 0:
      for tag, r in (("simd", s), ("portable", p)):
        yw, st = r["dec"][k]
        assert st == 0, (what, tag, st)
        _first_diff(yw.astype(uint(dtype)), words(x), f"{what}: {tag} decode")
      # each path decodes the other's row (the same bytes, so this is the cross check)
      st, y = _decode_status(dtype, p_row[:p_used], x.size)
      assert st == 0
      assert_bits_equal(y.view(dtype), x)
  # the FFI-capacity encodings equal this process's FFI encoder and the reference
  for k in range(1, len(enc_items), 9):
    x, _ = enc_items[k]
    want, status, count, used = ref.encode(x)
    assert (s["enc"][k][0], s["enc"][k][1], s["enc"][k][2]) == (status, count, used)
    _first_diff(s["enc"][k][3], want, f"{cases[k // 3][0]}: AVX2 vs the reference")
  statuses = set()
  for k, (q, n, _) in enumerate(bad_items):
    (sy, sst), (py, pst) = s["bad"][k], p["bad"][k]
    assert sst == pst, f"corrupted row {k}: AVX2 status {sst}, portable {pst}"
    _first_diff(sy, py, f"corrupted row {k}: decoded bytes")
    assert 0 <= sst <= 9
    if sst != 0:
      assert (sy == 0xFF).all(), f"corrupted row {k}: status {sst}, row not all-ones"
    statuses.add(sst)
  assert {6, 7, 8} <= statuses, statuses  # the block decoder's checks were reached


# ---- Python API -------------------------------------------------------------------------


def test_api_errors_name_the_argument():
  with pytest.raises(TypeError, match="encode: x must be bfloat16, float16 or float32, got int8"):
    zc.encode(jnp.zeros(4, jnp.int8))
  with pytest.raises(ValueError, match="codec"):
    zc.encode(jnp.zeros(4, jnp.bfloat16), codec="zstd")
  with pytest.raises(TypeError, match="Encoded"):
    zc.decode(np.zeros(4))
  with pytest.raises(TypeError, match="decode_rows: dtype"):
    zc.decode_rows(jnp.zeros((1, 256), jnp.uint8), 4, jnp.int8)
  with pytest.raises(TypeError, match="payload must be uint8"):
    zc.decode_rows(jnp.zeros((1, 256), jnp.int32), 4, jnp.bfloat16)


def test_raw_codec_is_identity_bytes():
  x = make("gauss", 1001, BF16)
  enc = zc.encode(jnp.asarray(x), codec="raw")
  assert enc.payload.size == 2002
  assert_bits_equal(zc.decode(enc), x)


def test_jit_and_shapes():
  x = jnp.asarray(make("gauss", 3 * 5 * 7, BF16).reshape(3, 5, 7))
  f = jax.jit(lambda x: zc.decode(zc.encode(x)))
  assert_bits_equal(f(x), x)
  assert f(x).shape == (3, 5, 7)
  enc = jax.jit(zc.encode)(x)
  assert isinstance(enc, zc.Encoded) and enc.shape == (3, 5, 7)
  assert_bits_equal(zc.decode(enc), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_vmap(dtype):
  x = np.stack([make(d, 3000, dtype, seed=i) for i, d in enumerate(["gauss", "outlier", "relu"])])
  enc = jax.vmap(zc.encode)(jnp.asarray(x))
  assert enc.payload.shape == (3, W.max_nbytes(dtype, 3000))
  for i in range(3):
    want, status, count, used = ref.encode(x[i])
    assert (np.asarray(enc.payload[i]) == want).all()
    assert (int(enc.status[i]), int(enc.escape_count[i]), int(enc.used_units[i])) == (
        status, count, used // 128)
  y = jax.vmap(zc.decode)(enc)
  assert_bits_equal(y, x)
  y2 = jax.jit(jax.vmap(lambda r: zc.decode(zc.encode(r))))(jnp.asarray(x))
  assert_bits_equal(y2, x)


def _mesh():
  devs = np.array(jax.devices())
  return jax.sharding.Mesh(devs, ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


def test_shard_map_keeps_varying_type():
  mesh = _mesh()
  ndev = mesh.devices.size
  per = 3000
  kinds = ["gauss", "random_bits", "zeros", "laplace"]
  x = np.concatenate([make(kinds[i % 4], per, BF16, seed=i) for i in range(ndev)])
  xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("x")))

  def body(xb):
    enc = zc.encode(xb)
    assert jax.typeof(enc.payload).mat.varying == frozenset({"x"})
    return enc.payload[None], zc.decode(enc), enc.status[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x"), P("x"))))
  payload, y, status = (np.asarray(a) for a in f(xs))
  for i in range(ndev):
    xi, yi = x[i * per:(i + 1) * per], y[i * per:(i + 1) * per]
    want, wstatus, _, _ = ref.encode(xi)
    assert (payload[i] == want).all(), f"device {i}"
    assert status[i] == wstatus == (1 if kinds[i % 4] == "random_bits" else 0)
    if wstatus == 0:
      assert_bits_equal(yi, xi)
    else:  # random bits do not fit: not decodable, the row is all-one bits
      assert (words(yi) == 0xFFFF).all()
  if ndev > 1:
    # A replicated out_spec for a per-device payload must be rejected, not return device 0's.
    bad = jax.shard_map(lambda xb: zc.encode(xb).payload, mesh=mesh, in_specs=P("x"), out_specs=P())
    with pytest.raises(Exception):
      jax.jit(bad)(xs)


# ---- analyze ---------------------------------------------------------------------------------


def test_analyze_gaussian():
  x = make("gauss", 200_000, BF16, seed=12, sigma=0.02)
  a = zc.analyze(x)
  assert a.roundtrip_ok and a.fits
  assert 1.45 < a.entropy_ratio < 1.6
  assert 1.38 < a.wire_ratio <= a.ratio < a.entropy_ratio
  # the wire is the first rung of the gather ladder at or above the used size
  rungs = zc.codec_ladder("zipccl", BF16, x.size)
  assert a.wire_nbytes == min(r for r in rungs if r >= a.actual_nbytes)
  assert 0.015 < a.escape_rate < 0.03
  z = zc.analyze(np.zeros(10, np.float32))
  assert z.roundtrip_ok and z.escape_count == 0
  r = zc.analyze(make("random_bits", 5000, BF16))  # does not fit, still measured exactly
  assert r.roundtrip_ok and not r.fits and r.actual_nbytes > W.max_nbytes(BF16, 5000)
  assert r.wire_nbytes == 2 * 5000 and r.wire_ratio == 1.0    # the raw rung


# ---- skipped rows (docs/format.md, "Skipped rows"): both native codecs -------------------------


@pytest.mark.parametrize("name", ["zipccl", "entropy"])
def test_skipped_rows_are_not_coded_and_take_fill(name):
  c = registry.get(name)
  n = 5000
  x = np.stack([make(k, n, BF16, seed=i) for i, k in enumerate(["gauss", "outlier", "relu", "gauss"])])
  full, st_full = c.encode_rows(jnp.asarray(x))
  skip = np.array([0, 1, 0, 1], bool)
  part, st_part = jax.jit(lambda v, s: c.encode_rows(v, skip=s))(jnp.asarray(x), skip)
  for r in (0, 2):   # the rows that are coded: the same bytes and stats
    assert (np.asarray(part[r]) == np.asarray(full[r])).all()
    assert (np.asarray(st_part[r]) == np.asarray(st_full[r])).all()
  assert (np.asarray(st_part)[[1, 3]] == 0).all()
  # decode: skipped rows take their fill row (F = 2 fill rows for 4 rows: rows 0-1
  # take fill[0], rows 2-3 fill[1]), whatever their payload bytes (here garbage)
  fill = np.stack([make("laplace", n, BF16, seed=7), make("zeros", n, BF16, seed=8)])
  garbage = np.asarray(part).copy()
  garbage[[1, 3]] = 0xAB
  y, status = jax.jit(lambda p, s, f: c.decode_rows(p, n, BF16, skip=s, fill=f))(
      jnp.asarray(garbage), skip, jnp.asarray(fill))
  assert (np.asarray(status) == 0).all()
  assert_bits_equal(np.asarray(y)[[0, 2]], x[[0, 2]])
  assert_bits_equal(np.asarray(y)[1], fill[0])
  assert_bits_equal(np.asarray(y)[3], fill[1])
  # without skip the garbage rows fail to decode (all-one bits), so the skip mattered
  y2, status2 = c.decode_rows(jnp.asarray(garbage), n, BF16)
  assert (np.asarray(status2)[[1, 3]] != 0).all() and (np.asarray(status2)[[0, 2]] == 0).all()
  # vmap carries the mask and the fill along
  yv, sv = jax.vmap(lambda p: c.decode_rows(p, n, BF16, skip=skip, fill=fill[:1]))(
      jnp.stack([jnp.asarray(garbage)] * 2))
  assert (np.asarray(sv) == 0).all()
  assert_bits_equal(np.asarray(yv)[1, 3], fill[0])
  assert_bits_equal(np.asarray(yv)[1, 2], x[2])


@pytest.mark.parametrize("name", ["zipccl", "entropy"])
def test_skip_and_fill_are_checked(name):
  c = registry.get(name)
  x = jnp.asarray(make("gauss", 3 * 256, BF16).reshape(3, 256))
  p, _ = c.encode_rows(x)
  with pytest.raises(ValueError, match="skip must have shape"):
    c.encode_rows(x, skip=np.zeros(2, bool))
  with pytest.raises(ValueError, match="skip must have shape"):
    c.decode_rows(p, 256, BF16, skip=np.zeros((3, 1), bool))
  with pytest.raises(ValueError, match="fill must be"):
    c.decode_rows(p, 256, BF16, skip=np.zeros(3, bool), fill=np.zeros((1, 255), BF16))
  with pytest.raises(ValueError, match="fill must be"):
    c.decode_rows(p, 256, BF16, skip=np.zeros(3, bool), fill=np.zeros((1, 256), np.float16))
  with pytest.raises(ValueError, match="must divide"):
    c.decode_rows(p, 256, BF16, skip=np.zeros(3, bool), fill=np.zeros((2, 256), BF16))
  # the handlers check the operands too (a direct FFI call with a wrong fill)
  call = jax.ffi.ffi_call(
      c.decode_target, (jax.ShapeDtypeStruct((3, 256), BF16), jax.ShapeDtypeStruct((3,), jnp.int32),
                        jax.ShapeDtypeStruct((3, c.workspace_nbytes(256)), jnp.uint8)))
  with pytest.raises(Exception, match="fill must be"):
    jax.block_until_ready(call(p, jnp.zeros(3, jnp.uint8), jnp.zeros((2, 256), BF16)))
  with pytest.raises(Exception, match="skip must have one u8 per row"):
    jax.block_until_ready(call(p, jnp.zeros(2, jnp.uint8), jnp.zeros((1, 256), BF16)))
