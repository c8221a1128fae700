"""The entropy codec (codec id 2): bit-exact round trips, byte identity with the
reference implementation of docs/format.md, the size contract and the JAX
transformations (jit, vmap, shard_map). Format rules and malformed payloads:
test_entropy_format.py."""
from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src.codecs import window as W

from tests import reference_entropy as ref
from tests.entropy_cases import (BF16, CODE, DISTS, DTYPES, F16, NATIVE, SIZES, assert_bits_equal, ent,
                                 make, native_decode, native_encode, words)


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
