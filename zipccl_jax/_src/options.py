"""Option validation and the static transport plan of the compressed collectives.

Every public collective validates its arguments here (errors name the function
and the argument) and asks `plan` how to move rows of m elements. The policy
"auto" is decided by ONE function, `auto_compress`, which asks the calibrated
cost model (costmodel.py).
"""
from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import codec as _codec
from zipccl_jax._src import compat
from zipccl_jax._src import costmodel
from zipccl_jax._src import dtypes
from zipccl_jax._src import registry
from zipccl_jax._src import transport

POLICIES = ("always", "never", "auto")


def collective_codecs() -> tuple:
  """What `codec=` accepts: "auto", the registered codecs, "raw" and None."""
  return ("auto",) + registry.names() + ("raw", None)


# codec="auto" (the collectives' default) without a calibration in force: the
# entropy codec, for the dtypes it takes (float32 goes to the window codec). Why:
# it is the codec with the lower modelled time (bytes/ratio/link + bytes/encode +
# bytes/decode, `costmodel.model_time`) on 10-100 Gb/s links with the measured codec
# speeds, on both platforms: one CPU core (this machine's `calibrate`: it encodes as
# fast as the window codec and decodes ~1.7x faster, with a 3-8% better ratio) in
# 120 of 120 modelled cells (five collectives, bf16 and fp16, three data kinds,
# 10-100 Gb/s), an H200 in 91 of 120 (the window codec's faster kernels win some
# cells at 100 Gb/s). With a calibration the cost model picks per call instead
# (`auto_codec`).
AUTO_CODEC = "entropy"


# policy="auto" without a calibration: compress a collective when each row (the
# message for one peer) holds at least this many raw bytes. Below it the fixed
# per-row overhead (128-byte header, 128-byte aligned sections) eats the gain: the
# static ratio of a bf16 row is 1.33 at 8 KiB, 1.39 at 32 KiB and 1.40 at 64 KiB
# (1.11 fp16, 1.16 fp32), and small messages are latency-bound anyway. With a
# calibration the cost model decides instead (costmodel.py).
AUTO_MIN_ROW_BYTES = 64 * 1024


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


class Plan(NamedTuple):
  """Static transport decision for rows of m elements (sizes: Python ints, exact)."""
  compress: bool
  m: int
  dtype: Any
  raw_row: int                 # raw bytes of one row: m * itemsize
  codec: Any = None            # registry.Codec when compress
  rungs: tuple = ()            # compressed slot sizes (bytes per row); the raw rung is implicit
  # Chunked transport (docs/design.md, "Overlap"): the row's elements [a, b) of each
  # chunk and the chunk's own plan (its own ladder). Empty: one chunk, the
  # unchunked program.
  bounds: tuple = ()
  parts: tuple = ()

  @property
  def chunks(self) -> int:
    """Number of chunks the row is moved in (1 = unchunked)."""
    return max(len(self.parts), 1)


_DEPRECATED = ("{fn}: {name} is deprecated and ignored: each call now sizes its wire "
               "from the data (the slot ladder, docs/design.md), so there is no escape "
               "capacity to tune; drop the argument")


def check_capacity(fn, name, value):
  """A deprecated capacity argument: still validated (a static non-negative int), then
  ignored with a DeprecationWarning."""
  if value is None:
    return None
  _codec.check_escape_capacity(value, f"{fn}: {name}")
  warnings.warn(_DEPRECATED.format(fn=fn, name=name), DeprecationWarning, stacklevel=5)
  return None


def check_chunks(fn, chunks):
  """`chunks=`: None (then $ZIPCCL_CHUNKS, else "auto"), "auto" or an int in
  [1, transport.MAX_CHUNKS]. Returns None for auto, else the int."""
  if chunks is None:
    chunks = transport.chunks_default()
  if isinstance(chunks, str) and chunks == "auto":
    return None
  if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)):
    raise TypeError(f"{fn}: chunks must be \"auto\" or an int, got {chunks!r}")
  if not 1 <= chunks <= transport.MAX_CHUNKS:
    raise ValueError(f"{fn}: chunks must be in [1, {transport.MAX_CHUNKS}], got {chunks}")
  return int(chunks)


def check_opts(fn, codec, escape_capacity, policy, stats, grad_escape_capacity=None,
               check_decode=None, chunks=None) -> Opts:
  allowed = collective_codecs()
  if codec not in allowed:
    names = ", ".join(repr(c) for c in allowed)
    raise ValueError(f"{fn}: codec must be one of {names}, got {codec!r}")
  if policy not in POLICIES:
    raise ValueError(f"{fn}: policy must be one of {POLICIES}, got {policy!r}")
  check_capacity(fn, "escape_capacity", escape_capacity)
  check_capacity(fn, "grad_escape_capacity", grad_escape_capacity)
  if not isinstance(stats, bool):
    raise TypeError(f"{fn}: stats must be a bool, got {stats!r}")
  if check_decode is None:
    check_decode = transport.check_decode_default()
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
  except NameError as e:
    raise ValueError(
        f"{fn}: axis_name {axis_name!r} is not a bound mesh axis; call it inside "
        f"jax.shard_map over a mesh that has that axis ({e})") from None


def setup(fn, axis_name, codec, escape_capacity, grad_escape_capacity, policy, stats,
          tiled=False, check_decode=None, chunks=None):
  """Validation shared by the five public collectives: (options, axes, peer count)."""
  opts = check_opts(fn, codec, escape_capacity, policy, stats, grad_escape_capacity,
                    check_decode, chunks)
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
         n_peers: int | None = None, all_to_all: bool = False) -> Plan:
  """How rows of m elements of dtype move: the codec and its slot ladder, or raw.

  `collective` ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
  and `n_peers` feed policy="auto"; `all_to_all`: the rows go over an all-to-all
  (transport.ALL_TO_ALL_LADDER, now the same spacing as the others)."""
  dtype = np.dtype(dtype)
  if m >= 2**31:
    raise ValueError(f"{fn}: a row (one peer's message) must have fewer than 2^31 elements, "
                     f"got {m}")
  raw_row = m * dtype.itemsize
  opts = resolve_codec(opts, dtype, m, collective=collective, n_peers=n_peers)
  if opts.codec in (None, "raw") or opts.policy == "never" or m == 0:
    return Plan(False, m, dtype, raw_row)
  codec = registry.get(opts.codec)
  if not codec.supports(dtype):
    return Plan(False, m, dtype, raw_row)
  min_nbytes = codec.min_nbytes(dtype, m)
  rungs = codec_rungs(codec, dtype, m, all_to_all)
  if not rungs:   # even the smallest encoding is not smaller than raw
    return Plan(False, m, dtype, raw_row)
  if opts.policy == "auto" and not auto_compress(
      collective=collective, codec=opts.codec, dtype=dtype, m=m, n_peers=n_peers,
      min_nbytes=min_nbytes):
    return Plan(False, m, dtype, raw_row)
  chunks = opts.chunks
  if chunks is None:
    chunks = auto_chunks(collective=collective, codec=opts.codec, dtype=dtype, m=m,
                         n_peers=n_peers)
  bounds = transport.chunk_bounds(m, chunks)
  if len(bounds) == 1:
    return Plan(True, m, dtype, raw_row, codec, rungs)
  return Plan(True, m, dtype, raw_row, codec, rungs, bounds,
              tuple(_chunk_plan(codec, dtype, b - a, all_to_all) for a, b in bounds))


def _chunk_plan(codec, dtype, m: int, all_to_all: bool) -> Plan:
  """The plan of one chunk of a compressed row: its own ladder (the decision to
  compress was made for the whole row); a chunk too small to shrink moves raw."""
  raw_row = m * dtype.itemsize
  rungs = codec_rungs(codec, dtype, m, all_to_all)
  if not rungs:
    return Plan(False, m, dtype, raw_row)
  return Plan(True, m, dtype, raw_row, codec, rungs)


def codec_rungs(codec, dtype, m: int, all_to_all: bool = False) -> tuple:
  """The compressed slot sizes (bytes per row) the transport compiles for rows of m
  elements of `dtype` with `codec` (a registry.Codec): the ladder from the codec's
  min_nbytes, or from its `ladder_floor` (where real rows land; entropy.py) with
  transport.LOW_RUNGS more below it for rows that compress better still."""
  dtype = np.dtype(dtype)
  min_nbytes = codec.min_nbytes(dtype, m)
  floor = getattr(codec.impl, "ladder_floor", None)
  if floor is None:
    return transport.ladder(min_nbytes, m * dtype.itemsize, all_to_all=all_to_all)
  return transport.ladder(floor(dtype, m), m * dtype.itemsize, all_to_all=all_to_all,
                          below=min_nbytes)


def codec_ladder(codec: str, dtype, m: int, *, all_to_all: bool = False) -> tuple:
  """The slot ladder the collectives compile for rows of m elements (public).

  Args:
    codec: a registered codec name ("zipccl", "entropy", ...).
    dtype: the rows' dtype (one the codec supports).
    m: elements per row (one peer's message).
    all_to_all: the ladder of an all-to-all transport (psum_scatter, all_to_all,
      psum's reduce-scatter), shorter; else that of a gather or permute.

  Returns:
    Ascending compressed slot sizes in bytes per row; the raw rung (m * itemsize
    bytes) is implicit above the last. Empty when no encoding is smaller than raw.

  Raises:
    ValueError / TypeError naming the argument.
  """
  if not isinstance(codec, str) or codec not in registry.names():
    raise ValueError(f"codec_ladder: codec must be one of {registry.names()}, got {codec!r}")
  c = registry.get(codec)
  dt = np.dtype(dtype)
  if not c.supports(dt):
    raise TypeError(f"codec_ladder: codec {codec!r} does not take dtype {dt.name}")
  if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
    raise ValueError(f"codec_ladder: m must be a positive int (elements per row), got {m!r}")
  return codec_rungs(c, dt, int(m), all_to_all)


def auto_chunks(*, codec: str, dtype, m: int, collective: str | None = None,
                n_peers: int | None = None) -> int:
  """chunks="auto": the chunk count of a compressed row transport.

  With a calibration in force, `costmodel.best_chunks` (the count whose modelled
  time is lowest; it counts the per-chunk latencies against the overlap of codec
  and wire the platform allows, `costmodel.overlap_fraction`). Without one, 1:
  the unchunked transport. Static, identical on every participant.
  """
  cal = costmodel.active_calibration() if collective is not None and n_peers else None
  if cal is None or codec not in cal.codecs:
    return 1
  return costmodel.best_chunks(collective, dtype, m, n_peers, cal, codec)


def auto_codec(*, dtype, m: int, collective: str | None = None,
               n_peers: int | None = None) -> str:
  """codec="auto": the registered codec a call of rows of m elements of `dtype` uses.

  With a calibration in force (as `auto_compress`), the one with the lowest
  modelled time among the codecs it measured for `dtype`
  (`costmodel.fastest_codec`); without one, or when it measured none of them,
  AUTO_CODEC, or the first registered codec that takes `dtype` when that one does
  not (the entropy codec takes no float32: the window codec). Static, identical on
  every participant that holds the same calibration; whether the call then
  compresses at all is the policy's business.
  """
  dt = np.dtype(dtype)
  names = tuple(c for c in registry.names() if registry.get(c).supports(dt))
  cal = costmodel.active_calibration() if collective is not None and n_peers else None
  if cal is not None:
    best = costmodel.fastest_codec(collective, dt, m, n_peers, cal, names)
    if best is not None:
      return best
  return AUTO_CODEC if AUTO_CODEC in names or not names else names[0]


def resolve_codec(opts: Opts, dtype, m: int, *, collective: str | None = None,
                  n_peers: int | None = None) -> Opts:
  """`opts` with codec="auto" replaced by `auto_codec`'s choice (else unchanged), so
  that plans and stats name the codec the call actually uses."""
  if opts.codec != "auto":
    return opts
  return opts._replace(codec=auto_codec(dtype=dtype, m=m, collective=collective,
                                        n_peers=n_peers))


def auto_compress(*, codec: str, dtype, m: int, min_nbytes: int,
                  collective: str | None = None, n_peers: int | None = None) -> bool:
  """policy="auto": compress rows of m elements of `dtype` or move them raw.

  The one place the decision is made. Rows whose smallest encoding (the codec's
  min_nbytes) is not smaller than raw never are. With a calibration in force
  (`costmodel.active_calibration`: `zipccl_jax.set_calibration` / `calibrate`, or
  the file $ZIPCCL_CALIBRATION or ~/.cache/zipccl_jax/calibration.json),
  `costmodel.decide` compares the modelled times of the raw and the compressed
  transport of `collective` over `n_peers`. Without one (or for callers that name
  no collective) the static rule holds: rows of at least AUTO_MIN_ROW_BYTES raw
  bytes are compressed, so the default is fewer bytes on the wire. Static either
  way, and identical on every participant that holds the same calibration. The
  ladder's raw rung bounds the cost of a wrong guess to the 4-byte agreement.
  """
  raw_row = m * np.dtype(dtype).itemsize
  if min_nbytes >= raw_row:
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
