"""The cost model: when does compressing a collective pay? Pure arithmetic on a
`Calibration` (calibration.py), no JAX.

Per call and from static shapes only, the modelled time of the uncompressed row
transport is compared with the compressed one for each codec:

    t_raw  = alpha_op + (beta_op + copy_op) * wire_raw
    t_comp = t_encode(raw in) + alpha_agree + alpha_op + beta_op * wire_comp
             + t_decode(raw out) + extra_op * wire_raw

per collective algorithm (table in `_terms`). Wire bytes are counted as the bytes
one device *receives* (N - 1 rows for all-gather and all-to-all, 1 for a permute),
so beta is 1 / bandwidth of one device's link and compares across algorithms and
mesh sizes. `choose` answers every static question of one call (codec, compress,
chunks) from one set of modelled times; `decide`, `fastest_codec` and `best_chunks`
answer one question each.

A decision is static per call and must be identical on every participant (the
transport's branches hold collectives). It depends only on shapes and the
calibration, so every process must hold the same calibration (calibration.py).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from zipccl_jax._src.calibration import (
    COLLECTIVES, _ITEMSIZE, Calibration, LinkFit, _RESIDUAL_ALGOS, resolve_calibration)

# Compress only when the model says compression is at least this much faster
# (a fraction of the raw time): raw is simpler and the model has noise.
DEFAULT_MARGIN = 0.05
# The slot ladder (issue 10) sends the next rung above the used size: rungs are
# spaced so that the wire is within ~2% of it. Counted against the codec.
LADDER_SLACK = 1.02
_ROW_HEADER = 128          # bytes of the common row header (docs/format.md)
_ALIGN = 128



# ---- the model ------------------------------------------------------------------------------


def _dtype_name(fn: str, dtype) -> str:
  try:
    name = np.dtype(dtype).name
  except TypeError:
    name = str(dtype)
  if name not in _ITEMSIZE:
    raise TypeError(f"{fn}: dtype must be bfloat16, float16 or float32, got {dtype!r}")
  return name


def _check_int(fn: str, arg: str, value, lo: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{fn}: {arg} must be an int, got {value!r}")
  if value < lo:
    raise ValueError(f"{fn}: {arg} must be >= {lo}, got {value}")
  return int(value)


def _link(cal: Calibration, algo: str, n_peers: int) -> tuple[float, float]:
  """(alpha, beta) of `algo` for an axis of n_peers.

  Ring / pairwise algorithms take N-1 steps, so alpha is scaled by
  (N-1)/(N_cal-1) from the calibrated axis (a documented assumption); a permute
  is one step; the all-reduce takes ~log2 N steps. beta is per received byte.
  """
  f = cal.links[algo]
  nc = max(cal.n_peers, 2)
  if algo in ("all_gather", "all_to_all"):
    scale = (n_peers - 1) / (nc - 1)
  elif algo == "all_reduce":
    scale = max(math.log2(n_peers), 1.0) / max(math.log2(nc), 1.0)
  else:
    scale = 1.0
  return f.alpha_s * max(scale, 0.0), f.beta_s_per_byte


def compressed_row_bytes(raw_row_bytes: int, ratio: float) -> int:
  """Modelled wire bytes of one compressed row: header + raw/ratio, 128-aligned,
  times the ladder slack, never above the raw row (the raw rung)."""
  if raw_row_bytes == 0:
    return 0
  body = _ROW_HEADER + raw_row_bytes / max(ratio, 1e-9)
  used = math.ceil(body / _ALIGN) * _ALIGN
  return int(min(math.ceil(used * LADDER_SLACK), raw_row_bytes))




# Platforms whose codec handlers skip the transport's own row (docs/design.md,
# "Transport: the slot ladder"); the CUDA handlers code every row.
SKIPS_OWN_ROW = frozenset({"cpu"})


def _terms(collective: str, n: int, skip_own: bool = True) -> list[tuple[str, int, int]]:
  """The transport of each collective: [(algorithm, rows encoded, rows decoded)].

  Rows are of the call's row size (one peer's message). all_gather encodes its
  block (1 row) and decodes the N-1 rows of the others (its own is copied);
  all_to_all / psum_scatter encode the N-1 rows for the others and decode the N-1
  that arrive from them; psum is a reduce-scatter followed by an all_gather of the
  reduced row; ppermute moves one row. skip_own=False (a platform whose handlers
  code every row, SKIPS_OWN_ROW) counts the own row too: N instead of N-1.
  """
  o = n - 1 if skip_own else n
  return {
      "all_gather": [("all_gather", 1, o)],
      "all_to_all": [("all_to_all", o, o)],
      "psum_scatter": [("all_to_all", o, o)],
      "psum": [("all_to_all", o, o), ("all_gather", 1, o)],
      "ppermute": [("ppermute", 1, 1)],
  }[collective]


def _wire_rows(algo: str, n: int) -> int:
  """Rows one device receives in `algo` (its own row is not on the wire)."""
  return 1 if algo == "ppermute" else n - 1


# Overlap of codec and wire between the chunks of a chunked transport, per
# platform: the fraction of the pipelined ideal it reaches (0 = the chunks run in
# series, 1 = chunk k+1's encode and chunk k-1's decode hide under chunk k's
# transfer). XLA:CPU runs them in series: measured with gloo on a shaped link
# (docs/design.md, "Limits"). Platforms not listed
# count as 0 until measured; ZIPCCL_OVERLAP declares a value (`overlap_fraction`).
MEASURED_OVERLAP = {"cpu": 0.0}
OVERLAP_ENV_VAR = "ZIPCCL_OVERLAP"
# chunks="auto" considers these counts (transport.MAX_CHUNKS is the largest), and
# only chunks of at least MIN_CHUNK_ELEMENTS elements (the transport aligns chunks
# to 4096 elements).
CHUNK_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)
MIN_CHUNK_ELEMENTS = 4096


def overlap_fraction(calibration: Calibration | None = None) -> float:
  """The overlap fraction the model assumes for chunked transports, in [0, 1].

  $ZIPCCL_OVERLAP when set (read on every call: it must be the same on every
  participant, like the calibration), else MEASURED_OVERLAP of the calibration's
  platform, else 0.
  """
  env = os.environ.get(OVERLAP_ENV_VAR, "").strip()
  if env:
    try:
      v = float(env)
    except ValueError:
      v = math.nan
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"{OVERLAP_ENV_VAR} must be a number in [0, 1], got {env!r}")
    return v
  if calibration is None:
    return 0.0
  return MEASURED_OVERLAP.get(calibration.platform, 0.0)


def _pipeline(stages: Sequence[float], chunks: int, overlap: float) -> float:
  """Time of `chunks` chunks that each run `stages` (one chunk's stage times).

  In series: chunks x sum(stages). Pipelined (stages of different chunks
  overlap): sum(stages) + (chunks - 1) x max(stages), the bottleneck stage runs
  once per further chunk. The result interpolates with `overlap` in [0, 1]; one
  chunk is sum(stages) either way.
  """
  one = sum(stages)
  if chunks <= 1:
    return one
  serial = chunks * one
  piped = one + (chunks - 1) * max(stages)
  return (1.0 - overlap) * serial + overlap * piped


def model_time(collective: str, dtype, row_elements: int, n_peers: int,
               calibration: Calibration | None = None, codec: str | None = None, *,
               chunks: int = 1, agreement: bool = True,
               overlap: float | None = None, residual: bool = True) -> float:
  """Modelled seconds of one collective call (None codec: the raw row transport).

  Args:
    collective: one of COLLECTIVES.
    dtype: bfloat16, float16 or float32.
    row_elements: elements of one row (one peer's message; for all_gather and
      ppermute the whole block, for the others block / n_peers).
    n_peers: size of the collective's axis.
    calibration: see `resolve_calibration`.
    codec: a codec name present in the calibration, or None for uncompressed.
    chunks: chunks of the compressed transport (1 = encode, agree, transfer,
      decode in series, the unchunked transport). Each chunk pays the codec
      latencies, the collective's alpha and its own agreement; the raw transport
      is never chunked.
    agreement: the compressed path runs one tiny all-reduce per chunk before
      sending (the slot ladder's size agreement).
    overlap: fraction of the pipelined ideal the chunks reach, in [0, 1]; None:
      `overlap_fraction(calibration)` (0 on XLA:CPU, measured).
    residual: add the codec's measured end-to-end residual per received byte
      (`CodecFit.extra_s_per_byte`; `calibrate` turns it off to measure it).
  """
  fn = "model_time"
  dt, m, n = check_call_args(fn, collective, dtype, row_elements, n_peers)
  chunks = _check_int(fn, "chunks", chunks, 1)
  cal = resolve_calibration(calibration)
  raw_row = m * _ITEMSIZE[dt]
  red = cal.reduce.get(dt)
  t = 0.0
  if collective in ("psum_scatter", "psum") and red is not None and n > 1:
    t += red.alpha_s + red.beta_s_per_byte * n * raw_row
  if n == 1 or m == 0:
    return t
  if codec is None:
    for algo, _, _ in _terms(collective, n):
      a, b = _link(cal, algo, n)
      t += a + (b + cal.links[algo].copy_s_per_byte) * _wire_rows(algo, n) * raw_row
    return t
  fits = cal.codecs.get(codec)
  if fits is None or dt not in fits:
    raise ValueError(f"{fn}: codec {codec!r} has no {dt} numbers in calibration "
                     f"{cal.fingerprint} (codecs: {sorted(cal.codecs)})")
  f = fits[dt]
  if overlap is None:
    overlap = overlap_fraction(cal)
  elif not 0.0 <= overlap <= 1.0:
    raise ValueError(f"{fn}: overlap must be in [0, 1], got {overlap!r}")
  k = min(chunks, m)
  raw_chunk = raw_row / k                      # bytes of one chunk of a row
  wire_row = compressed_row_bytes(math.ceil(raw_chunk), f.ratio)
  agree = _link(cal, "all_reduce", n)[0] if agreement else 0.0
  for algo, enc_rows, dec_rows in _terms(collective, n, cal.platform in SKIPS_OWN_ROW):
    a, b = _link(cal, algo, n)
    enc = f.encode_latency_s + f.encode_s_per_byte * enc_rows * raw_chunk
    dec = f.decode_latency_s + f.decode_s_per_byte * dec_rows * raw_chunk
    wire = agree + a + b * _wire_rows(algo, n) * wire_row
    t += _pipeline([enc, wire, dec], k, overlap)
    if residual:
      t += f.extra_s_per_byte(algo) * _wire_rows(algo, n) * raw_row
  return t


def best_chunks(collective: str, dtype, row_elements: int, n_peers: int,
                calibration: Calibration | str | os.PathLike | None = None,
                codec: str = "zipccl", *, overlap: float | None = None,
                max_chunks: int = CHUNK_CANDIDATES[-1]) -> int:
  """chunks="auto": the chunk count with the lowest modelled time of a compressed call.

  Static (shapes, calibration, overlap), so identical on every participant. A
  count must beat one chunk by more than 1% (the model's noise), and chunks hold
  at least MIN_CHUNK_ELEMENTS elements. With no overlap (XLA:CPU, measured) every
  extra chunk only adds latencies, so the answer is 1.

  Args:
    collective, dtype, row_elements, n_peers, calibration: as `model_time`.
    codec: the codec the call compresses with; a codec or dtype the calibration
      lacks gives 1.
    overlap: as `model_time` (None: `overlap_fraction`).
    max_chunks: the largest count considered.

  Returns:
    An int in CHUNK_CANDIDATES, at most max_chunks.
  """
  fn = "best_chunks"
  m = _check_int(fn, "row_elements", row_elements, 0)
  n = _check_int(fn, "n_peers", n_peers, 1)
  _check_int(fn, "max_chunks", max_chunks, 1)
  cal = resolve_calibration(calibration)
  dt = _dtype_name(fn, dtype)
  if n == 1 or m == 0 or dt not in cal.codecs.get(codec, {}):
    return 1
  best, best_t = 1, model_time(collective, dt, m, n, cal, codec, overlap=overlap)
  limit = best_t * 0.99
  for k in CHUNK_CANDIDATES[1:]:
    if k > max_chunks or m // k < MIN_CHUNK_ELEMENTS:
      break
    t = model_time(collective, dt, m, n, cal, codec, chunks=k, overlap=overlap)
    if t < limit and t < best_t:
      best, best_t = k, t
  return best


def decide(collective: str, dtype, row_elements: int, n_peers: int,
           calibration: Calibration | str | os.PathLike | None = None,
           codecs: Iterable[str] | None = None, *, chunks: int = 1,
           margin: float = DEFAULT_MARGIN,
           overlap: float | None = None) -> tuple[bool, str | None]:
  """Whether to compress one collective call, and with which codec.

  Static: a pure function of its arguments (shapes and the calibration's
  content), so every participant that holds the same Calibration decides the
  same.

  Args:
    collective: "all_gather", "psum_scatter", "psum", "all_to_all" or "ppermute".
    dtype: the tensor's dtype (bfloat16, float16, float32).
    row_elements: elements of one peer's message (`_Plan.m` of the transport).
    n_peers: size of the collective's axis (product of its mesh axes).
    calibration: a Calibration, a path, or None (see `resolve_calibration`).
    codecs: candidate codec names (default: every codec the calibration has);
      names the calibration lacks are skipped.
    chunks: chunks of the compressed transport (1 = unchunked; see `model_time`).
    margin: compress only when the compressed time is below (1 - margin) x raw.
    overlap: as `model_time` (None: `overlap_fraction`, 0 on XLA:CPU).

  Returns:
    (True, codec) for the fastest codec when it beats raw by the margin,
    else (False, None).

  Raises:
    ValueError / TypeError naming the bad argument.
  """
  fn = "decide"
  dt, m, n = check_call_args(fn, collective, dtype, row_elements, n_peers)
  _check_int(fn, "chunks", chunks, 1)
  if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
    raise ValueError(f"{fn}: margin must be a number in [0, 1), got {margin!r}")
  cal = resolve_calibration(calibration)
  names = sorted(cal.codecs) if codecs is None else check_codec_names(fn, codecs)
  if n == 1 or m == 0:
    return False, None
  best, best_t = _fastest(collective, dt, m, n, cal, names, chunks, overlap)
  if best is not None and best_t < (1.0 - margin) * model_time(collective, dt, m, n, cal,
                                                                None, chunks=chunks):
    return True, best
  return False, None


def _fastest(collective, dt, m, n, cal, names, chunks=1, overlap=None):
  """(codec, modelled time) of the fastest of `names` the calibration has for dt,
  (None, inf) when it has none. Candidates are sorted first, so ties break the
  same way whatever order the caller listed them in."""
  best, best_t = None, math.inf
  for c in sorted({c for c in names if dt in cal.codecs.get(c, {})}):
    t = model_time(collective, dt, m, n, cal, c, chunks=chunks, overlap=overlap)
    if t < best_t:
      best, best_t = c, t
  return best, best_t


def fastest_codec(collective: str, dtype, row_elements: int, n_peers: int,
                  calibration: Calibration | str | os.PathLike | None = None,
                  codecs: Iterable[str] | None = None) -> str | None:
  """The codec with the lowest modelled time for one call (compressing or not).

  What `codec="auto"` compresses with once a calibration is in force: unlike
  `decide` it does not compare with raw (policy="always" still compresses;
  policy="auto" then asks `decide` about this codec alone, which is the same
  answer as `decide` over all of them). Static, so identical on every
  participant holding the same calibration.

  Args:
    collective, dtype, row_elements, n_peers, calibration: as `decide`.
    codecs: candidate codec names (default: every codec the calibration has);
      names the calibration lacks for this dtype are skipped.

  Returns:
    A codec name, or None when the calibration has no candidate for the dtype
    (or the call moves nothing: one peer, or no elements).
  """
  fn = "fastest_codec"
  dt, m, n = check_call_args(fn, collective, dtype, row_elements, n_peers)
  cal = resolve_calibration(calibration)
  names = sorted(cal.codecs) if codecs is None else check_codec_names(fn, codecs)
  if n == 1 or m == 0:
    return None
  return _fastest(collective, dt, m, n, cal, names)[0]


class Choice(NamedTuple):
  """The cost model's answer for one call (`choose`)."""
  codec: str | None     # the codec the call uses (None: the calibration has none for it)
  compress: bool        # policy "auto": whether compressing beats raw by the margin
  chunks: int           # the chunk count of the compressed transport


def choose(collective: str, dtype, row_elements: int, n_peers: int, calibration: Calibration,
           codecs: Sequence[str], *, chunks: int | None = None,
           margin: float = DEFAULT_MARGIN) -> Choice:
  """Every static question of one call from one set of modelled times.

  The codec is the one of `codecs` (registered codecs that take the dtype) with the
  lowest modelled time (ties: the first in sorted order; none when the calibration
  has none of them for the dtype); compress is whether that codec beats raw by
  `margin`; chunks is `chunks`, or when None the count with the lowest modelled
  time (`best_chunks`) once compressing. The same answers as `fastest_codec`,
  `decide(codecs=(codec,))` and `best_chunks` asked one after another.
  """
  fn = "choose"
  dt, m, n = check_call_args(fn, collective, dtype, row_elements, n_peers)
  if n == 1 or m == 0:
    return Choice(None, False, chunks or 1)
  codec, t_codec = _fastest(collective, dt, m, n, calibration, check_codec_names(fn, codecs))
  if codec is None:
    return Choice(None, False, chunks or 1)
  compress = t_codec < (1.0 - margin) * model_time(collective, dt, m, n, calibration, None)
  if chunks is None:
    chunks = best_chunks(collective, dt, m, n, calibration, codec)
  return Choice(codec, compress, chunks)


def check_call_args(fn, collective, dtype, row_elements, n_peers) -> tuple:
  """One modelled call's arguments, checked: (dtype name, row elements, peers)."""
  if collective not in COLLECTIVES:
    raise ValueError(f"{fn}: collective must be one of {COLLECTIVES}, got {collective!r}")
  return (_dtype_name(fn, dtype), _check_int(fn, "row_elements", row_elements, 0),
          _check_int(fn, "n_peers", n_peers, 1))


def check_codec_names(fn, codecs) -> list:
  """`codecs=`: a codec name or an iterable of names (checked to be str)."""
  names = [codecs] if isinstance(codecs, str) else list(codecs)
  for c in names:
    if not isinstance(c, str):
      raise TypeError(f"{fn}: codecs must be codec names (str), got {c!r}")
  return names


# ---- projection to other clusters ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProjectionRow:
  """One cell of `project`: modelled times of raw and compressed."""
  collective: str
  n_hosts: int
  message_bytes: int     # raw bytes of the block each process contributes
  raw_s: float
  compressed_s: float
  codec: str
  compress: bool         # decide()'s answer (with the margin)

  @property
  def ratio(self) -> float:
    """compressed / raw time (< 1: compression pays)."""
    return self.compressed_s / self.raw_s if self.raw_s > 0 else 1.0


def projected_calibration(calibration: Calibration | None = None, *,
                          link_gbit: float | None = None, alpha_s: float | None = None,
                          encode_GBps: float | None = None, decode_GBps: float | None = None,
                          link_efficiency: float = 1.0) -> Calibration:
  """The calibration with some numbers replaced (a what-if for `project`).

  Args:
    calibration: the base (see `resolve_calibration`).
    link_gbit: nominal per-device link speed; beta = 8 / (link_gbit * 1e9 *
      link_efficiency) for the bandwidth algorithms.
    alpha_s: latency per collective call (all algorithms; all_reduce keeps its
      ratio to all_gather).
    encode_GBps, decode_GBps: codec throughput (raw GB/s) for every codec and
      dtype, e.g. a GPU's.
    link_efficiency: achieved / nominal bandwidth, in (0, 1].
  """
  fn = "projected_calibration"
  cal = resolve_calibration(calibration)
  for arg, v in (("link_gbit", link_gbit), ("alpha_s", alpha_s),
                 ("encode_GBps", encode_GBps), ("decode_GBps", decode_GBps)):
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                          or (v == 0 and arg != "alpha_s")):
      raise ValueError(f"{fn}: {arg} must be a positive number, got {v!r}")
  if not 0 < link_efficiency <= 1:
    raise ValueError(f"{fn}: link_efficiency must be in (0, 1], got {link_efficiency!r}")
  links = dict(cal.links)
  if link_gbit is not None:
    beta = 8.0 / (link_gbit * 1e9 * link_efficiency)
    links = {a: dataclasses.replace(f, beta_s_per_byte=beta) for a, f in links.items()}
  if alpha_s is not None:
    base = links["all_gather"].alpha_s or 1.0
    links = {a: dataclasses.replace(
        f, alpha_s=alpha_s * (f.alpha_s / base if a == "all_reduce" else 1.0))
        for a, f in links.items()}
  codecs = {}
  for c, per in cal.codecs.items():
    codecs[c] = {}
    for d, f in per.items():
      if encode_GBps is not None:
        f = dataclasses.replace(f, encode_s_per_byte=1e-9 / encode_GBps, encode_mix_factor=1.0)
      if decode_GBps is not None:
        f = dataclasses.replace(f, decode_s_per_byte=1e-9 / decode_GBps, decode_mix_factor=1.0)
      if encode_GBps is not None or decode_GBps is not None:
        # the residual was measured with this machine's codec: another codec
        # (e.g. a GPU's) has its own, unknown
        f = dataclasses.replace(f, **{f"extra_{a}_s_per_byte": 0.0 for a in _RESIDUAL_ALGOS})
      codecs[c][d] = f
  meta = dict(cal.meta, projected_from=cal.fingerprint, link_gbit=link_gbit,
              encode_GBps=encode_GBps, decode_GBps=decode_GBps, alpha_s=alpha_s)
  return dataclasses.replace(cal, links=links, codecs=codecs, source="projected", meta=meta)


def project(calibration: Calibration | str | None = None, *, n_hosts: Sequence[int] = (2, 8, 64),
            message_bytes: Sequence[int] = (2**18, 2**20, 2**22, 2**24, 2**26),
            collectives: Sequence[str] = COLLECTIVES, dtype="bfloat16",
            codec: str | None = None, link_gbit: float | None = None,
            alpha_s: float | None = None, encode_GBps: float | None = None,
            decode_GBps: float | None = None, link_efficiency: float = 1.0,
            chunks: int = 1, margin: float = DEFAULT_MARGIN,
            overlap: float | None = None) -> list[ProjectionRow]:
  """Modelled raw vs compressed times on other clusters: where compression pays.

  One row per (collective, n_hosts, message size). `message_bytes` is the raw
  block one process contributes (all_gather / ppermute: its shard; psum_scatter,
  psum, all_to_all: its whole input, n_hosts rows). The link, latency and codec
  speed can be overridden (see `projected_calibration`); alpha scales with the
  number of steps of each algorithm (`_link`). `codec`: a codec the calibration
  has, or None for what `codec="auto"` takes in each row (the fastest modelled
  codec, `fastest_codec`).

  Returns:
    A list of ProjectionRow; `format_projection` renders it as markdown.
  """
  cal = projected_calibration(calibration, link_gbit=link_gbit, alpha_s=alpha_s,
                              encode_GBps=encode_GBps, decode_GBps=decode_GBps,
                              link_efficiency=link_efficiency)
  dt = _dtype_name("project", dtype)
  if codec is None:
    if not any(dt in per for per in cal.codecs.values()):
      raise ValueError(f"project: the calibration has no codec numbers for {dt}")
  elif codec not in cal.codecs:
    raise ValueError(f"project: codec must be one of {sorted(cal.codecs)}, got {codec!r}")
  rows = []
  for coll in collectives:
    if coll not in COLLECTIVES:
      raise ValueError(f"project: collectives must be among {COLLECTIVES}, got {coll!r}")
    for h in n_hosts:
      h = _check_int("project", "n_hosts", h, 2)
      for mb in message_bytes:
        mb = _check_int("project", "message_bytes", mb, 1)
        elems = max(mb // _ITEMSIZE[dt], 1)
        m = elems if coll in ("all_gather", "ppermute") else max(elems // h, 1)
        raw = model_time(coll, dt, m, h, cal, None, chunks=chunks)
        c = codec or _fastest(coll, dt, m, h, cal, cal.codecs, chunks, overlap)[0]
        comp = model_time(coll, dt, m, h, cal, c, chunks=chunks, overlap=overlap)
        yes, _ = decide(coll, dt, m, h, cal, (c,), chunks=chunks, margin=margin,
                        overlap=overlap)
        rows.append(ProjectionRow(coll, h, mb, raw, comp, c, yes))
  return rows


def _fmt_bytes(b: int) -> str:
  for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if b >= k:
      return f"{b / k:g} {unit}"
  return f"{b} B"


def format_projection(rows: Sequence[ProjectionRow]) -> str:
  """Markdown table of `project`'s rows."""
  out = ["| collective | hosts | MiB/process | raw ms | compressed ms | compressed/raw | auto |",
         "|---|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    out.append(f"| {r.collective} | {r.n_hosts} | {r.message_bytes / 2**20:g} | "
               f"{r.raw_s * 1e3:.3f} | {r.compressed_s * 1e3:.3f} | {r.ratio:.2f} | "
               f"{r.codec if r.compress else 'raw'} |")
  return "\n".join(out)


# ---- measuring -----------------------------------------------------------------------------


def fit_alpha_beta(x: Sequence[float], t: Sequence[float]) -> LinkFit:
  """Robust fit of t = alpha + beta x (least absolute deviations, then a median).

  beta: the slope of the line with the smallest sum of absolute residuals among
  the lines through two of the points (and the lines through the origin or flat
  through one point). Such a line ignores one wild point among four, and
  absolute residuals let the largest sizes, which the bandwidth-bound calls of
  training are like, set the slope. alpha: the median of t - beta x over the
  three smallest sizes. Both are clamped at >= 0 (a falling line: beta 0).

  A least-squares fit weighted by 1/t, used before, let one slow call at a small
  size (2.8 ms for a 4 KiB row next to 0.5 ms for 64 KiB, on a loaded machine)
  tilt the slope: an all-gather link fitted 0.73 Gbit/s from calls whose 1-4 MiB
  points said 0.46.
  """
  x = np.asarray(x, np.float64)
  t = np.asarray(t, np.float64)
  if x.shape != t.shape or x.ndim != 1 or len(x) < 2:
    raise ValueError(f"fit_alpha_beta: need >= 2 (x, t) pairs of equal length, got "
                     f"{x.shape} and {t.shape}")
  if np.any(t <= 0) or np.any(x < 0):
    raise ValueError("fit_alpha_beta: times must be > 0 and sizes >= 0")
  lines = [(float(ti), 0.0) for ti in t]                             # flat
  lines += [(0.0, float(ti / xi)) for xi, ti in zip(x, t) if xi > 0]  # through the origin
  for i in range(len(x)):
    for j in range(i + 1, len(x)):
      if x[j] != x[i]:
        b = float((t[j] - t[i]) / (x[j] - x[i]))
        lines.append((float(t[i] - b * x[i]), b))
  cost = [float(np.sum(np.abs(t - a - b * x))) for a, b in lines]
  beta = max(lines[int(np.argmin(cost))][1], 0.0)
  # alpha from the three smallest sizes, where it is most of the time (a 5%
  # wobble of a 4 MiB call would swamp a 0.1 ms latency); one of them may be off.
  small = np.argsort(x, kind="stable")[:3]
  alpha = float(np.median(t[small] - beta * x[small]))
  return LinkFit(max(alpha, 0.0), beta)


