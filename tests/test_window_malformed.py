"""The window codec on malformed payloads: every bit flip, truncation and defect reports
a status (never a wrong answer or an out-of-bounds read), and a differential fuzz of
the decoder against the reference."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zipccl_jax as zc
from zipccl_jax._src.codecs import window as W
from tests import reference_window as ref
from tests.reference import BF16, DTYPES, assert_bits_equal, make, uint, words
from tests.window_cases import CODE, _decode_status


# ---- malformed payloads ------------------------------------------------------------------


def _payload(dtype=BF16, n=5000, seed=4, dist="gauss"):
  """(x, used_nbytes, the FFI encoder's whole row)."""
  x = make(dist, n, dtype, seed=seed)
  enc = zc.encode(jnp.asarray(x))
  assert int(enc.status) == 0
  return x, int(enc.used_nbytes), np.asarray(enc.payload).copy()


def _assert_filled(status, y):
  if status != 0:
    assert (y == 0xFF).all(), f"status {status}: the row is not filled with all-one bits"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_single_bit_flip_is_detected(dtype):
  x, used, p = _payload(dtype, n=2500)
  assert _decode_status(dtype, p, x.size)[0] == 0
  for bit in range(0, used * 8, 1 if dtype == BF16 else 3):
    q = p.copy()
    q[bit // 8] ^= 1 << (bit % 8)
    status, y = _decode_status(dtype, q, x.size)
    assert status != 0, f"flip of bit {bit} (byte {bit // 8}) not detected"
    _assert_filled(status, y)
  # Bytes past used_nbytes are never read.
  q = p.copy()
  q[used:] = 0xEE
  assert _decode_status(dtype, q, x.size)[0] == 0


def test_every_truncation_is_rejected_and_every_longer_buffer_accepted():
  x, used, p = _payload(n=3000)
  for k in range(0, used):
    status, y = _decode_status(BF16, p[:k], x.size)
    assert status == 3, k
    _assert_filled(status, y)
  for k in range(used, p.size + 1, 37):
    status, y = _decode_status(BF16, p[:k], x.size)
    assert status == 0, k
    assert_bits_equal(y.view(BF16), x)
  assert _decode_status(BF16, np.concatenate([p, p[:8]]), x.size)[0] == 0


def test_random_corruption_never_gives_a_wrong_answer():
  x, used, p = _payload(n=20_000, seed=6)
  rng = np.random.default_rng(0)
  for trial in range(400):
    q = p.copy()
    k = int(rng.integers(1, 16))
    pos = rng.integers(0, used, k)
    q[pos] = rng.integers(0, 256, k).astype(np.uint8)
    status, y = _decode_status(BF16, q, x.size)
    if np.array_equal(q, p):
      assert status == 0
    else:
      assert status != 0 or np.array_equal(y.view(np.uint16), words(x)), trial
    _assert_filled(status, y)


def _set_u64(q, off, v):
  q[off:off + 8] = np.frombuffer(np.uint64(v).tobytes(), np.uint8)


def test_specific_defects_report_their_status():
  x, used, p = _payload(n=5000)
  n = x.size
  esc_off = W.min_nbytes(BF16, n)
  count = int(p[48:56].view("<u8")[0])
  esc_bytes = int(p[56:64].view("<u8")[0])

  def st_of(mutate, reseal=False):
    q = p.copy()
    mutate(q)
    if reseal:
      q = ref.reseal(q)
    status, y = _decode_status(BF16, q, n)
    _assert_filled(status, y)
    return status

  assert st_of(lambda q: q.__setitem__(0, ord("X"))) == 1         # magic
  assert st_of(lambda q: q.__setitem__(4, 1)) == 1                # version 1
  assert st_of(lambda q: q.__setitem__(6, 2)) == 1                # codec id (entropy)
  assert st_of(lambda q: q.__setitem__(5, 3)) == 2                # dtype
  assert st_of(lambda q: q.__setitem__(32, 12)) == 2              # block size
  assert st_of(lambda q: q.__setitem__(8, q[8] ^ 1)) == 3         # n
  assert st_of(lambda q: _set_u64(q, 16, p.size + 128)) == 3      # used_nbytes > buffer
  assert st_of(lambda q: _set_u64(q, 16, used + 8)) == 3          # not a multiple of 128
  assert st_of(lambda q: _set_u64(q, 16, esc_off - 128)) == 3     # below min_nbytes
  assert st_of(lambda q: _set_u64(q, 16, 2**64 - 128)) == 3       # huge: must not wrap
  assert st_of(lambda q: q.__setitem__(7, 1)) == 4                # DOES_NOT_FIT flag
  assert st_of(lambda q: q.__setitem__(7, 9)) == 5                # bad status byte
  assert st_of(lambda q: q.__setitem__(100, 1)) == 5              # reserved byte
  assert st_of(lambda q: q.__setitem__(35, 1)) == 5               # reserved byte after block_log2
  assert st_of(lambda q: _set_u64(q, 40, esc_bytes - 1)) == 5     # escape_bytes > capacity
  assert st_of(lambda q: _set_u64(q, 56, 2**64 - 1)) == 5         # huge escape bytes
  assert st_of(lambda q: _set_u64(q, 48, n + 1)) == 5             # escape_count > n
  assert st_of(lambda q: _set_u64(q, 48, count + 1), reseal=True) == 6  # != the records' sum
  assert st_of(lambda q: _set_u64(q, 16, used + 128)) == 5        # used != esc_off + align(bytes)
  assert st_of(lambda q: q.__setitem__(128 + 5, q[128 + 5] ^ 0x90), reseal=True) == 6  # width > 8
  assert st_of(lambda q: q.__setitem__(128 + 7, q[128 + 7] | 0xFE), reseal=True) == 6  # split > 2^w
  assert st_of(lambda q: q.__setitem__(128 + 6, 255)) == 6        # invalid window base
  assert st_of(lambda q: q.__setitem__(128 + 8, q[128 + 8] + 1)) == 6  # offset of block 1
  assert _decode_status(BF16, p, n + 1)[0] == 3                   # caller expects other n
  assert _decode_status(np.float16, p, n)[0] == 2                 # caller expects fp16
  assert st_of(lambda q: q.__setitem__(used - 1, q[used - 1] ^ 0x10)) == 8   # escape padding
  assert st_of(lambda q: q.__setitem__(used - 1, 1), reseal=True) == 9       # ... resealed
  raw_pad = 128 + 128 + n                                          # bf16: 1 raw byte per element
  assert st_of(lambda q: q.__setitem__(raw_pad, 1), reseal=True) == 9
  assert st_of(lambda q: q.__setitem__(128 + 8 * 3, 1), reseal=True) == 9    # table padding
  with pytest.raises(ValueError, match="checksum"):
    q = p.copy()
    q[used - 1] ^= 0x10
    zc.decode(zc.Encoded(jnp.asarray(q), jnp.int32(0), jnp.int32(0), jnp.int32(0), (n,), BF16))


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16), np.dtype(np.float32)],
                         ids=["bf16", "fp16", "fp32"])
def test_short_last_block_has_short_planes(dtype):
  """Format v3: a last block of len elements has planes of 16 * ceil(len / 128) bytes,
  the plane section padded to 128; bits past len in them, or a nonzero padding byte,
  are rejected (7 / 9), and the row matches the reference bytes."""
  dtype = np.dtype(dtype)
  P = 6 if dtype == np.float16 else 3
  rb = 3 if dtype == np.float32 else 1
  for n, last in ((2048 + 4, 4), (4096 + 300, 300), (2048, 2048), (100, 100)):
    nb = -(-n // 2048)
    plane_sec = P * ((nb - 1) * 256 + 16 * -(-last // 128))
    fixed = 128 + 128 + -(-rb * n // 128) * 128 + -(-plane_sec // 128) * 128
    assert W.min_nbytes(dtype, n) == fixed == ref.min_nbytes(dtype, n), (n, dtype)
  n = 2048 + 4                      # last block: 4 elements, planes of 16 bytes, 80 B padding
  x, used, p = _payload(dtype, n=n, seed=3)
  want, status, _, want_used = ref.encode(x)
  assert status == 0 and used == want_used and np.array_equal(p[:used], want[:used])
  plane_off = 128 + 128 + -(-rb * n // 128) * 128
  last_planes = plane_off + P * 256             # block 1's planes: P x 16 bytes
  pad = last_planes + P * 16                    # then padding up to esc_off
  assert pad < W.min_nbytes(dtype, n)

  def status_of(off, value):
    q = p.copy()
    q[off] |= value
    st, y = _decode_status(dtype, ref.reseal(q), n)
    _assert_filled(st, y)
    return st

  assert status_of(last_planes, 0x10) == 7           # position 4 of block 1: past its len
  assert status_of(last_planes + 16 + 15, 0x01) == 7  # plane 1, position 120
  assert status_of(pad, 0x01) == 9                   # plane-section padding (resealed)
  q = p.copy()
  q[pad] = 1
  assert _decode_status(dtype, q, n)[0] == 8         # ... not resealed: the checksum covers it
  assert np.array_equal(np.asarray(zc.decode(zc.encode(jnp.asarray(x)))).view(np.uint8),
                        x.view(np.uint8))


def _spread_f16(n=3000, seed=1):
  """fp16 data whose block 0 escapes far on both sides of its window (width 5)."""
  f16 = np.dtype(np.float16)
  x = make("gauss", n, f16, seed=seed)
  x[:64:2] = np.float16(6e4)      # exponent 30, far above
  x[1:64:2] = np.float16(1e-7)    # subnormal: exponent 0, far below (mode 0)
  return x


def test_escape_values_naming_no_exponent_are_rejected():
  """Format v4: an escape value is a distance from the window; one that names an
  exponent outside the dtype (fp16: above 31, whose bits would leak into the sign;
  below 0), or a set bit past a stream's last value, is BAD_ESCAPES (7)."""
  f16 = np.dtype(np.float16)
  x = _spread_f16()
  enc = zc.encode(jnp.asarray(x))
  p, n = np.asarray(enc.payload).copy(), x.size
  esc_off = W.min_nbytes(f16, n)
  rec = p[128:136]
  count, width = int(rec[4:6].view("<u2")[0]) & 0xFFF, int(rec[5]) >> 4
  split = int(rec[7]) >> 1
  assert count > 0 and width == 5 and 0 < split < 31, (count, width, split)

  def status_of(mutate):
    q = p.copy()
    mutate(q)
    st, y = _decode_status(f16, ref.reseal(q), n)
    _assert_filled(st, y)
    return st

  assert status_of(lambda q: None) == 0
  # the first value all ones with split 0: e = hi + 1 + 31 > 31
  assert status_of(lambda q: (q.__setitem__(esc_off, q[esc_off] | 0x1F),
                              q.__setitem__(128 + 7, q[128 + 7] & 1))) == 7
  # split = 2^5 and the first value 31: below the window, e = lo - 32 < 0
  assert status_of(lambda q: (q.__setitem__(esc_off, q[esc_off] | 0x1F),
                              q.__setitem__(128 + 7, (q[128 + 7] & 1) | (32 << 1)))) == 7
  # a bit past the last value of block 0's stream (count * 5 bits)
  sb = -(-count * 5 // 8)
  if (count * 5) % 8:
    assert status_of(lambda q: q.__setitem__(esc_off + sb - 1, q[esc_off + sb - 1] | 0x80)) == 7
  assert np.array_equal(np.asarray(zc.decode(zc.encode(jnp.asarray(x)))).view(np.uint16), x.view(np.uint16))


def test_jit_decode_of_bad_payloads_is_all_ones():
  """Under jit no error is raised: the status says it, and the row is all-one bits."""
  for dtype in DTYPES:
    x, used, p = _payload(dtype, n=3001)
    bad = np.stack([p, p, p])
    bad[1, 0] ^= 1            # magic
    bad[2, used - 1] ^= 1     # checksum
    dec = jax.jit(lambda q, _d=dtype: zc.decode_rows(q, 3001, _d))
    y, status = (np.asarray(a) for a in dec(jnp.asarray(bad)))
    assert status.tolist() == [0, 1, 8]
    assert_bits_equal(y[0], x)
    ones = np.full(3001, np.iinfo(uint(dtype)).max, uint(dtype))
    assert (words(y[1]) == ones).all() and (words(y[2]) == ones).all()
    # A buffer shorter than the header, and one of length 0.
    for L in (0, 100):
      y, status = dec(jnp.asarray(p[None, :L]))
      assert int(status[0]) == 3 and (words(np.asarray(y)) == ones).all()


# ---- decoder fuzz ------------------------------------------------------------------------------


def _fuzz_cases(rng, q, used, n, code):
  """One mutation of a valid row q (in place or a new buffer); returns the buffer."""
  kind = int(rng.integers(6))
  if kind == 0:    # bit flips anywhere in the used prefix: the checksum sees every one
    for _ in range(int(rng.integers(1, 9))):
      i = int(rng.integers(used))
      q[i] ^= np.uint8(1 << int(rng.integers(8)))
  elif kind == 1:  # truncation, or extension by random bytes
    k = int(rng.integers(0, used + 1))
    q = q[:k] if rng.integers(2) else np.concatenate([q, rng.integers(0, 256, k, np.uint8)])
  elif kind == 2:  # a random header, sometimes keeping magic/version/codec/dtype to get past them
    hdr = rng.integers(0, 256, 128, np.uint8)
    keep = int(rng.integers(0, 9))
    hdr[:keep] = q[:keep]
    q[:128] = hdr
    if rng.integers(2):
      q = ref.reseal(q)
  elif kind == 3:  # one header field set to a random or extreme value, re-sealed
    off = [8, 16, 40, 48][int(rng.integers(4))]
    vals = [0, 1, 127, 128, used, used + 128, 2**32, 2**63, 2**64 - 1, int(rng.integers(0, 2**63))]
    q[off:off + 8] = np.frombuffer(vals[int(rng.integers(len(vals)))].to_bytes(8, "little"), np.uint8)
    q = ref.reseal(q)
  elif kind == 4:  # a random escape offset/count byte of a record (sometimes re-sealed), or a
    nb = -(-n // 2048)  # random window byte (not re-sealed: a consistent window shift that is
    if nb:              # re-sealed is a valid row of other values, which no checksum can see)
      rec = 128 + 8 * int(rng.integers(nb))
      k = int(rng.integers(8))
      q[rec + k] = rng.integers(256)
      if k < 6 and rng.integers(2):
        q = ref.reseal(q)
  else:            # random bytes in the whole used prefix (not re-sealed)
    k = int(rng.integers(1, 32))
    q[rng.integers(0, used, k)] = rng.integers(0, 256, k, np.uint8)
  return q


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decoder_fuzz(dtype):
  """Seeded fuzzing of the decoder on valid rows of every dtype: bit flips,
  truncations and extensions, random and extreme headers (re-sealed so that the
  checks behind the checksum are reached), random table bytes. Every result is a
  status in 1..9 with the row all-one bits, or status 0 with exactly the original
  values; the FFI handler agrees with the host decoder on every buffer of the
  row's own length."""
  rng = np.random.default_rng(20261130 + CODE[dtype])
  rows = []
  for dist, n in [("gauss", 1), ("gauss", 2049), ("outlier", 5000), ("relu", 777),
                  ("specials", 3001), ("gauss", 0), ("laplace", 4096)]:
    x = make(dist, n, dtype, seed=n)
    enc = zc.encode(jnp.asarray(x))
    if int(enc.status) == 0:
      rows.append((x, int(enc.used_nbytes), np.asarray(enc.payload)))
  ones = np.iinfo(uint(dtype)).max
  same_len = {}
  for trial in range(1500):
    x, used, p = rows[trial % len(rows)]
    n = x.size
    q = _fuzz_cases(rng, p.copy(), used, n, CODE[dtype])
    status, y = _decode_status(dtype, q, n)
    assert 0 <= status <= 9, status
    if status == 0:
      assert np.array_equal(words(y.view(dtype)), words(x)), f"trial {trial}: wrong values, status 0"
    else:
      assert (y.view(uint(dtype)) == ones).all(), f"trial {trial}: status {status}, row not all-ones"
    if q.size == p.size:
      same_len.setdefault(n, []).append((q, status, y))
  # The FFI decoder (jit) on the same buffers: same statuses, same values.
  for n, items in same_len.items():
    qs = np.stack([q for q, _, _ in items])
    y, status = (np.asarray(a) for a in jax.jit(lambda b, _n=n: zc.decode_rows(b, _n, dtype))(qs))
    assert status.tolist() == [s for _, s, _ in items]
    assert np.array_equal(words(y).reshape(len(items), -1).view(np.uint8),
                          np.stack([yy for _, _, yy in items]).reshape(len(items), -1))
