"""Option validation and the static transport plan of the compressed collectives.

Every public collective validates its arguments here (errors name the function
and the argument) and asks `plan` how to move rows of m elements. The policy
"auto" is decided by ONE function, `auto_compress`, which asks the calibrated
cost model (costmodel.py).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import codec as _codec
from zipccl_jax._src import compat
from zipccl_jax._src import costmodel
from zipccl_jax._src import dtypes
from zipccl_jax._src import registry

POLICIES = ("always", "never", "auto")


# Registered codecs the transport can move. It still calls the window codec
# directly, so a codec registered before the transport is codec-generic (issue 8)
# must be refused here rather than silently replaced by the window codec.
TRANSPORT_CODECS = ("zipccl",)


def collective_codecs() -> tuple:
  """What `codec=` accepts: the registered codecs the transport runs, "raw" and None."""
  return tuple(c for c in registry.names() if c in TRANSPORT_CODECS) + ("raw", None)


# policy="auto" without a calibration: compress a collective when each row (the
# message for one peer) holds at least this many raw bytes. Below it the fixed
# per-row overhead (128-byte header, 128-byte aligned sections) eats the gain: the
# static ratio of a bf16 row is 1.33 at 8 KiB, 1.39 at 32 KiB and 1.40 at 64 KiB
# (1.11 fp16, 1.16 fp32), and small messages are latency-bound anyway. With a
# calibration the cost model decides instead (costmodel.py).
AUTO_MIN_ROW_BYTES = 64 * 1024


class Opts(NamedTuple):
  """Validated options of one public call (static)."""
  codec: str | None
  escape_capacity: int | None
  policy: str
  grad_escape_capacity: int | None = None   # for the collective the VJP runs

  def for_grad(self) -> "Opts":
    """Options of the transposed collective: the gradient's own capacity if given."""
    if self.grad_escape_capacity is None:
      return self
    return self._replace(escape_capacity=self.grad_escape_capacity)


class Plan(NamedTuple):
  """Static transport decision for rows of m elements."""
  compress: bool
  m: int
  dtype: Any
  cap: int
  nbytes: int       # encoded row bytes (when compress)


def check_capacity(fn, name, value):
  """None (the default capacity) or a static non-negative int, as `encode` checks it."""
  return None if value is None else _codec._check_count(value, f"{fn}: {name}")


def check_opts(fn, codec, escape_capacity, policy, stats, grad_escape_capacity=None) -> Opts:
  allowed = collective_codecs()
  if isinstance(codec, str) and codec in registry.names() and codec not in allowed:
    raise NotImplementedError(f"{fn}: codec {codec!r} is registered (encode_rows/decode_rows "
                              "work) but the collectives' transport does not move it yet")
  if codec not in allowed:
    names = ", ".join(repr(c) for c in allowed)
    raise ValueError(f"{fn}: codec must be one of {names}, got {codec!r}")
  if policy not in POLICIES:
    raise ValueError(f"{fn}: policy must be one of {POLICIES}, got {policy!r}")
  escape_capacity = check_capacity(fn, "escape_capacity", escape_capacity)
  grad_escape_capacity = check_capacity(fn, "grad_escape_capacity", grad_escape_capacity)
  if not isinstance(stats, bool):
    raise TypeError(f"{fn}: stats must be a bool, got {stats!r}")
  return Opts(codec, escape_capacity, policy, grad_escape_capacity)


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
  except NameError as e:
    raise ValueError(
        f"{fn}: axis_name {axis_name!r} is not a bound mesh axis; call it inside "
        f"jax.shard_map over a mesh that has that axis ({e})") from None


def setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity, policy, stats,
          tiled=False):
  """Validation shared by the five public collectives: (options, axes, peer count)."""
  opts = check_opts(fn, codec, escape_capacity, policy, stats, grad_escape_capacity)
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


def plan(fn, dtype, m: int, opts: Opts, *, collective: str | None = None,
         n_peers: int | None = None) -> Plan:
  """The static plan for rows of m elements; `collective` ("all_gather",
  "psum_scatter", "psum", "all_to_all", "ppermute") and `n_peers` feed "auto"."""
  dtype = np.dtype(dtype)
  if m >= 2**31:
    raise ValueError(f"{fn}: a row (one peer's message) must have fewer than 2^31 elements, "
                     f"got {m}")
  cap = (_codec.default_escape_capacity(m) if opts.escape_capacity is None
         else opts.escape_capacity)
  nbytes = _codec.encoded_nbytes(dtype, m, cap)
  if opts.codec in (None, "raw") or opts.policy == "never" or m == 0:
    compress = False
  elif opts.policy == "auto":
    compress = auto_compress(codec=opts.codec, dtype=dtype, m=m, nbytes=nbytes,
                             collective=collective, n_peers=n_peers)
  else:
    compress = True
  return Plan(compress, m, dtype, cap, nbytes)


def auto_compress(*, codec: str, dtype, m: int, nbytes: int, collective: str | None = None,
                  n_peers: int | None = None) -> bool:
  """policy="auto": compress rows of m elements of `dtype` (nbytes encoded) or not.

  The one place the decision is made. Rows whose encoding is not smaller than
  raw never are. With a calibration in force (`costmodel.active_calibration`:
  `zipccl_jax.set_calibration` / `calibrate`, or the file $ZIPCCL_CALIBRATION or
  ~/.cache/zipccl_jax/calibration.json), `costmodel.decide` compares the modelled
  times of the raw and the compressed transport of `collective` over `n_peers`.
  Without one (or for callers that name no collective) the static rule holds:
  rows of at least AUTO_MIN_ROW_BYTES raw bytes are compressed, so the default
  is fewer bytes on the wire. Static either way, and identical on every
  participant that holds the same calibration.
  """
  raw_row = m * np.dtype(dtype).itemsize
  if nbytes >= raw_row:
    return False
  cal = costmodel.active_calibration() if collective is not None and n_peers else None
  if cal is None:
    return raw_row >= AUTO_MIN_ROW_BYTES
  compress, _ = costmodel.decide(collective, dtype, m, n_peers, cal, codecs=(codec,))
  return compress


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
