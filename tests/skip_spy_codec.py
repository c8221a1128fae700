"""The window codec ("zipccl") with a spy on decode_rows: CALLS records, at trace
time, whether each decode got a skip mask and a fill (the transport's own row),
so a test can see that a gather does not decode the row it already holds."""
from __future__ import annotations

from zipccl_jax._src.codecs import window as _codec

CALLS = []
SKIP_ROWS = True


def __getattr__(name):   # everything else is the window codec's
  return getattr(_codec, name)


def decode_rows(payload, n, dtype, skip=None, fill=None):
  CALLS.append((skip is not None, fill is not None))
  return _codec.decode_rows(payload, n, dtype, skip=skip, fill=fill)
