"""Argument validation of the compressed collectives.

Every public collective validates its arguments here; errors name the function and
the argument. What the validated options then mean for a call is plan.py's.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import calibration_agreement
from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import ladder
from zipccl_jax._src.codecs import registry

POLICIES = ("always", "never", "auto")


def collective_codecs() -> tuple:
  """What `codec=` accepts: "auto", the registered codecs, "raw" and None."""
  return ("auto",) + registry.names() + ("raw", None)


# Leaves of a pytree below this many raw bytes (per device) share a transport:
# packed per dtype into buckets of at most this size (collectives.py, "buckets").
# 4 MiB: a bucket's row header, agreement and call latency are < 0.1% of its wire
# time on a 10-100 Gb/s link, and packing copies stay small next to the codec.
BUCKET_BYTES = 4 << 20


def check_bucket_bytes(fn, value) -> int:
  """`bucket_bytes=`: None (BUCKET_BYTES) or an int >= 0 (0: no buckets). Returns
  the limit in bytes; 0 turns packing off (every leaf at least its own size)."""
  if value is None:
    return BUCKET_BYTES
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{fn}: bucket_bytes must be an int (bytes) or None, got {value!r}")
  if value < 0:
    raise ValueError(f"{fn}: bucket_bytes must be >= 0 (0: no buckets), got {value}")
  return int(value)


class Opts(NamedTuple):
  """Validated options of one public call (static)."""
  codec: str | None
  policy: str
  check_decode: bool = False
  chunks: int | None = None    # None: "auto" (the cost model), else a fixed count >= 1


def check_chunks(fn, chunks):
  """`chunks=`: None (then $ZIPCCL_CHUNKS, else "auto"), "auto" or an int in
  [1, ladder.MAX_CHUNKS]. Returns None for auto, else the int."""
  if chunks is None:
    chunks = ladder.chunks_default()
  if isinstance(chunks, str) and chunks == "auto":
    return None
  if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)):
    raise TypeError(f"{fn}: chunks must be \"auto\" or an int, got {chunks!r}")
  if not 1 <= chunks <= ladder.MAX_CHUNKS:
    raise ValueError(f"{fn}: chunks must be in [1, {ladder.MAX_CHUNKS}], got {chunks}")
  return int(chunks)


def check_opts(fn, codec, policy, stats, check_decode=None, chunks=None) -> Opts:
  allowed = collective_codecs()
  if codec not in allowed:
    names = ", ".join(repr(c) for c in allowed)
    raise ValueError(f"{fn}: codec must be one of {names}, got {codec!r}")
  if policy not in POLICIES:
    raise ValueError(f"{fn}: policy must be one of {POLICIES}, got {policy!r}")
  if not isinstance(stats, bool):
    raise TypeError(f"{fn}: stats must be a bool, got {stats!r}")
  if check_decode is None:
    check_decode = ladder.check_decode_default()
  if not isinstance(check_decode, bool):
    raise TypeError(f"{fn}: check_decode must be a bool or None, got {check_decode!r}")
  return Opts(codec, policy, check_decode, check_chunks(fn, chunks))


def check_axes(fn, axis_name) -> tuple:
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  if not axes:
    raise ValueError(f"{fn}: axis_name must name at least one mesh axis, got {axis_name!r}")
  for a in axes:
    try:
      hash(a)
    except TypeError:
      raise TypeError(f"{fn}: axis_name entries must be hashable mesh axis names, "
                      f"got {a!r}") from None
  if len(set(axes)) != len(axes):
    raise ValueError(f"{fn}: axis_name has repeated axes: {axis_name!r}")
  return axes


def axis_size(fn, axes, axis_name) -> int:
  try:
    return compat.axis_size(axes)
  except NameError as e:   # lax's exception type
    raise NameError(
        f"{fn}: axis_name {axis_name!r} is not a bound mesh axis; call it inside "
        f"jax.shard_map over a mesh that has that axis ({e})") from None


def setup(fn, axis_name, codec, policy, stats, tiled=False, check_decode=None, chunks=None):
  """Validation shared by the five public collectives: (options, axes, peer count)."""
  opts = check_opts(fn, codec, policy, stats, check_decode, chunks)
  if opts.codec is not None:
    # Processes whose calibration or ZIPCCL_* settings differ would plan different
    # programs: checked once, at the first compressed call of a multi-process job.
    calibration_agreement.check_agreement_once()
  axes = check_axes(fn, axis_name)
  if not isinstance(tiled, bool):
    raise TypeError(f"{fn}: tiled must be a bool, got {tiled!r}")
  return opts, axes, axis_size(fn, axes, axis_name)


def check_x(fn, x):
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    x = jnp.asarray(x)
    dtype = x.dtype
  if not dtypes.is_supported(dtype):
    raise TypeError(f"{fn}: x must be {dtypes.NAMES}, got {np.dtype(dtype).name}")
  return jnp.asarray(x)


def check_dim(fn, arg, value, ndim) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{fn}: {arg} must be an int, got {value!r}")
  if not -ndim <= value < ndim:
    raise ValueError(f"{fn}: {arg}={value} is out of range for {ndim} dimension(s)")
  return int(value) % ndim


def check_split(fn, arg, size, n_peers, tiled, axis_name):
  if tiled and size % n_peers:
    raise ValueError(f"{fn}: x.shape[{arg}] = {size} must be divisible by the size of "
                     f"axis {axis_name!r} ({n_peers}) when tiled=True")
  if not tiled and size != n_peers:
    raise ValueError(f"{fn}: x.shape[{arg}] = {size} must equal the size of axis "
                     f"{axis_name!r} ({n_peers}) when tiled=False")


def check_split_x(fn, x, arg, value, n_peers, tiled, axis_name, also=()):
  """x of a collective that splits x among peers (psum_scatter, all_to_all).

  `also` holds further (name, value) dimensions of x to check (before the split).
  Returns (x as an array, the split dimension `arg` = value normalised, *also's).
  """
  x = check_x(fn, x)
  if x.ndim == 0:
    raise ValueError(f"{fn}: x must have at least one dimension, got a scalar")
  d = check_dim(fn, arg, value, x.ndim)
  others = tuple(check_dim(fn, name, v, x.ndim) for name, v in also)
  check_split(fn, arg, x.shape[d], n_peers, tiled, axis_name)
  return (x, d) + others


def check_perm(fn, perm, n_peers) -> tuple:
  try:
    pairs = tuple((int(s), int(d)) for s, d in perm)
    ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
             for pair in perm for v in pair)
  except (TypeError, ValueError):
    pairs, ok = (), False
  if not ok:
    raise TypeError(f"{fn}: perm must be a sequence of (source, destination) int pairs, "
                    f"got {perm!r}")
  for s, d in pairs:
    if not (0 <= s < n_peers and 0 <= d < n_peers):
      raise ValueError(f"{fn}: perm pair {(s, d)} is out of range for an axis of size "
                       f"{n_peers}")
  srcs = [s for s, _ in pairs]
  dsts = [d for _, d in pairs]
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"{fn}: perm must not repeat a source or a destination, got {perm!r}")
  return pairs
