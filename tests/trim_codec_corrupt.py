"""The "trim" toy codec with a wire fault: the decoder sees row 0 of every payload it
gets with a damaged magic byte (as a corrupted transfer would deliver it)."""
from __future__ import annotations

from tests.trim_codec import encode_rows, max_nbytes, min_nbytes  # noqa: F401
from tests.trim_codec import decode_rows as _decode_rows


def decode_rows(payload, n, dtype):
  if payload.shape[-1] == 0 or payload.ndim < 2:
    return _decode_rows(payload, n, dtype)
  return _decode_rows(payload.at[0, 0].set(payload[0, 0] ^ 0x01), n, dtype)
