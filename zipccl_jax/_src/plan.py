"""The planner: one static answer per call (codec, compress or not, chunks, ladder).

Every compressed transport asks `plan` once, at trace time, how to move rows of m
elements. The answer is a function of static facts only (the collective, dtype,
row size, peer count, the validated options and the calibration in force), so
every process that traces the same call with the same calibration builds the same
program. With a calibration in force, the cost model answers all of it in one
query (`costmodel.choose`); without one, fixed rules do (`AUTO_CODEC`,
`AUTO_MIN_ROW_BYTES`, one chunk).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from zipccl_jax._src import calibration
from zipccl_jax._src.calibration import active_calibration as _active_calibration
from zipccl_jax._src import costmodel
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src.codecs import registry
from zipccl_jax._src.options import Opts

# codec="auto" without a calibration in force: the entropy codec, for the dtypes it
# takes (float32 goes to the window codec). Why: it is the codec with the lower
# modelled time (bytes/ratio/link + bytes/encode + bytes/decode) on 10-100 Gb/s
# links with the measured codec speeds, on both platforms: one CPU core (it encodes
# as fast as the window codec and decodes ~1.7x faster, with a 3-8% better ratio)
# in 120 of 120 modelled cells (five collectives, bf16 and fp16, three data kinds,
# 10-100 Gb/s), an H200 in 91 of 120 (the window codec's faster kernels win some
# cells at 100 Gb/s). With a calibration the cost model picks per call instead.
AUTO_CODEC = "entropy"

# policy="auto" without a calibration: compress a collective when each row (the
# message for one peer) holds at least this many raw bytes. Below it the fixed
# per-row overhead (128-byte header, 128-byte aligned sections) eats the gain: the
# static ratio of a bf16 row is 1.33 at 8 KiB, 1.39 at 32 KiB and 1.40 at 64 KiB
# (1.11 fp16, 1.16 fp32), and small messages are latency-bound anyway.
AUTO_MIN_ROW_BYTES = 64 * 1024


class Plan(NamedTuple):
  """Static transport decision for rows of m elements (sizes: Python ints, exact)."""
  compress: bool
  m: int
  dtype: Any
  raw_row: int                 # raw bytes of one row: m * itemsize
  codec: Any = None            # registry.Codec when compress
  rungs: tuple = ()            # compressed slot sizes (bytes per row); the raw rung is implicit
  # Chunked transport (docs/design.md, "Transport: the slot ladder"): the row's elements [a, b) of
  # each chunk and the chunk's own plan (its own ladder). Empty: one chunk, the
  # unchunked program.
  bounds: tuple = ()
  parts: tuple = ()
  name: str | None = None      # the codec the call resolved to (stats name it), or None/"raw"
  chunk: tuple = ()            # (k, C): this plan is chunk k of C of a chunked row; () unchunked

  @property
  def chunks(self) -> int:
    """Number of chunks the row is moved in (1 = unchunked)."""
    return max(len(self.parts), 1)


def _candidates(dtype) -> tuple:
  """Registered codecs that take `dtype`, in registration order."""
  return tuple(c for c in registry.names() if registry.get(c).supports(dtype))


def default_codec(dtype) -> str | None:
  """The codec the collectives pick for `dtype` with codec="auto" and no calibration
  (None: no registered codec takes it)."""
  names = _candidates(np.dtype(dtype))
  return _fallback_codec(names) if names else None


def _fallback_codec(names: tuple) -> str | None:
  return AUTO_CODEC if AUTO_CODEC in names or not names else names[0]


def plan(fn: str, dtype, m: int, opts: Opts, *, collective: str | None = None,
         n_peers: int | None = None, all_to_all: bool = False) -> Plan:
  """How rows of m elements of dtype move: the codec and its slot ladder, or raw.

  `collective` ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
  and `n_peers` feed the cost model; `all_to_all`: the rows go over an
  all-to-all (`ladder.ALL_TO_ALL_LADDER`).
  """
  dtype = np.dtype(dtype)
  if m >= 2**31:
    raise ValueError(f"{fn}: a row (one peer's message) must have fewer than 2^31 elements, "
                     f"got {m}")
  raw_row = m * dtype.itemsize
  cal = calibration.active_calibration() if collective is not None and n_peers else None
  name = opts.codec
  names = _candidates(dtype) if name == "auto" else (name,)
  choice = None
  if cal is not None and name not in (None, "raw"):
    choice = costmodel.choose(collective, dtype, m, n_peers, cal, names, chunks=opts.chunks)
  if name == "auto":
    name = choice.codec if choice is not None and choice.codec else _fallback_codec(names)
  if name in (None, "raw") or opts.policy == "never" or m == 0:
    return Plan(False, m, dtype, raw_row, name=name)
  codec = registry.get(name)
  if not codec.supports(dtype):
    return Plan(False, m, dtype, raw_row, name=name)
  rungs = ladder_lib.codec_rungs(codec, dtype, m, all_to_all)
  if not rungs:   # even the smallest encoding is not smaller than raw
    return Plan(False, m, dtype, raw_row, name=name)
  if opts.policy == "auto":
    compress = _auto_compress(choice, name, cal, raw_row, codec.min_nbytes(dtype, m))
    if not compress:
      return Plan(False, m, dtype, raw_row, name=name)
  chunks = opts.chunks
  if chunks is None:
    chunks = choice.chunks if choice is not None and choice.codec == name else 1
  return _chunked(Plan(True, m, dtype, raw_row, codec, rungs, name=name), chunks, all_to_all)


def _auto_compress(choice, name: str, cal, raw_row: int, min_nbytes: int) -> bool:
  """policy="auto": the cost model's answer with a calibration in force (for the
  codec it chose, or for the one the call names), else the size rule: rows of at
  least AUTO_MIN_ROW_BYTES raw bytes compress. Rows whose smallest encoding is not
  smaller than raw never do."""
  if min_nbytes >= raw_row:
    return False
  if cal is None:
    return raw_row >= AUTO_MIN_ROW_BYTES
  return choice is not None and choice.codec == name and choice.compress


def with_ladder(p: Plan, chunks: int, all_to_all: bool) -> Plan:
  """`p` (a compressed plan) moved in `chunks` chunks over a gather/permute ladder or
  an all-to-all one: the same codec and decision, the ladders rebuilt."""
  if not p.compress:
    return p
  return _chunked(p._replace(rungs=ladder_lib.codec_rungs(p.codec, p.dtype, p.m, all_to_all)),
                  chunks, all_to_all)


def _chunked(p: Plan, chunks: int, all_to_all: bool) -> Plan:
  """`p` (compressed, its ladder built) cut into `chunks` chunks, each with its own plan."""
  bounds = ladder_lib.chunk_bounds(p.m, chunks)
  if len(bounds) == 1:
    return p._replace(bounds=(), parts=())
  return p._replace(bounds=bounds,
                    parts=tuple(_chunk_plan(p.codec, p.dtype, b - a, all_to_all, p.name)._replace(
                                    chunk=(k, len(bounds))) for k, (a, b) in enumerate(bounds)))


def _chunk_plan(codec, dtype, m: int, all_to_all: bool, name: str) -> Plan:
  """The plan of one chunk of a compressed row: its own ladder (the decision to
  compress was made for the whole row); a chunk too small to shrink moves raw."""
  raw_row = m * dtype.itemsize
  rungs = ladder_lib.codec_rungs(codec, dtype, m, all_to_all)
  if not rungs:
    return Plan(False, m, dtype, raw_row, name=name)
  return Plan(True, m, dtype, raw_row, codec, rungs, name=name)


def auto_codec(*, dtype, m: int, collective: str | None = None,
               n_peers: int | None = None) -> str:
  """The codec `codec="auto"` resolves to for one call (what `plan` names)."""
  return plan("auto_codec", dtype, m, Opts("auto", "always"), collective=collective,
              n_peers=n_peers).name


def decide(collective: str, dtype, row_elements: int, n_peers: int, calibration=None,
           codecs=None, *, chunks: int = 1, margin: float = costmodel.DEFAULT_MARGIN,
           overlap: float | None = None) -> tuple[bool, str | None]:
  """Whether a collective with policy="auto" (and codec="auto", or one of `codecs`)
  compresses one call, and with which codec: what the collectives decide.

  With a calibration (the argument, or the one in force: `set_calibration`,
  `calibrate(activate=True)`) it is the cost model's answer
  (`zipccl_jax.costmodel` has the model; see its `decide` arguments). Without
  one, the collectives' static rule: the default codec for the dtype
  (`AUTO_CODEC` when it takes the dtype, else the first registered codec that
  does; the first of `codecs` that does, when given), when a row of
  `row_elements` holds at least `AUTO_MIN_ROW_BYTES` raw bytes and the codec's
  smallest encoding of it is smaller than raw.

  Args and Raises: as `zipccl_jax.costmodel.decide`.
  Returns: (True, codec) or (False, None).
  """
  fn = "decide"
  if calibration is not None or _active_calibration() is not None:
    return costmodel.decide(collective, dtype, row_elements, n_peers, calibration, codecs,
                            chunks=chunks, margin=margin, overlap=overlap)
  dt, m, n = costmodel.check_call_args(fn, collective, dtype, row_elements, n_peers)
  dtype = np.dtype(dt)
  supported = _candidates(dtype)
  names = supported if codecs is None else tuple(
      c for c in costmodel.check_codec_names(fn, codecs) if c in supported)
  if n == 1 or m == 0 or not names:
    return False, None
  name = _fallback_codec(names) if codecs is None else names[0]
  raw_row = m * dtype.itemsize
  if _auto_compress(None, name, None, raw_row, registry.get(name).min_nbytes(dtype, m)):
    return True, name
  return False, None
