"""The zipccl codec: bit-exact round trips, byte-identity with the reference
implementation of docs/format.md, the static-size contract, overflow, malformed
payloads, and the JAX transformations (jit, vmap, shard_map)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zc
from tests import reference_codec as ref
from tests.reference import BF16, DTYPES, assert_bits_equal, make, words  # noqa: F401

CODE = {BF16: 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3}
NATIVE = zc.native()


def roundtrip(x, cap=None):
  enc = zc.encode(jnp.asarray(x), escape_capacity=cap)
  return enc, zc.decode(enc)


def check_against_reference(x, cap=None):
  x = np.asarray(x)
  cap = zc.default_escape_capacity(x.size) if cap is None else cap
  enc = zc.encode(jnp.asarray(x), escape_capacity=cap)
  want, status, count = ref.encode(x, cap)
  got = np.asarray(enc.payload)
  assert got.shape == want.shape
  diff = np.flatnonzero(got != want)
  assert diff.size == 0, f"payload differs from the reference at byte {diff[:8]}"
  assert int(enc.status) == status and int(enc.escape_count) == count
  if status == 0:
    assert_bits_equal(zc.decode(enc), x)
    assert_bits_equal(ref.decode(got, x.dtype, x.size, cap), x)
  return enc


# ---- round trips, byte-identical to the reference --------------------------------------

SIZES = [0, 1, 7, 301, 2047, 2048, 2049, 6143, 40_000]
DISTS = ["gauss", "laplace", "student_t3", "relu", "zeros", "constant", "random_bits",
         "outlier", "specials"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_sizes_match_reference(dtype, n):
  check_against_reference(make("gauss", n, dtype, seed=n, sigma=0.02))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dist", DISTS)
def test_distributions_match_reference(dtype, dist):
  x = make(dist, 9000, dtype, seed=7)
  # random bits and Laplace need more escape room than the default: give them all of it
  enc = check_against_reference(x, cap=x.size)
  assert int(enc.status) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sigma_sweep(dtype):
  lo = {BF16: -8, np.dtype(np.float16): -4, np.dtype(np.float32): -8}[dtype]
  hi = 3 if dtype != np.float16 else 3
  for k, sigma in enumerate(np.logspace(lo, hi, 12)):
    x = make("gauss", 5000, dtype, seed=k, sigma=sigma)
    enc = check_against_reference(x)
    if dtype != np.float16 or 1e-3 < sigma < 1e3:  # fp16 under/overflows outside
      assert int(enc.escape_count) < 0.05 * x.size, (sigma, int(enc.escape_count))


def test_gaussian_escape_rate_and_ratio():
  n = 1 << 20
  x = make("gauss", n, BF16, seed=1, sigma=0.02)
  enc, y = roundtrip(x)
  assert_bits_equal(y, x)
  rate = int(enc.escape_count) / n
  assert 0.015 < rate < 0.03, rate
  assert 2 * n / enc.payload.size > 1.40


def test_outlier_block_does_not_escape_whole_block():
  x = make("gauss", 2048, BF16, seed=3, sigma=0.01)
  x[100] = np.float32(1e30)
  enc = check_against_reference(x)
  assert int(enc.escape_count) < 0.05 * 2048


def test_relu_uses_zero_mode():
  x = make("relu", 8192, BF16, seed=5)
  enc = check_against_reference(x)
  # half the elements are zero: zero mode codes them instead of escaping them
  assert int(enc.escape_count) < 0.05 * x.size
  rec = np.asarray(enc.payload)[128:128 + 8 * 4].reshape(4, 8)
  assert (rec[:, 7] == 1).all()


def test_nan_payloads_and_signed_zeros_bit_exact():
  pats = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7FA5, 0x0001,
                   0x8001, 0x007F, 0x3F80], np.uint16)
  x = np.tile(pats, 500).view(BF16)
  check_against_reference(x, cap=x.size)


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
  cap = x.size if cap is None else cap
  enc = check_against_reference(x, cap)
  count = int(enc.escape_count)
  assert int(enc.status) == (1 if count > cap else 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1,
                max_size=3000), st.sampled_from(DTYPES))
def test_property_any_floats(vals, dtype):
  with np.errstate(over="ignore"):
    x = np.array(vals, np.float32).astype(dtype)
  check_against_reference(x, x.size)


# ---- static-size contract ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_size_contract_python_matches_cpp(dtype):
  for n in [0, 1, 2, 7, 2047, 2048, 2049, 10**6, 2**31 - 1, 2**40 + 5]:
    for cap in [0, 1, 127, 128, 129, zc.default_escape_capacity(n), n]:
      assert zc.encoded_nbytes(dtype, n, cap) == NATIVE.encoded_nbytes(CODE[dtype], n, cap)
      assert zc.encoded_nbytes(dtype, n, cap) % 128 == 0
    assert zc.workspace_nbytes(n) == NATIVE.workspace_nbytes(n)


def test_default_capacity():
  assert zc.default_escape_capacity(0) == 0
  assert zc.default_escape_capacity(1) == 128  # whole row: can never overflow
  n = 32 * 1024 * 1024
  cap = zc.default_escape_capacity(n)
  assert cap % 128 == 0 and 0.0375 <= cap / n < 0.0376
  assert zc.encoded_nbytes(BF16, n) == zc.encoded_nbytes(BF16, n, cap)


# ---- overflow --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_overflow_guard_bytes_and_refusal(dtype):
  x = make("random_bits", 5000, dtype, seed=2)
  cap = 128
  nbytes = zc.encoded_nbytes(dtype, x.size, cap)
  guard = 4096
  out = np.full(nbytes + guard, 0xA5, np.uint8)
  status, count = NATIVE.encode_into(CODE[dtype], x.view(np.uint8), x.size, cap, out)
  assert status == 1 and count > cap
  assert (out[nbytes:] == 0xA5).all(), "encoder wrote past its output"
  want, rstatus, rcount = ref.encode(x, cap)
  assert (rstatus, rcount) == (status, count)
  assert (out[:nbytes] == want).all()
  y = np.zeros(x.size * dtype.itemsize, np.uint8)
  assert NATIVE.decode_into(CODE[dtype], out[:nbytes], x.size, cap, y) == 4
  enc = zc.encode(jnp.asarray(x), escape_capacity=cap)
  assert int(enc.status) == 1 and bool(enc.overflowed)
  with pytest.raises(ValueError, match="overflowed"):
    zc.decode(enc)


def test_exact_capacity_boundary():
  x = make("gauss", 4096, BF16, seed=9)
  count = int(zc.encode(jnp.asarray(x), escape_capacity=4096).escape_count)
  assert int(zc.encode(jnp.asarray(x), escape_capacity=count).status) == 0
  assert int(zc.encode(jnp.asarray(x), escape_capacity=count - 1).status) == 1
  check_against_reference(x, count)
  check_against_reference(x, count - 1)


# ---- malformed payloads ------------------------------------------------------------------


def _payload(dtype=BF16, n=5000, seed=4):
  x = make("gauss", n, dtype, seed=seed)
  cap = zc.default_escape_capacity(n)
  return x, cap, np.asarray(zc.encode(jnp.asarray(x), escape_capacity=cap).payload).copy()


def _decode_status(dtype, payload, n, cap):
  y = np.zeros(n * np.dtype(dtype).itemsize, np.uint8)
  return NATIVE.decode_into(CODE[np.dtype(dtype)], np.ascontiguousarray(payload), n, cap, y), y


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_single_bit_flip_is_detected(dtype):
  x, cap, p = _payload(dtype, n=2500)
  assert _decode_status(dtype, p, x.size, cap)[0] == 0
  nbits = p.size * 8
  for bit in range(0, nbits, 1 if dtype == BF16 else 3):
    q = p.copy()
    q[bit // 8] ^= 1 << (bit % 8)
    status, _ = _decode_status(dtype, q, x.size, cap)
    assert status != 0, f"flip of bit {bit} (byte {bit // 8}) not detected"


def test_every_truncation_is_rejected():
  x, cap, p = _payload(n=3000)
  for k in range(0, p.size):
    assert _decode_status(BF16, p[:k], x.size, cap)[0] == 3
  assert _decode_status(BF16, np.concatenate([p, p[:8]]), x.size, cap)[0] == 3


def test_random_corruption_never_gives_a_wrong_answer():
  x, cap, p = _payload(n=20_000, seed=6)
  rng = np.random.default_rng(0)
  for trial in range(400):
    q = p.copy()
    k = int(rng.integers(1, 16))
    pos = rng.integers(0, q.size, k)
    q[pos] = rng.integers(0, 256, k).astype(np.uint8)
    status, y = _decode_status(BF16, q, x.size, cap)
    if np.array_equal(q, p):
      assert status == 0
    else:
      assert status != 0 or np.array_equal(y.view(np.uint16), words(x)), trial


def test_specific_defects_report_their_status():
  x, cap, p = _payload(n=5000)
  n = x.size

  def st_of(mutate):
    q = p.copy()
    mutate(q)
    return _decode_status(BF16, q, n, cap)[0]

  assert st_of(lambda q: q.__setitem__(0, ord("X"))) == 1         # magic
  assert st_of(lambda q: q.__setitem__(4, 2)) == 1                # version
  assert st_of(lambda q: q.__setitem__(5, 3)) == 2                # dtype
  assert st_of(lambda q: q.__setitem__(6, 12)) == 2               # block size
  assert st_of(lambda q: q.__setitem__(8, q[8] ^ 1)) == 3         # n
  assert st_of(lambda q: q.__setitem__(7, 1)) == 4                # overflow flag
  assert st_of(lambda q: q.__setitem__(7, 9)) == 5                # bad status byte
  assert st_of(lambda q: q.__setitem__(100, 1)) == 5              # reserved byte
  assert st_of(lambda q: q.__setitem__(128 + 6, 255)) == 6        # invalid window base
  assert st_of(lambda q: q.__setitem__(128 + 8, q[128 + 8] + 1)) == 6  # offset of block 1
  assert _decode_status(BF16, p, n + 1, cap)[0] == 3              # caller expects other n
  assert _decode_status(np.float16, p, n, cap)[0] == 2            # caller expects fp16
  with pytest.raises(ValueError, match="checksum"):
    q = p.copy()
    q[-200] ^= 0x10  # an unused escape byte: only the checksum sees it
    zc.decode(zc.Encoded(jnp.asarray(q), jnp.int32(0), jnp.int32(0), (n,), BF16, cap))


# ---- Python API -------------------------------------------------------------------------


def test_api_errors_name_the_argument():
  with pytest.raises(TypeError, match="encode: x must be bfloat16, float16 or float32, got int8"):
    zc.encode(jnp.zeros(4, jnp.int8))
  with pytest.raises(ValueError, match="escape_capacity"):
    zc.encode(jnp.zeros(4, jnp.bfloat16), escape_capacity=-1)
  with pytest.raises(ValueError, match="codec"):
    zc.encode(jnp.zeros(4, jnp.bfloat16), codec="zstd")
  with pytest.raises(TypeError, match="static"):
    jax.jit(lambda c: zc.encode(jnp.zeros(4, jnp.bfloat16), escape_capacity=c))(3)
  with pytest.raises(TypeError, match="Encoded"):
    zc.decode(np.zeros(4))


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
  x = np.stack([make(d, 3000, dtype, seed=i) for i, d in enumerate(["gauss", "laplace", "relu"])])
  enc = jax.vmap(lambda r: zc.encode(r, escape_capacity=3000))(jnp.asarray(x))
  assert enc.payload.shape == (3, zc.encoded_nbytes(dtype, 3000, 3000))
  for i in range(3):
    want, _, count = ref.encode(x[i], 3000)
    assert (np.asarray(enc.payload[i]) == want).all()
    assert int(enc.escape_count[i]) == count
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
  x = np.concatenate([make(["gauss", "random_bits", "zeros", "laplace"][i % 4], per, BF16, seed=i)
                      for i in range(ndev)])
  xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("x")))

  def body(xb):
    enc = zc.encode(xb, escape_capacity=per)
    assert jax.typeof(enc.payload).mat.varying == frozenset({"x"})
    return enc.payload[None], zc.decode(enc), enc.status[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x"), P("x"))))
  payload, y, status = (np.asarray(a) for a in f(xs))
  assert_bits_equal(y, x)
  assert (np.asarray(status) == 0).all()
  for i in range(ndev):
    want, _, _ = ref.encode(x[i * per:(i + 1) * per], per)
    assert (payload[i] == want).all(), f"device {i}"
  if ndev > 1:
    # A replicated out_spec for a per-device payload must be rejected, not return device 0's.
    bad = jax.shard_map(lambda xb: zc.encode(xb, escape_capacity=per).payload, mesh=mesh,
                        in_specs=P("x"), out_specs=P())
    with pytest.raises(Exception):
      jax.jit(bad)(xs)


# ---- analyze ---------------------------------------------------------------------------------


def test_analyze_gaussian():
  x = make("gauss", 200_000, BF16, seed=12, sigma=0.02)
  a = zc.analyze(x)
  assert a.roundtrip_ok and not a.overflow
  assert 1.45 < a.entropy_ratio < 1.6
  assert 1.38 < a.static_ratio <= a.ratio < a.entropy_ratio
  assert 0.015 < a.escape_rate < 0.03
  z = zc.analyze(np.zeros(10, np.float32))
  assert z.roundtrip_ok and z.escape_count == 0
