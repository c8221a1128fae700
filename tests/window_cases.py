"""Helpers shared by the window codec's tests (test_window.py, test_window_malformed.py):
the native row codec on numpy buffers and the comparison of an encoding with the
reference implementation of docs/format.md."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import zipccl_jax as zc
from zipccl_jax._src import ffi as zffi
from tests import reference_window as ref
from tests.reference import BF16, assert_bits_equal


CODE = {BF16: 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3}
NATIVE = zffi.native()


def roundtrip(x):
  enc = zc.encode(jnp.asarray(x))
  return enc, zc.decode(enc)


def host_encode(x, cap):
  """The C++ row codec with another escape capacity than max_nbytes' (host buffers)."""
  x = np.ascontiguousarray(x)
  out = np.empty(NATIVE.row_nbytes(CODE[x.dtype], x.size, cap), np.uint8)
  status, count, used = NATIVE.encode_into(CODE[x.dtype], x.reshape(-1).view(np.uint8), x.size, cap, out)
  return out, status, count, used


def check_against_reference(x, cap=None):
  """Encodes x (the FFI encoder, or the host codec with escape capacity `cap`),
  compares every byte and stat with the reference, and decodes a fitting row back
  from its used prefix (C++ and reference). Returns (status, escapes, used)."""
  x = np.asarray(x)
  want, status, count, used = ref.encode(x, cap)
  if cap is None:
    enc = zc.encode(jnp.asarray(x))
    got = np.asarray(enc.payload)
    stats = (int(enc.status), int(enc.escape_count), int(enc.used_units))
    want_units = used // 128 if status == 0 else want.size // 128 + 1
    assert stats == (status, count, want_units), (stats, status, count, want_units)
  else:
    got, hstatus, hcount, hused = host_encode(x, cap)
    assert (hstatus, hcount, hused) == (status, count, used)
  assert got.shape == want.shape
  diff = np.flatnonzero(got != want)
  assert diff.size == 0, f"payload differs from the reference at byte {diff[:8]}"
  assert not got[used:].any(), "bytes past used_nbytes must be zero"
  if status == 0:
    prefix = got[:used]
    if cap is None:
      assert_bits_equal(zc.decode(enc), x)
      cut = zc.Encoded(jnp.asarray(prefix), enc.escape_count, enc.status, enc.used_units, enc.shape,
                       enc.dtype)
      assert_bits_equal(zc.decode(cut), x)
    else:
      st, y = _decode_status(x.dtype, prefix, x.size)
      assert st == 0
      assert_bits_equal(y.view(x.dtype), x)
    assert_bits_equal(ref.decode(prefix, x.dtype, x.size), x)
  return status, count, used



def _decode_status(dtype, payload, n):
  y = np.full(n * np.dtype(dtype).itemsize, 0x5A, np.uint8)
  return NATIVE.decode_into(CODE[np.dtype(dtype)], np.ascontiguousarray(payload), n, y), y
