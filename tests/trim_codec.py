"""A toy codec in plain jax.numpy that keeps the v2 codec contract (docs/format.md):
registered by the transport tests as "trim" to drive the slot ladder with used
sizes they choose, independently of the native codecs.

A row is a 128-byte header (magic, used units) followed by the raw bytes of the
row with its trailing zero bytes cut: used_nbytes = 128 + align128(bytes up to
the last nonzero one), at least min_nbytes = 128 + align128(3/4 of the raw
size). Zero tails therefore land on low rungs, dense rows above the last
compressed rung (the raw rung). Prefix-decodable: bytes past used_nbytes are
zero by construction (the decoder zero-fills a short slot).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

_MAGIC = np.frombuffer(b"TRIM", np.uint8)
_ALIGN = 128
STATUS_BAD = 3   # the shared "BAD_SIZE" number: a header that does not fit the buffer


def _align(x):
  return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def max_nbytes(dtype, n: int) -> int:
  return _ALIGN + _align(n * np.dtype(dtype).itemsize)


def min_nbytes(dtype, n: int) -> int:
  """Rows are never counted below 3/4 of the raw size (a short ladder: fast tests)."""
  return _ALIGN + _align(3 * n * np.dtype(dtype).itemsize // 4)


def encode_rows(x):
  """(payload u8[..., max_nbytes], stats s32[..., 4] = (0, last byte, used_units, 0))."""
  lead, n = x.shape[:-1], x.shape[-1]
  size = n * x.dtype.itemsize
  b = lax.bitcast_convert_type(x, jnp.uint8).reshape(lead + (size,))
  last = jnp.max(jnp.where(b != 0, jnp.arange(1, size + 1, dtype=jnp.int32), 0), axis=-1,
                 initial=0)
  used_units = jnp.maximum(1 + (last + _ALIGN - 1) // _ALIGN, min_nbytes(x.dtype, n) // _ALIGN)
  units = lax.bitcast_convert_type(used_units.astype(jnp.int32), jnp.uint8)   # [..., 4]
  header = jnp.concatenate([jnp.broadcast_to(jnp.asarray(_MAGIC), lead + (4,)),
                            jnp.zeros(lead + (12,), jnp.uint8), units,
                            jnp.zeros(lead + (_ALIGN - 20,), jnp.uint8)], axis=-1)
  body = jnp.pad(b, [(0, 0)] * len(lead) + [(0, _align(size) - size)])
  stats = jnp.stack([jnp.zeros_like(last), last, used_units, jnp.zeros_like(last)], axis=-1)
  return jnp.concatenate([header, body], axis=-1), stats.astype(jnp.int32)


def decode_rows(payload, n: int, dtype):
  """(y[..., n], status[...]); rows with a bad header are all-one bits (status 3)."""
  dtype = np.dtype(dtype)
  lead, length = payload.shape[:-1], payload.shape[-1]
  size = n * dtype.itemsize
  full = max_nbytes(dtype, n)
  p = payload[..., :full] if length >= full else jnp.pad(
      payload, [(0, 0)] * len(lead) + [(0, full - length)])
  used = lax.bitcast_convert_type(p[..., 16:20], jnp.int32) * _ALIGN
  ok = jnp.all(p[..., :4] == jnp.asarray(_MAGIC), axis=-1) & (used >= _ALIGN) & (used <= length)
  data = jnp.where(ok[..., None], p[..., _ALIGN:_ALIGN + size], 0xFF)
  y = lax.bitcast_convert_type(data.reshape(lead + (n, dtype.itemsize)), dtype)
  return y, jnp.where(ok, 0, STATUS_BAD).astype(jnp.int32)
