"""The slot ladder and the chunk bounds: static sizes every host computes alike.

A compressed call moves the first rung of its ladder at or above the largest used
size among the participants (transport.py). Rungs are Python ints computed with
integer arithmetic only, so every host builds the same ladder from the same
(codec, dtype, row size). `chunk_bounds` cuts a row into the column ranges of a
chunked transport. The collectives' environment defaults (ZIPCCL_CHECK_DECODE,
ZIPCCL_CHUNKS) are read here once per process.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from zipccl_jax._src.codecs import registry

ALIGN = 128            # used sizes and slots are multiples of 128 bytes (the contract)
_ALIGN = ALIGN
# The ladder: FINE_RUNGS rungs 1% apart from the codec's min_nbytes (where data that
# compresses lands: weights, most gradients), then COARSE growth up to the raw
# size, at most MAX_RUNGS compressed rungs: each is a switch branch. Every rung
# compiles to custom calls and collectives only on XLA:CPU (a gather or permute
# rung cuts its slot with `row_prefix`, an all-to-all rung is N - 1 permutes of
# `a2a_slot`), ~0 kernels and a few ms of compile time per rung, so all
# transports get the same fine ladder (docs/design.md, "Transport: the slot ladder").
LADDER_GROWTH = ((1, 100), (1, 20))   # (fine, coarse) growth per rung, exact fractions
FINE_RUNGS = 24
MAX_RUNGS = 32
ALL_TO_ALL_LADDER = (FINE_RUNGS, LADDER_GROWTH, MAX_RUNGS)   # the same as the gathers'
UNIFORM_DEN = 1000     # a too-long ladder is respaced uniformly, growth in 0.1% steps
# A ladder that starts above the codec's min_nbytes (a codec's `ladder_floor`, where
# typical rows land) gets LOW_RUNGS more rungs below its start, each LOW_STEP
# smaller than the one above (at least min_nbytes): rows that compress much
# better than typical (zero-heavy activations and embedding gradients under the
# entropy codec's zero elision: ratios 2-10) then move within 25% of their size
# instead of on the first rung. The same for all-to-all transports.
LOW_RUNGS = 4
ALL_TO_ALL_LOW_RUNGS = LOW_RUNGS
LOW_STEP = (5, 4)       # 1.25x apart: ratios 2.0, 2.5, 3.1, 3.9 below a 1.6 floor
# Chunks: at most MAX_CHUNKS per row (each is a switch of the whole ladder: compile
# time grows with C); chunk boundaries are multiples of CHUNK_ALIGN elements (both
# codecs' block sizes, 2048 and 4096, divide it, so chunks hold whole blocks)
# unless the row is too short for that.
MAX_CHUNKS = 16
CHUNK_ALIGN = 4096


def ladder(min_nbytes: int, raw_row: int, *, all_to_all: bool = False,
           below: int | None = None) -> tuple:
  """Compressed slot sizes (bytes per row) for rows whose raw size is raw_row.

  Ascending multiples of 128 from align128(min_nbytes), all below raw_row: the
  first FINE_RUNGS 1% (at least 128 bytes) apart, the rest 5% apart, so that a
  used size u near the codec's best case lands on a rung at most 1% above u.
  Sizes above the last rung take the raw rung (raw_row bytes, implicit, not
  listed). With all_to_all (the rows of an all-to-all transport) the ladder is
  ALL_TO_ALL_LADDER (the same spacing as the others). A ladder longer than
  its maximum (one that starts low, as the entropy codec's floor does) is
  respaced with one uniform growth, the smallest in steps of 0.1% that fits: the
  rows' band is not known in advance, and a uniform ladder bounds the slack
  everywhere (~1.5-2% mean over any band, where widening the coarse part first
  left 4-6% in bands above the fine part). Python ints: exact for any size.

  below: the codec's own min_nbytes when `min_nbytes` is a floor above it (a
  codec's `ladder_floor`): then LOW_RUNGS (ALL_TO_ALL_LOW_RUNGS) rungs go below
  the first, 1.25x apart (multiples of 128, none below `below`).
  """
  rungs = _ladder_from(min_nbytes, raw_row, all_to_all)
  if below is None or not rungs or below >= rungs[0]:
    return rungs
  low, s = [], rungs[0]
  for _ in range(ALL_TO_ALL_LOW_RUNGS if all_to_all else LOW_RUNGS):
    s = max(s * LOW_STEP[1] // LOW_STEP[0] // _ALIGN * _ALIGN, -(-below // _ALIGN) * _ALIGN)
    if s >= (low[-1] if low else rungs[0]):
      break
    low.append(s)
  return tuple(reversed(low)) + rungs


def _ladder_from(min_nbytes: int, raw_row: int, all_to_all: bool) -> tuple:
  fine, ((fn, fd), (cn, cd)), max_rungs = (ALL_TO_ALL_LADDER if all_to_all else
                                            (FINE_RUNGS, LADDER_GROWTH, MAX_RUNGS))

  def build(fine, fn, fd, cn, cd):
    rungs = []
    s = -(-min_nbytes // _ALIGN) * _ALIGN
    while s < raw_row and len(rungs) <= max_rungs:
      rungs.append(s)
      num, den = (fn, fd) if len(rungs) < fine else (cn, cd)
      s = max(s + _ALIGN, s * (den + num) // den // _ALIGN * _ALIGN)
    return rungs

  rungs = build(fine, fn, fd, cn, cd)
  # Too long: one uniform growth over the whole range, the smallest (in steps of
  # 0.1%, integers only, so that every host builds the same ladder) that fits.
  g = fn * UNIFORM_DEN // fd
  while len(rungs) > max_rungs:
    g += 1
    rungs = build(0, g, UNIFORM_DEN, g, UNIFORM_DEN)
  return tuple(rungs)


@functools.cache
def check_decode_default() -> bool:
  """ZIPCCL_CHECK_DECODE=1 turns `check_decode` on by default (read once)."""
  return os.environ.get("ZIPCCL_CHECK_DECODE", "0").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def chunks_default():
  """ZIPCCL_CHUNKS: the default of the collectives' `chunks=None` ("auto" or an int;
  read once). Anything else is reported by the collective that reads it."""
  v = os.environ.get("ZIPCCL_CHUNKS", "auto").strip().lower()
  if v in ("", "auto"):
    return "auto"
  try:
    return int(v)
  except ValueError:
    return v


def chunk_bounds(m: int, chunks: int) -> tuple:
  """Element ranges ((a, b), ...) of the chunks of a row of m elements.

  min(chunks, m) non-empty ranges covering [0, m) in order, as equal as possible.
  When m >= chunks * CHUNK_ALIGN every boundary is a multiple of CHUNK_ALIGN
  (whole codec blocks; the chunks differ by at most CHUNK_ALIGN elements, the
  last holds the remainder), else the sizes are floor/ceil of m / chunks.
  Python ints: static.
  """
  if m <= 0 or chunks <= 1:
    return ((0, max(m, 0)),)
  if m >= chunks * CHUNK_ALIGN:
    blocks = -(-m // CHUNK_ALIGN)
    cuts = [CHUNK_ALIGN * (k * blocks // chunks) for k in range(chunks)]
  else:
    cuts = [k * m // chunks for k in range(chunks)]
  cuts.append(m)
  return tuple((a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a)


def codec_rungs(codec, dtype, m: int, all_to_all: bool = False) -> tuple:
  """The compressed slot sizes (bytes per row) the transport compiles for rows of m
  elements of `dtype` with `codec` (a registry.Codec): the ladder from the codec's
  min_nbytes, or from its `ladder_floor` (where real rows land; entropy.py) with
  LOW_RUNGS more below it for rows that compress better still."""
  dtype = np.dtype(dtype)
  min_nbytes = codec.min_nbytes(dtype, m)
  floor = getattr(codec.impl, "ladder_floor", None)
  if floor is None:
    return ladder(min_nbytes, m * dtype.itemsize, all_to_all=all_to_all)
  return ladder(floor(dtype, m), m * dtype.itemsize, all_to_all=all_to_all,
                          below=min_nbytes)


def codec_ladder(codec: str, dtype, m: int, *, all_to_all: bool = False) -> tuple:
  """The slot ladder the collectives compile for rows of m elements (public).

  Args:
    codec: a registered codec name ("zipccl", "entropy", ...).
    dtype: the rows' dtype (one the codec supports).
    m: elements per row (one peer's message).
    all_to_all: the ladder of an all-to-all transport (psum_scatter, all_to_all,
      psum's reduce-scatter); else that of a gather or permute.

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
