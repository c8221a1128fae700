"""The "trim" toy codec with the skipped-rows contract (docs/format.md, "Skipped
rows"), strict about it so that the transport tests see what the transport asks:

  * encode_rows(x, skip): a skipped row's payload is garbage (0xAB bytes, a bad
    magic: decoding it fails) and its stats are zero;
  * decode_rows(payload, n, dtype, skip, fill): a skipped row takes its fill row
    and status 0, whatever its payload; decode_rows refuses to run without both
    (every transport that has an own row must pass them).

So a transport that marks the wrong row, or none, gets NaN rows or wrong values.
One exception: a payload typed invariant in shard_map (a gather's) with a fill
that varies cannot be mixed in plain jax.numpy (no cast makes a varying value
invariant; the native codecs declare their result types), so there this codec
decodes every row, as the CUDA handlers do, and the gather's own row is the
encoding of its fill.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import compat
from tests.trim_codec import max_nbytes, min_nbytes  # noqa: F401
from tests.trim_codec import decode_rows as _decode_rows
from tests.trim_codec import encode_rows as _encode_rows

SKIP_ROWS = True


def encode_rows(x, skip=None):
  payload, stats = _encode_rows(x)
  if skip is None:
    return payload, stats
  skip = jnp.asarray(skip, bool)
  payload = jnp.where(skip[..., None], jnp.uint8(0xAB), payload)
  return payload, jnp.where(skip[..., None], 0, stats)


def decode_rows(payload, n, dtype, skip=None, fill=None):
  if skip is None or fill is None:
    raise AssertionError("trim_skip: the transport must pass skip and fill")
  y, status = _decode_rows(payload, n, dtype)
  if not compat.varying_axes(fill) <= compat.varying_axes(payload):
    return y, status
  skip = jnp.asarray(skip, bool)
  rows = int(np.prod(payload.shape[:-1]))
  fill = jnp.asarray(fill).reshape(-1, n)
  per = rows // fill.shape[0]
  own = fill[jnp.arange(rows) // per].reshape(y.shape)
  return jnp.where(skip[..., None], own, y), jnp.where(skip, 0, status)
