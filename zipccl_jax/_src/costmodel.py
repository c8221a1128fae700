"""A calibrated α-β cost model: when does compressing a collective pay?

`calibrate()` measures, on the user's machine and mesh,

  * every codec's encode and decode time per dtype, as latency + bytes/throughput
    (fitted over a few sizes; bytes are *raw* bytes, the tensor's own size), and
    its compression ratio on synthetic Gaussian and heavy-tailed data;
  * the link: latency α (s) and per-byte time β (s/byte) of each XLA collective the
    transport uses (all-gather, all-to-all as the transport runs it: N - 1
    collective permutes on CPU, collective-permute, and the all-reduce
    of the tiny size agreement), by timing uncompressed uint8 collectives of a few
    message sizes inside `jax.shard_map` over the given mesh axis;
  * the ordered float32 sum of the reductions (same on both paths; it only enters
    the absolute times, e.g. of `project`).

`decide()` then compares, per call and from static shapes only, the modelled time
of the uncompressed row transport with the compressed one for each codec:

    t_raw  = α_op + β_op · wire_raw
    t_comp = t_encode(raw in) + α_agree + α_op + β_op · wire_comp + t_decode(raw out)

per collective algorithm (table in `_terms`), and compresses when the best codec
beats raw by more than `margin`. Wire bytes are counted as the bytes one device
*receives* (N-1 rows for all-gather and all-to-all, 1 for a permute), so β is
1/bandwidth of one device's link and is comparable between algorithms and mesh
sizes.

Agreement of the decision. A decision is static per call and must be identical on
every participant (the branches hold collectives). It depends only on shapes and
the Calibration, so the Calibration must be identical everywhere: `calibrate`
measures on every process at once, then **broadcasts process 0's numbers** to all
processes (`jax.experimental.multihost_utils.broadcast_one_to_all`) and every
process writes those same bytes to its cache file. `Calibration.fingerprint`
identifies the content; `check_agreement` verifies it across processes.

Where the Calibration comes from (`active_calibration`): the one set with
`set_calibration` (or activated by `calibrate`); else the file named by the
ZIPCCL_CALIBRATION environment variable, or ~/.cache/zipccl_jax/calibration.json
(XDG_CACHE_HOME is honoured). policy="auto" uses the cost model only when one of
these exists, and otherwise keeps its static rule (options.auto_compress).
`decide`, `model_time` and `project` also take an explicit Calibration or path,
and without any fall back to `default_calibration()`: documented conservative
numbers (a fast link, a modest codec) under which nothing is compressed.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform as _platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

SCHEMA_VERSION = 1
ENV_VAR = "ZIPCCL_CALIBRATION"
# XLA collectives of the transport; "all_reduce" is the size/overflow agreement
# (a pmax of a few int32).
ALGORITHMS = ("all_gather", "all_to_all", "ppermute", "all_reduce")
COLLECTIVES = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
DTYPES = ("bfloat16", "float16", "float32")
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
# Compress only when the model says compression is at least this much faster
# (a fraction of the raw time): raw is simpler and the model has noise.
DEFAULT_MARGIN = 0.05
# The slot ladder (issue 10) sends the next rung above the used size: rungs are
# spaced so that the wire is within ~2% of it. Counted against the codec.
LADDER_SLACK = 1.02
_ROW_HEADER = 128          # bytes of the common row header (docs/format.md)
_ALIGN = 128


def _err(fn: str, msg: str) -> ValueError:
  return ValueError(f"{fn}: {msg}")


# ---- the fitted parameters ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LinkFit:
  """t = alpha_s + beta_s_per_byte * bytes (bytes one device receives).

  Attributes:
    alpha_s: latency of one call, seconds.
    beta_s_per_byte: seconds per received byte (1 / bandwidth).
    copy_s_per_byte: what the library's uncompressed transport (codec="raw", the
      path policy="auto" takes when it does not compress) adds per received byte
      over the bare uint8 collective: on XLA:CPU its same-width bitcasts of the
      input and the result are copy kernels (~0.5 ns/B: 20% of an all-gather's
      time at 10 Gbit/s). Measured by `calibrate` at the largest link size;
      local to the machine (kept by `projected_calibration`); 0 if unmeasured.
  """
  alpha_s: float
  beta_s_per_byte: float
  copy_s_per_byte: float = 0.0

  @property
  def bandwidth_gbit(self) -> float:
    """The fitted bandwidth in Gbit/s (inf when beta is 0)."""
    return math.inf if self.beta_s_per_byte <= 0 else 8e-9 / self.beta_s_per_byte


@dataclasses.dataclass(frozen=True)
class CodecFit:
  """One codec on one dtype: times per call and the expected ratio.

  Attributes:
    encode_latency_s, encode_s_per_byte: encode time = latency + raw bytes * s/B.
    decode_latency_s, decode_s_per_byte: decode time, the same form (raw bytes out).
    ratio: raw bytes / used bytes the model assumes: the harmonic mean of the
      measured Gaussian and heavy-tailed ratios (the bytes of a 50/50 mix of both;
      pulled towards the worse one, conservative against Gaussian alone).
    ratio_gaussian, ratio_heavy: the measured ratios (informative).
    encode_mix_factor, decode_mix_factor: the codec's time on the data of `ratio`
      (the 50/50 mix, or the user's `samples`) over its time on Gaussian data, at
      the largest codec size (`calibrate`); encode_s_per_byte / decode_s_per_byte
      already include it (both codecs are slower on heavy-tailed data: escapes,
      longer codes). 1.0 when not measured.
    extra_all_gather_s_per_byte, extra_all_to_all_s_per_byte,
      extra_ppermute_s_per_byte: the compressed transport's end-to-end residual
      per received raw byte on that algorithm: what a compressed call of this
      codec measured above (or below) the model's encode + agreement + wire +
      decode, at the largest link size on Gaussian data with the Gaussian ratio
      (`calibrate`; e.g. on XLA:CPU a gather's own-row copy and fresh result
      buffers, ~10-20% of a 10 Gbit/s all-gather). Measured on one dtype per
      codec (bf16 when calibrated) and shared by its dtypes; local to the
      machine and link (dropped by `projected_calibration` when it replaces the
      codec speeds); 0 if unmeasured.
  """
  encode_latency_s: float
  encode_s_per_byte: float
  decode_latency_s: float
  decode_s_per_byte: float
  ratio: float
  ratio_gaussian: float = 0.0
  ratio_heavy: float = 0.0
  extra_all_gather_s_per_byte: float = 0.0
  extra_all_to_all_s_per_byte: float = 0.0
  extra_ppermute_s_per_byte: float = 0.0
  encode_mix_factor: float = 1.0
  decode_mix_factor: float = 1.0

  def extra_s_per_byte(self, algo: str) -> float:
    """The residual of `algo` (0 for algorithms without one, e.g. all_reduce)."""
    return float(getattr(self, f"extra_{algo}_s_per_byte", 0.0))

  @property
  def encode_GBps(self) -> float:
    return math.inf if self.encode_s_per_byte <= 0 else 1e-9 / self.encode_s_per_byte

  @property
  def decode_GBps(self) -> float:
    return math.inf if self.decode_s_per_byte <= 0 else 1e-9 / self.decode_s_per_byte


@dataclasses.dataclass(frozen=True, eq=False)
class Calibration:
  """What `decide` needs: link fits per algorithm, codec fits per codec and dtype.

  Hashable and compared by content (`fingerprint`), so it can be part of a static
  argument. Build it with `calibrate`, `default_calibration`, `Calibration.load`
  or `Calibration.from_dict`.

  Attributes:
    platform: "cpu", "gpu", ... (the backend measured).
    n_peers: size of the mesh axis the links were measured on (0: not measured,
      the links are defaults).
    links: algorithm name -> LinkFit for every name in ALGORITHMS.
    codecs: codec name -> dtype name -> CodecFit.
    reduce: dtype name -> LinkFit-like (alpha_s, beta_s_per_byte) of the ordered
      float32 sum, per raw input byte (both paths pay it).
    source: "measured", "defaults" or "projected".
    meta: free-form provenance (date, host, jax version, sizes, process count).
  """
  platform: str
  n_peers: int
  links: Mapping[str, LinkFit]
  codecs: Mapping[str, Mapping[str, CodecFit]]
  reduce: Mapping[str, LinkFit]
  source: str = "measured"
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  # -- serialisation
  def to_dict(self) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "platform": self.platform,
        "n_peers": int(self.n_peers),
        "source": self.source,
        "links": {k: dataclasses.asdict(v) for k, v in sorted(self.links.items())},
        "codecs": {c: {d: dataclasses.asdict(f) for d, f in sorted(per.items())}
                   for c, per in sorted(self.codecs.items())},
        "reduce": {k: dataclasses.asdict(v) for k, v in sorted(self.reduce.items())},
        "meta": dict(self.meta),
    }

  def to_json(self) -> str:
    """Canonical JSON (sorted keys; floats by repr, which round-trips exactly)."""
    return json.dumps(self.to_dict(), sort_keys=True, indent=1)

  @classmethod
  def from_dict(cls, d: Mapping) -> "Calibration":
    """Inverse of `to_dict`; ValueError naming the field on malformed input."""
    fn = "Calibration.from_dict"
    if not isinstance(d, Mapping):
      raise _err(fn, f"expected a mapping, got {type(d).__name__}")
    if d.get("schema") != SCHEMA_VERSION:
      raise _err(fn, f"schema must be {SCHEMA_VERSION}, got {d.get('schema')!r} "
                 "(re-run zipccl_jax.calibrate)")
    try:
      links = {k: LinkFit(**{f: float(x) for f, x in v.items()}) for k, v in d["links"].items()}
      codecs = {c: {dt: CodecFit(**{f: float(x) for f, x in fit.items()})
                    for dt, fit in per.items()} for c, per in d["codecs"].items()}
      reduce = {k: LinkFit(**{f: float(x) for f, x in v.items()})
                for k, v in d.get("reduce", {}).items()}
      cal = cls(platform=str(d["platform"]), n_peers=int(d["n_peers"]), links=links,
                codecs=codecs, reduce=reduce, source=str(d.get("source", "measured")),
                meta=dict(d.get("meta", {})))
    except (KeyError, TypeError, AttributeError) as e:
      raise _err(fn, f"malformed calibration ({type(e).__name__}: {e})") from None
    missing = [a for a in ALGORITHMS if a not in cal.links]
    if missing:
      raise _err(fn, f"links lack the algorithms {missing}")
    return cal

  @classmethod
  def from_json(cls, text: str | bytes) -> "Calibration":
    try:
      d = json.loads(text)
    except ValueError as e:
      raise _err("Calibration.from_json", f"not JSON ({e})") from None
    return cls.from_dict(d)

  @property
  def fingerprint(self) -> str:
    """sha256 (16 hex digits) of the canonical JSON: equal iff the content is."""
    return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

  def __eq__(self, other) -> bool:
    return isinstance(other, Calibration) and self.to_json() == other.to_json()

  def __hash__(self) -> int:
    return hash(self.fingerprint)

  def save(self, path: str | os.PathLike | None = None) -> Path:
    """Writes the JSON atomically (temp file + rename); default `default_path()`."""
    p = Path(path) if path is not None else default_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(self.to_json())
    os.replace(tmp, p)
    return p

  @classmethod
  def load(cls, path: str | os.PathLike | None = None) -> "Calibration":
    """Reads a file written by `save`; FileNotFoundError when it is missing."""
    p = Path(path) if path is not None else default_path()
    return cls.from_json(p.read_text())

  def summary(self) -> str:
    """A few lines for humans: link bandwidths and codec speeds."""
    lines = [f"calibration {self.fingerprint} ({self.source}, {self.platform}, "
             f"n_peers={self.n_peers})"]
    for a in ALGORITHMS:
      f = self.links[a]
      lines.append(f"  {a:10s} alpha {f.alpha_s * 1e6:9.1f} us  bandwidth "
                   f"{f.bandwidth_gbit:8.2f} Gbit/s")
    for c, per in sorted(self.codecs.items()):
      for d, f in sorted(per.items()):
        lines.append(f"  {c:8s} {d:9s} encode {f.encode_GBps:6.2f} GB/s  decode "
                     f"{f.decode_GBps:6.2f} GB/s  ratio {f.ratio:.3f} "
                     f"(gaussian {f.ratio_gaussian:.3f}, heavy {f.ratio_heavy:.3f})")
        if (f.encode_mix_factor, f.decode_mix_factor) != (1.0, 1.0):
          lines.append(f"  {'':8s} {'':9s} speeds on the ratio's data: encode "
                       f"x{f.encode_mix_factor:.3f}, decode x{f.decode_mix_factor:.3f} of the "
                       f"Gaussian time")
        extra = [f"{a} {f.extra_s_per_byte(a) * 1e9:+.3f}" for a in _RESIDUAL_ALGOS
                 if f.extra_s_per_byte(a)]
        if extra:
          lines.append(f"  {'':8s} {'':9s} residual ns per received byte: " + ", ".join(extra))
    return "\n".join(lines)


# ---- defaults ---------------------------------------------------------------------------

# Conservative numbers used without a calibration. The link is assumed FAST (so
# that an uncalibrated "auto" does not slow a good network down): 100 Gbit/s per
# device on CPU hosts, 400 GB/s (NVLink class) on GPUs, 20 / 10 us latency. The
# codecs are assumed at about a third of what was measured on one core of a 2-core
# EPYC (window codec, bf16: 3.0 encode / 3.4 decode GB/s through jit) and, on GPUs,
# below docs/cuda.md's static estimate (~0.8 / 1.0 TB/s on an H200). Ratios are
# below the measured Gaussian ones (bf16 1.41, fp16 1.11, fp32 1.17).
_DEFAULT_RATIO = {"bfloat16": 1.30, "float16": 1.06, "float32": 1.10}
_DEFAULTS = {
    # platform: (alpha_s, bandwidth B/s, encode B/s, decode B/s, codec latency s)
    "cpu": (20e-6, 100e9 / 8, 1.0e9, 1.5e9, 20e-6),
    "gpu": (10e-6, 400e9, 300e9, 300e9, 10e-6),
}


def default_calibration(platform: str | None = None,
                        codecs: Iterable[str] = ("zipccl",)) -> Calibration:
  """The documented conservative defaults (no measurement; see `_DEFAULTS`).

  With them `decide` does not compress on CPU or GPU at any size: a fast link and
  a modest codec. Calibrate to compress where it pays.
  """
  plat = _platform_name(platform)
  alpha, bw, enc, dec, lat = _DEFAULTS.get(plat, _DEFAULTS["cpu"])
  link = LinkFit(alpha, 1.0 / bw)
  fits = {d: CodecFit(lat, 1.0 / enc, lat, 1.0 / dec, r, r, r) for d, r in _DEFAULT_RATIO.items()}
  return Calibration(platform=plat, n_peers=0, links={a: link for a in ALGORITHMS},
                     codecs={c: dict(fits) for c in codecs},
                     reduce={d: LinkFit(lat, 1.0 / (4 * enc)) for d in DTYPES},
                     source="defaults", meta={"note": "conservative defaults, not measured"})


def _platform_name(platform: str | None) -> str:
  if platform is None:
    import jax
    platform = jax.default_backend()
  platform = str(platform).lower()
  return "gpu" if platform in ("cuda", "rocm", "gpu") else platform


# ---- where the calibration lives ----------------------------------------------------------

_ACTIVE: Calibration | None = None
_FILE_CACHE: dict = {}


def default_path() -> Path:
  """$ZIPCCL_CALIBRATION, else $XDG_CACHE_HOME (or ~/.cache)/zipccl_jax/calibration.json."""
  env = os.environ.get(ENV_VAR)
  if env:
    return Path(env).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "zipccl_jax" / "calibration.json"


def set_calibration(calibration: Calibration | None) -> None:
  """Makes `calibration` the process-wide one `resolve_calibration` returns (None unsets).

  Every process must set the same one (compare `fingerprint`s, or call
  `check_agreement`), or their decisions, and so their programs, differ.
  """
  global _ACTIVE
  if calibration is not None and not isinstance(calibration, Calibration):
    raise TypeError(f"set_calibration: calibration must be a Calibration or None, "
                    f"got {type(calibration).__name__}")
  _ACTIVE = calibration


def load_calibration(path: str | os.PathLike | None = None) -> Calibration | None:
  """The calibration file at `path` (default `default_path()`), None when absent.

  Cached by (path, mtime, size): cheap enough to call at every trace.
  """
  p = Path(path) if path is not None else default_path()
  try:
    st = p.stat()
  except OSError:
    return None
  key = (str(p), st.st_mtime_ns, st.st_size)
  cal = _FILE_CACHE.get(key)
  if cal is None:
    cal = Calibration.load(p)
    _FILE_CACHE.clear()
    _FILE_CACHE[key] = cal
  return cal


def active_calibration() -> Calibration | None:
  """The calibration in force without an argument: the one set with
  `set_calibration` (or activated by `calibrate`), else the file `default_path()`
  ($ZIPCCL_CALIBRATION or the cache directory) when it exists, else None."""
  if _ACTIVE is not None:
    return _ACTIVE
  return load_calibration()


def resolve_calibration(calibration: Calibration | str | os.PathLike | None = None
                        ) -> Calibration:
  """The calibration a decision uses: argument, `set_calibration`, file, defaults.

  Args:
    calibration: a Calibration; a path to a calibration file; or None for the
      process-wide one, else the cache file (`default_path()`), else
      `default_calibration()`.
  """
  if isinstance(calibration, Calibration):
    return calibration
  if isinstance(calibration, (str, os.PathLike)):
    return Calibration.load(calibration)
  if calibration is not None:
    raise TypeError(f"calibration must be a Calibration, a path or None, "
                    f"got {type(calibration).__name__}")
  cal = active_calibration()
  return cal if cal is not None else default_calibration()


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


# Algorithms whose compressed transport `calibrate` measures end to end (the
# residual over the model, CodecFit.extra_s_per_byte).
_RESIDUAL_ALGOS = ("all_gather", "all_to_all", "ppermute")


# Platforms whose codec handlers skip the transport's own row (docs/design.md,
# "The own row is not coded"); the CUDA handlers code every row.
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
  dt, m, n = _call_args(fn, collective, dtype, row_elements, n_peers)
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
  dt, m, n = _call_args(fn, collective, dtype, row_elements, n_peers)
  _check_int(fn, "chunks", chunks, 1)
  if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
    raise ValueError(f"{fn}: margin must be a number in [0, 1), got {margin!r}")
  cal = resolve_calibration(calibration)
  names = sorted(cal.codecs) if codecs is None else _codec_names(fn, codecs)
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
  dt, m, n = _call_args(fn, collective, dtype, row_elements, n_peers)
  cal = resolve_calibration(calibration)
  names = sorted(cal.codecs) if codecs is None else _codec_names(fn, codecs)
  if n == 1 or m == 0:
    return None
  return _fastest(collective, dt, m, n, cal, names)[0]


def _call_args(fn, collective, dtype, row_elements, n_peers) -> tuple:
  """One modelled call's arguments, checked: (dtype name, row elements, peers)."""
  if collective not in COLLECTIVES:
    raise ValueError(f"{fn}: collective must be one of {COLLECTIVES}, got {collective!r}")
  return (_dtype_name(fn, dtype), _check_int(fn, "row_elements", row_elements, 0),
          _check_int(fn, "n_peers", n_peers, 1))


def _codec_names(fn, codecs) -> list:
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


def available_codecs() -> tuple[str, ...]:
  """The registered compressing codecs ("raw" and None are transport modes)."""
  try:
    from zipccl_jax._src import registry
    return tuple(registry.names())
  except ImportError:  # pragma: no cover - a package without the registry
    import zipccl_jax as zc
    return tuple(c for c in getattr(zc, "CODECS", ("zipccl",)) if c != "raw")


def _codec_supports(codec: str, dtype: str) -> bool:
  try:
    from zipccl_jax._src import registry
    return registry.get(codec).supports(np.dtype(dtype))
  except (ImportError, AttributeError):  # pragma: no cover
    return True


def _codec_fns(codec: str):
  """((encode(v) -> pytree, decode(pytree) -> y, pytree -> (payload, status)), meta).

  meta (a dict) must hold the row's "n" and "dtype" before decode is traced.

  `zipccl_jax.encode` / `decode` where they accept the codec, else the codec
  contract's `encode_rows` / `decode_rows` of the registry (docs/format.md).
  """
  import zipccl_jax as zc
  try:
    zc.encode(np.zeros(1, np.float32), codec=codec)
    return (lambda v: zc.encode(v, codec=codec), zc.decode,
            lambda enc: (enc.payload, getattr(enc, "status", None))), {}
  except (ValueError, TypeError):
    pass
  from zipccl_jax._src import registry
  c = registry.get(codec)

  def enc(v):
    payload, stats = c.encode_rows(v[None])
    return payload[0], stats[0]

  def dec(e):
    payload, _ = e
    n = meta["n"]
    return c.decode_rows(payload[None], n, meta["dtype"])[0][0]

  meta = {}
  return (enc, dec, lambda e: (e[0], e[1][..., 0])), meta


def synthetic(kind: str, n: int, dtype, seed: int = 0) -> np.ndarray:
  """Calibration / benchmark data: "gaussian" (sigma 0.02) or "heavy".

  "heavy" is Student-t with 3 degrees of freedom whose scale changes every 4096
  elements (log-uniform over 1e-4..1): heavy tails and blocks of mixed scales,
  the kind of data gradients are.
  """
  rng = np.random.default_rng(seed)
  if kind == "gaussian":
    x = rng.standard_normal(n) * 0.02
  elif kind == "heavy":
    x = rng.standard_t(3, n)
    scales = 10.0 ** rng.uniform(-4, 0, size=-(-n // 4096))
    x = x * np.repeat(scales, 4096)[:n]
  else:
    raise ValueError(f"synthetic: kind must be 'gaussian' or 'heavy', got {kind!r}")
  import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
  return x.astype(np.dtype(dtype))


def used_nbytes(row: np.ndarray) -> int:
  """Bytes of an encoded row that matter: the row header's used_nbytes, else its length."""
  row = np.asarray(row, np.uint8).reshape(-1)
  if row.size >= 32 and row[4] >= 2:
    used = int(np.frombuffer(row[16:24].tobytes(), "<u8")[0])
    if 0 < used <= row.size:
      return used
  return int(row.size)


class _Meter:
  """Builds and times jitted shard_map programs on one mesh (all devices at once)."""

  def __init__(self, mesh, axes: tuple, reps: int, warmup: int):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    self.jax, self.P = jax, P
    self.mesh, self.axes, self.reps, self.warmup = mesh, axes, reps, warmup
    self.all_axes = tuple(mesh.axis_names)
    self.sharding = NamedSharding(mesh, P(self.all_axes))
    self._bar = self._one = None

  def array(self, per_device: np.ndarray):
    """A global array whose every device block is `per_device` (leading dim 1 added)."""
    jax = self.jax
    d = self.mesh.size
    shape = (d,) + per_device.shape
    return jax.make_array_from_callback(shape, self.sharding, lambda idx: per_device[None])

  def smap(self, body, out_specs=None):
    jax, P = self.jax, self.P
    spec = P(self.all_axes)
    return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=spec,
                                 out_specs=spec if out_specs is None else out_specs))

  def _barrier(self) -> None:
    """All devices of the mesh meet (a pmax of one int32), so that a timed call
    starts together everywhere, as a training step's collectives do."""
    jax = self.jax
    if self._bar is None:
      from jax import lax
      self._bar = jax.jit(jax.shard_map(lambda v: lax.pmax(v, self.all_axes), mesh=self.mesh,
                                        in_specs=self.P(self.all_axes), out_specs=self.P()))
      self._one = self.array(np.zeros(1, np.int32))
    jax.block_until_ready(self._bar(self._one))

  def time(self, f, *args, reps: int | None = None, warmup: int | None = None,
           stat: Callable = statistics.median) -> float:
    """Median (`stat`) over `reps` calls of the slowest process's time of one call.

    Each call starts after a barrier, and each call's time is the largest over
    the processes, as benchmarks/netns_bench.py measures the calls the model is
    checked against (and as a training step waits for its slowest peer): a
    collective finishes at different times on each process, and back-to-back
    calls timed on process 0 alone let the skew of one call leak into the next.
    """
    jax = self.jax
    for _ in range(self.warmup if warmup is None else warmup):
      jax.block_until_ready(f(*args))
    ts = []
    for _ in range(self.reps if reps is None else reps):
      self._barrier()
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      ts.append(time.perf_counter() - t0)
    ts = np.asarray(ts, np.float64)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      ts = np.asarray(multihost_utils.process_allgather(ts)).reshape(-1, len(ts)).max(axis=0)
    return float(stat(ts.tolist()))


def _bounded_bare(t_bare: float, t_raw: float, again: Callable[[], float], algo: str, log) -> float:
  """The bare collective's time at the largest size, checked against the library's
  raw transport timed right after it on the same bytes: the transport runs that
  collective plus copies, so a bare sample above it is noise (another tenant, a
  page-fault burst) and, at the largest size, would set the fitted link's slope
  (a bare all-to-all sample of 48.7 ms next to a 35.0 ms raw transport was seen).
  Then the bare collective is timed once more and the smaller sample kept, at most
  t_raw (the transport's copies then count as 0)."""
  if t_bare <= t_raw:
    return t_bare
  t2 = min(t_bare, again())
  if t2 > t_raw:
    log(f"  {algo:10s} bare collective {t2 * 1e3:.3f} ms still above the raw transport's "
        f"{t_raw * 1e3:.3f} ms: taking the latter")
  return min(t2, t_raw)


def _measure_links(meter: _Meter, n_peers: int, row_sizes: Sequence[int], log,
                   points: dict | None = None) -> dict:
  """Link fits per algorithm; `points` (if given) receives the measured
  [received bytes, seconds] pairs per algorithm (kept in the Calibration's meta,
  so that a fit can be checked against them later), and under "<algo>/raw" the
  library's uncompressed transport at the largest size (`copy_s_per_byte`)."""
  from jax import lax
  import jax.numpy as jnp
  import zipccl_jax as zc
  from zipccl_jax._src import transport
  axes = meter.axes
  perm = [(i, (i + 1) % n_peers) for i in range(n_peers)]
  bf16 = jnp.bfloat16
  programs = {
      "all_gather": (lambda r: np.zeros(r, np.uint8),
                     lambda v: lax.all_gather(v[0], axes, tiled=True)[None],
                     lambda r: np.zeros(r // 2, bf16),
                     lambda v: zc.compressed_all_gather(v[0], axes, tiled=True, codec="raw")[None]),
      # The all-to-all the transport runs: on CPU N - 1 collective permutes
      # (`transport.a2a_slot`), elsewhere lax.all_to_all. Timing lax.all_to_all on
      # CPU fitted a link up to ~12% slower than the transport's (gloo, 10 Gbit/s,
      # 2 processes), and the raw transport's copy term cannot go below 0 to
      # correct it.
      "all_to_all": (lambda r: np.zeros((n_peers, r), np.uint8),
                     lambda v: transport.a2a_slot(v[0], v.shape[-1], axes)[None],
                     lambda r: np.zeros((n_peers, r // 2), bf16),
                     lambda v: zc.compressed_all_to_all(v[0], axes, 0, 0, tiled=True,
                                                        codec="raw")[None]),
      "ppermute": (lambda r: np.zeros(r, np.uint8),
                   lambda v: lax.ppermute(v[0], axes, perm)[None],
                   lambda r: np.zeros(r // 2, bf16),
                   lambda v: zc.compressed_ppermute(v[0], axes, perm, codec="raw")[None]),
  }
  fits = {}
  for algo, (make, body, make_raw, body_raw) in programs.items():
    xs, ts = [], []
    f = meter.smap(body)
    for r in row_sizes:
      t = meter.time(f, meter.array(make(r)))
      xs.append(_wire_rows(algo, n_peers) * r)
      ts.append(t)
      log(f"  {algo:10s} row {_fmt_bytes(r):>9s}: {t * 1e3:8.3f} ms")
    # The uncompressed transport at the largest size, against the bare collective
    # timed just before: its extra copies per received byte (>= 0).
    r = max(row_sizes) // 2 * 2
    t_raw = meter.time(meter.smap(body_raw), meter.array(make_raw(r)), reps=max(meter.reps, 5), stat=min)
    wire = _wire_rows(algo, n_peers) * r
    big = int(np.argmax(row_sizes))
    ts[big] = _bounded_bare(ts[big], t_raw, lambda: meter.time(f, meter.array(make(row_sizes[big]))),
                            algo, log)
    t_bare = ts[big]
    if points is not None:
      points.setdefault(algo, []).extend([int(x), float(t)] for x, t in zip(xs, ts))
      points.setdefault(f"{algo}/raw", []).append([int(wire), float(t_raw)])
    # The largest sizes set the slope of the LAD fit: fitted after the check above.
    fit = fit_alpha_beta(xs, ts)
    copy = max(t_raw - t_bare, 0.0) / wire if wire else 0.0
    log(f"  {algo:10s} codec=\"raw\" row {_fmt_bytes(r):>9s}: {t_raw * 1e3:8.3f} ms "
        f"(+{copy * 1e9:.3f} ns per received byte)")
    fits[algo] = LinkFit(fit.alpha_s, fit.beta_s_per_byte, copy)
  # The agreement: a pmax of 2 int32 (latency only; beta of a few bytes is noise).
  f = meter.smap(lambda v: lax.pmax(v, axes))
  t = meter.time(f, meter.array(np.zeros(2, np.int32)))
  log(f"  all_reduce 8 B: {t * 1e3:8.3f} ms")
  fits["all_reduce"] = LinkFit(t, fits["all_gather"].beta_s_per_byte)
  del jnp
  return fits


def sample_ratio(codec: str, samples: Sequence) -> float:
  """raw bytes / used bytes of `codec` over the given arrays (one row each), on the
  first local device. A row that does not fit counts as raw (the raw rung)."""
  import jax
  (encode, _, parts), _ = _codec_fns(codec)
  raw = used = 0
  for x in samples:
    x = np.asarray(x).reshape(-1)
    if x.size == 0:
      continue
    payload, st = parts(jax.jit(encode)(x))
    payload = np.asarray(payload).reshape(-1)
    fits = st is None or not np.any(np.asarray(st) != 0)
    raw += x.nbytes
    used += used_nbytes(payload) if fits else x.nbytes
  if raw == 0:
    raise ValueError("samples: no elements to measure")
  return raw / used


def _measure_codec(meter: _Meter, codec: str, dtype: str, sizes: Sequence[int], log,
                   samples: Sequence = ()) -> CodecFit:
  import jax
  jnp_dtype = np.dtype(dtype)
  xs, te, td = [], [], []
  (encode, decode, parts), meta = _codec_fns(codec)
  enc_f = meter.smap(lambda v: jax.tree.map(lambda a: a[None], encode(v[0])))
  dec_f = meter.smap(lambda e: decode(jax.tree.map(lambda a: a[0], e))[None])
  for nbytes in sizes:
    n = max(nbytes // jnp_dtype.itemsize, 1)
    meta.update(n=n, dtype=jnp_dtype)
    x = meter.array(synthetic("gaussian", n, jnp_dtype, seed=1))
    enc = enc_f(x)
    te.append(meter.time(enc_f, x))
    td.append(meter.time(dec_f, enc))
    xs.append(n * jnp_dtype.itemsize)
    log(f"  {codec:8s} {dtype:9s} {_fmt_bytes(xs[-1]):>9s}: encode {te[-1] * 1e3:8.3f} ms "
        f"decode {td[-1] * 1e3:8.3f} ms")
  fe, fd = _codec_fit(xs, te), _codec_fit(xs, td)
  # Ratio on the largest size of each kind of data, from the first local row.
  n = max(max(sizes) // jnp_dtype.itemsize, 1)
  meta.update(n=n, dtype=jnp_dtype)
  ratios = {}
  for kind in ("gaussian", "heavy"):
    payload, st = parts(enc_f(meter.array(synthetic(kind, n, jnp_dtype, seed=2))))
    payload = np.asarray(payload.addressable_shards[0].data).reshape(-1)
    status = np.zeros(1) if st is None else np.asarray(st.addressable_shards[0].data)
    # A row that does not fit is sent raw: ratio 1.
    ratios[kind] = 1.0 if np.any(status != 0) else n * jnp_dtype.itemsize / used_nbytes(payload)
  if samples:   # the user's own tensors replace the synthetic mix
    ratio = sample_ratio(codec, samples)
    log(f"  {codec:8s} {dtype:9s} ratio on {len(samples)} sample(s): {ratio:.3f}")
  else:
    ratio = 2.0 / (1.0 / ratios["gaussian"] + 1.0 / ratios["heavy"])
  # Speed on the same data as the ratio: the largest size timed on it (the
  # heavy-tailed half of the mix, or a row tiled from the samples) against
  # Gaussian data, interleaved and the fastest call of each (noise only adds
  # time: one 8 MiB Gaussian encode measured 3.7 ms, then 2.1 ms a second later),
  # scales the per-byte terms fitted on Gaussian data.
  other = (_sample_row(samples, n, jnp_dtype) if samples
           else synthetic("heavy", n, jnp_dtype, seed=2))
  xg, xo = meter.array(synthetic("gaussian", n, jnp_dtype, seed=1)), meter.array(other)
  eg, eo = enc_f(xg), enc_f(xo)
  best = {k: math.inf for k in ("eg", "eo", "dg", "do")}
  reps = max(meter.reps, 5)
  for _ in range(3):
    for k, f, a in (("eg", enc_f, xg), ("eo", enc_f, xo), ("dg", dec_f, eg), ("do", dec_f, eo)):
      best[k] = min(best[k], meter.time(f, a, reps=reps, warmup=1, stat=min))
  share = 1.0 if samples else 0.5     # the other data's share of the ratio's bytes
  fac_e = _mix_factor(best["eg"], best["eo"], share)
  fac_d = _mix_factor(best["dg"], best["do"], share)
  log(f"  {codec:8s} {dtype:9s} on the ratio's data: encode x{fac_e:.3f}, decode x{fac_d:.3f} "
      f"of the Gaussian time")
  return CodecFit(fe.alpha_s, fe.beta_s_per_byte * fac_e, fd.alpha_s, fd.beta_s_per_byte * fac_d,
                  ratio, ratios["gaussian"], ratios["heavy"],
                  encode_mix_factor=fac_e, decode_mix_factor=fac_d)


def gaussian_fit(f: CodecFit) -> CodecFit:
  """f as measured on Gaussian data: its Gaussian ratio and speeds (the mix factors
  divided out). The residuals are measured against it, on Gaussian rows, so that
  they hold what the model misses and not the data."""
  return dataclasses.replace(
      f, ratio=f.ratio_gaussian or f.ratio,
      encode_s_per_byte=f.encode_s_per_byte / f.encode_mix_factor,
      decode_s_per_byte=f.decode_s_per_byte / f.decode_mix_factor,
      encode_mix_factor=1.0, decode_mix_factor=1.0)


def _mix_factor(t_gauss: float, t_other: float, share: float) -> float:
  """Time of a byte mix (`share` of the other data, the rest Gaussian) over the
  Gaussian time, from one timing of each at the same size."""
  if not t_gauss > 0:
    return 1.0
  return (1.0 - share) + share * t_other / t_gauss


def _sample_row(samples: Sequence, n: int, dtype) -> np.ndarray:
  """n elements of the samples (flattened, concatenated, repeated as needed)."""
  flat = np.concatenate([np.asarray(a, dtype).reshape(-1) for a in samples])
  if flat.size == 0:
    raise ValueError("samples: no elements to measure")
  return np.resize(flat, n)


def _codec_fit(xs, ts) -> LinkFit:
  """fit_alpha_beta, but a codec is never free per byte: when noise flattens the
  fit (beta 0), the largest size's time / bytes is used (an upper bound)."""
  f = fit_alpha_beta(xs, ts)
  if f.beta_s_per_byte <= 0:
    i = int(np.argmax(xs))
    return LinkFit(0.0, ts[i] / xs[i])
  return f


def _measure_reduce(meter: _Meter, dtype: str, n_rows: int, sizes: Sequence[int], log
                    ) -> LinkFit:
  import jax.numpy as jnp
  dt = np.dtype(dtype)

  def body(v):
    rows = v[0]
    acc = rows[0].astype(jnp.float32)
    for i in range(1, rows.shape[0]):
      acc = acc + rows[i].astype(jnp.float32)
    return acc.astype(dt)[None]

  f = meter.smap(body)
  xs, ts = [], []
  for nbytes in sizes:
    m = max(nbytes // dt.itemsize, 1)
    x = meter.array(np.ones((n_rows, m), dt))
    ts.append(meter.time(f, x))
    xs.append(n_rows * m * dt.itemsize)
  fit = fit_alpha_beta(xs, ts)
  log(f"  ordered sum {dtype:9s}: {1e-9 / max(fit.beta_s_per_byte, 1e-30):8.2f} GB/s")
  return fit


def _measure_residuals(meter: _Meter, cal: Calibration, row_bytes: int, log,
                       points: dict | None = None) -> dict:
  """cal.codecs with each codec's end-to-end residual per algorithm filled in.

  For every codec, on one dtype (bf16 when calibrated): a compressed all_gather,
  all_to_all and ppermute (policy="always", one chunk) of Gaussian rows of
  `row_bytes` per peer, timed like the links but the median of >= 5 calls after
  >= 2 warm-ups, against `model_time` of the same call with the codec's Gaussian
  ratio and speed (`gaussian_fit`) and no residual. The difference per received
  raw byte is the residual (what the model does not see: on XLA:CPU a gather's
  own-row copy, fresh result buffers, the switch); it is bounded below
  by -0.5 x the modelled time, so that one noisy call cannot make compression
  look free. The same numbers go to the codec's other dtypes (per byte).
  `points` receives [received bytes, measured s, modelled s] under
  "<algo>/<codec>".
  """
  import zipccl_jax as zc
  n = cal.n_peers
  axes = meter.axes
  ring = [(i, (i + 1) % n) for i in range(n)]
  out = {}
  for c, per in sorted(cal.codecs.items()):
    dt = "bfloat16" if "bfloat16" in per else sorted(per)[0]
    f = per[dt]
    m = max(row_bytes // _ITEMSIZE[dt], 1)
    kw = dict(codec=c, policy="always", chunks=1)
    programs = {
        "all_gather": ((m,), lambda v: zc.compressed_all_gather(v[0], axes, tiled=True, **kw)[None]),
        "all_to_all": ((n, m), lambda v: zc.compressed_all_to_all(v[0], axes, 0, 0, tiled=True,
                                                                  **kw)[None]),
        "ppermute": ((m,), lambda v: zc.compressed_ppermute(v[0], axes, ring, **kw)[None]),
    }
    probe = dataclasses.replace(cal, codecs={c: {dt: gaussian_fit(f)}})
    extras = {}
    for algo, (shape, body) in programs.items():
      x = synthetic("gaussian", int(np.prod(shape)), dt, seed=3).reshape(shape)
      # The median of at least 5 calls after 2 warm-ups: a median of 3 after one
      # made a 16 MiB gather look 50% slower than every call of the same program
      # a minute later; the fastest call instead (noise only adds time) made the
      # model 5-9% optimistic at 10 Gbit/s.
      t = meter.time(meter.smap(body), meter.array(x), reps=max(meter.reps, 5),
                     warmup=max(meter.warmup, 2))
      t_model = model_time(algo, dt, m, n, probe, c, residual=False)
      wire = _wire_rows(algo, n) * m * _ITEMSIZE[dt]
      extra = max((t - t_model) / wire, -0.5 * t_model / wire)
      extras[f"extra_{algo}_s_per_byte"] = extra
      if points is not None:
        points.setdefault(f"{algo}/{c}", []).append([int(wire), float(t), float(t_model)])
      log(f"  {c:8s} {algo:10s} row {_fmt_bytes(m * _ITEMSIZE[dt]):>9s}: {t * 1e3:8.3f} ms, "
          f"model {t_model * 1e3:8.3f} ms ({extra * 1e9:+.3f} ns per received byte)")
    out[c] = {d: dataclasses.replace(fd, **extras) for d, fd in per.items()}
  return out


def agree_across_processes(cal: Calibration, *, process_index: int | None = None,
                           broadcast: Callable[[np.ndarray], np.ndarray] | None = None
                           ) -> Calibration:
  """Process 0's calibration on every process (identical decisions everywhere).

  Two broadcasts from process 0: the length of its canonical JSON, then the bytes
  (as int32, padded to that length). `broadcast(array) -> array` must return
  process 0's array on every process; the default is
  `jax.experimental.multihost_utils.broadcast_one_to_all` (a psum over all
  devices), and with a single process the calibration is returned unchanged.

  Args:
    cal: this process's measurement.
    process_index: this process (default `jax.process_index()`).
    broadcast: see above (injectable for tests).
  """
  if broadcast is None:
    import jax
    if jax.process_count() == 1:
      return cal
    from jax.experimental import multihost_utils
    broadcast = multihost_utils.broadcast_one_to_all
  if process_index is None:
    import jax
    process_index = jax.process_index()
  blob = cal.to_json().encode() if process_index == 0 else b""
  length = int(np.asarray(broadcast(np.array([len(blob)], np.int32))).reshape(-1)[0])
  if length <= 0:
    raise RuntimeError(f"agree_across_processes: process 0 sent a calibration of "
                       f"{length} bytes")
  buf = np.zeros(length, np.int32)
  buf[:len(blob)] = np.frombuffer(blob, np.uint8)
  got = np.asarray(broadcast(buf)).astype(np.uint8).tobytes()
  return Calibration.from_json(got)


def check_agreement(calibration: Calibration | None = None, *,
                    broadcast: Callable[[np.ndarray], np.ndarray] | None = None) -> bool:
  """True when every process resolves the same calibration (compares fingerprints).

  Must be called by all processes (it runs a broadcast). Use it after loading a
  calibration file that each host keeps on its own disk.
  """
  cal = resolve_calibration(calibration)
  mine = np.frombuffer(bytes.fromhex(cal.fingerprint), np.uint8).astype(np.int32)
  if broadcast is None:
    import jax
    if jax.process_count() == 1:
      return True
    from jax.experimental import multihost_utils
    broadcast = multihost_utils.broadcast_one_to_all
  ref = np.asarray(broadcast(mine))
  return bool(np.array_equal(ref, mine))


def calibrate(mesh=None, axis_name=None, *, dtypes: Sequence[str] = DTYPES,
              codecs: Sequence[str] | None = None,
              codec_bytes: Sequence[int] = (2**16, 2**20, 2**23),
              link_row_bytes: Sequence[int] = (2**12, 2**16, 2**20, 2**22),
              reps: int = 5, warmup: int = 1, path: str | os.PathLike | None = None,
              save: bool = True, activate: bool = True, verbose: bool = False,
              reuse_codecs: Calibration | None = None,
              samples: Sequence | None = None, residuals: bool = True) -> Calibration:
  """Measures the codecs and the link on this machine; the basis of policy="auto".

  Every process of a multi-process job must call it (it runs collectives). The
  codecs are timed inside `jax.shard_map` on every device of `mesh` at once (as
  the collectives run them); the links by timing uncompressed uint8
  all-gathers, all-to-alls and permutes of `link_row_bytes` per peer over
  `axis_name` (medians of `reps` calls after `warmup`), fitted by
  `fit_alpha_beta`. Process 0's numbers are then broadcast to all processes
  (`agree_across_processes`), so all of them hold the same Calibration; each
  writes it to `path` (same bytes on every host).

  Args:
    mesh: a jax Mesh; None: the first local device alone (codecs only; the
      links keep the fast-link defaults).
    axis_name: the mesh axis (or tuple of axes) the collectives will run over;
      required with a mesh of more than one device.
    dtypes: dtypes to time the codecs on.
    codecs: codec names (default: every compressing codec available).
    codec_bytes: raw bytes per device of the codec measurements.
    link_row_bytes: bytes per peer row of the link measurements.
    reps, warmup: calls timed (median) and untimed per point.
    path: where to save; default `default_path()` ($ZIPCCL_CALIBRATION or the
      cache directory).
    save: write the file.
    activate: also `set_calibration` it for this process.
    verbose: print every measurement.
    reuse_codecs: a previous Calibration of the same processes whose codec and
      reduction numbers are kept (only the links are measured), e.g. to
      re-measure after the network changed.
    samples: arrays of your own traffic (weights, gradients; each one row). The
      ratio the model assumes for their dtypes is then their measured ratio,
      instead of the mix of synthetic Gaussian and heavy-tailed data. Process
      0's samples decide (its numbers are broadcast).
    residuals: also time each codec's compressed all_gather, all_to_all and
      ppermute at the largest `link_row_bytes` and keep what the model misses
      (`CodecFit.extra_s_per_byte`; on the links measured now, also with
      `reuse_codecs`). Costs their compiles (~1-5 s per codec on CPU).

  Returns:
    The agreed Calibration.
  """
  import jax
  fn = "calibrate"
  log = print if verbose else (lambda *a, **k: None)
  reps = _check_int(fn, "reps", reps, 1)
  warmup = _check_int(fn, "warmup", warmup, 0)
  dtypes = tuple(_dtype_name(fn, d) for d in ((dtypes,) if isinstance(dtypes, str) else dtypes))
  if not dtypes:
    raise ValueError(f"{fn}: dtypes must name at least one dtype")
  have = available_codecs()
  codecs = have if codecs is None else ((codecs,) if isinstance(codecs, str) else tuple(codecs))
  for c in codecs:
    if c not in have:
      raise ValueError(f"{fn}: codecs must be among the available codecs {have}, got {c!r}")
  for arg, vals in (("codec_bytes", codec_bytes), ("link_row_bytes", link_row_bytes)):
    if len(vals) < 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1
                            for v in vals):
      raise ValueError(f"{fn}: {arg} must hold >= 2 positive ints, got {vals!r}")
  by_dtype: dict = {}
  for i, a in enumerate(samples or ()):
    dt = _dtype_name(f"{fn}: samples[{i}]", getattr(a, "dtype", None))
    by_dtype.setdefault(dt, []).append(a)
  if reuse_codecs is not None and not isinstance(reuse_codecs, Calibration):
    raise TypeError(f"{fn}: reuse_codecs must be a Calibration or None, got "
                    f"{type(reuse_codecs).__name__}")
  if mesh is None:
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:1]), ("_zc_cal",))
    axes = ("_zc_cal",)
    n_peers = 1
  else:
    if not isinstance(mesh, jax.sharding.Mesh):
      raise TypeError(f"{fn}: mesh must be a jax.sharding.Mesh or None, got "
                      f"{type(mesh).__name__}")
    if axis_name is None:
      if mesh.size > 1:
        raise ValueError(f"{fn}: axis_name is required with a mesh of {mesh.size} devices "
                         f"(axes {mesh.axis_names})")
      axes = tuple(mesh.axis_names[:1])
    else:
      axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    for a in axes:
      if a not in mesh.axis_names:
        raise ValueError(f"{fn}: axis_name {a!r} is not an axis of the mesh "
                         f"{mesh.axis_names}")
    n_peers = int(np.prod([mesh.shape[a] for a in axes]))
  meter = _Meter(mesh, axes, reps, warmup)
  plat = _platform_name(mesh.devices.flat[0].platform)
  t0 = time.perf_counter()
  link_points: dict = {}
  if n_peers >= 2:
    log(f"calibrate: links over {axes} ({n_peers} peers)")
    links = _measure_links(meter, n_peers, link_row_bytes, log, link_points)
  else:
    links = dict(default_calibration(plat).links)
  if reuse_codecs is not None:
    fits = {c: dict(per) for c, per in reuse_codecs.codecs.items()}
    if not residuals:   # the reused residuals belong to the links measured then
      fits = {c: {d: dataclasses.replace(f, **{f"extra_{a}_s_per_byte": 0.0 for a in _RESIDUAL_ALGOS})
                  for d, f in per.items()} for c, per in fits.items()}
    reduce = dict(reuse_codecs.reduce)
  else:
    log("calibrate: codecs")
    fits = {c: {d: _measure_codec(meter, c, d, codec_bytes, log, by_dtype.get(d, ()))
                for d in dtypes if _codec_supports(c, d)} for c in codecs}
    reduce = {d: _measure_reduce(meter, d, max(n_peers, 2), codec_bytes, log) for d in dtypes}
  meta = {
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "host": _platform.node(), "machine": _platform.machine(),
      "cpu_count": os.cpu_count(), "jax": jax.__version__,
      "process_count": jax.process_count(), "devices": int(mesh.size),
      "axes": [str(a) for a in axes], "codec_bytes": [int(v) for v in codec_bytes],
      "link_row_bytes": [int(v) for v in link_row_bytes], "reps": reps,
      "seconds": round(time.perf_counter() - t0, 1),
      "threads": os.environ.get("ZIPCCL_NUM_THREADS", ""),
      "samples": {d: len(v) for d, v in by_dtype.items()},
      "link_points": link_points,
  }
  cal = Calibration(platform=plat, n_peers=n_peers, links=links, codecs=fits, reduce=reduce,
                    source="measured" if n_peers >= 2 else "measured-codecs", meta=meta)
  if residuals and n_peers >= 2 and fits:
    log("calibrate: compressed transports end to end (the model's residual)")
    fits = _measure_residuals(meter, cal, max(link_row_bytes), log, link_points)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    cal = dataclasses.replace(cal, codecs=fits, meta=meta)
  cal = agree_across_processes(cal)
  if save:
    p = cal.save(path)
    log(f"calibrate: wrote {p}")
  if activate:
    set_calibration(cal)
  log(cal.summary())
  return cal
