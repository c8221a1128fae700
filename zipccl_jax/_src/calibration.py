"""Calibrations: the fitted numbers of the cost model, and which one is in force.

A `Calibration` holds, per collective algorithm, an alpha-beta fit of the link
(`LinkFit`) and, per codec and dtype, encode/decode fits and the expected ratio
(`CodecFit`); `calibrate.py` measures one, `costmodel.py` turns one into decisions.

Which calibration is in force (`active_calibration`): the one set with
`set_calibration` (or activated by `calibrate`); else the file named by
$ZIPCCL_CALIBRATION, or ~/.cache/zipccl_jax/calibration.json ($XDG_CACHE_HOME is
honoured). Files are validated when read: every number finite and in range, every
field of the right type. A malformed file in force by default is ignored with a
warning that names it (the calls then decide as without a calibration); one loaded
explicitly (`Calibration.load`, `load_calibration(path)`) raises ValueError naming
it. Files are written atomically: a temporary file made with `tempfile.mkstemp` in
the same directory (a fresh, unpredictable name, created exclusively, so no symlink
is followed), then renamed over the target.

Decisions select collectives, so every process of a job must hold the same
calibration: calibration_agreement.py broadcasts and checks it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

import jax

SCHEMA_VERSION = 1
ENV_VAR = "ZIPCCL_CALIBRATION"
_MAX_FILE_BYTES = 16 << 20     # a calibration is a few KiB; anything this large is not one
# XLA collectives of the transport; "all_reduce" is the size/overflow agreement
# (a pmax of a few int32).
ALGORITHMS = ("all_gather", "all_to_all", "ppermute", "all_reduce")
COLLECTIVES = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
DTYPES = ("bfloat16", "float16", "float32")
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}

# Algorithms whose compressed transport `calibrate` measures end to end (the
# residual over the model, CodecFit.extra_s_per_byte).
_RESIDUAL_ALGOS = ("all_gather", "all_to_all", "ppermute")


def _err(fn: str, msg: str) -> ValueError:
  return ValueError(f"{fn}: {msg}")


# ---- the fitted parameters ----------------------------------------------------------------

# Fields that may be negative: the compressed transport's residuals (bounded below
# by calibrate). Every other number of a fit is >= 0, and ratios and mix factors > 0.
_SIGNED_FIELDS = frozenset({"extra_all_gather_s_per_byte", "extra_all_to_all_s_per_byte",
                            "extra_ppermute_s_per_byte"})
_POSITIVE_FIELDS = frozenset({"ratio", "encode_mix_factor", "decode_mix_factor"})


def _mapping(where: str, value) -> Mapping:
  if not isinstance(value, Mapping):
    raise TypeError(f"{where} must be a mapping, got {type(value).__name__}")
  return value


def _fit(cls, where: str, fields):
  """cls(**fields) with every value a finite number in its range; errors name the field."""
  known = {f.name for f in dataclasses.fields(cls)}
  vals = {}
  for name, x in _mapping(where, fields).items():
    if name not in known:
      raise ValueError(f"{where}.{name} is not a field of {cls.__name__}")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
      raise ValueError(f"{where}.{name} must be a number, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
      raise ValueError(f"{where}.{name} must be finite, got {x!r}")
    if name in _POSITIVE_FIELDS and v <= 0:
      raise ValueError(f"{where}.{name} must be > 0, got {x!r}")
    if name not in _SIGNED_FIELDS and v < 0:
      raise ValueError(f"{where}.{name} must be >= 0, got {x!r}")
    vals[name] = v
  return cls(**vals)



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
      links = {str(k): _fit(LinkFit, f"links.{k}", v) for k, v in _mapping("links", d["links"]).items()}
      codecs = {str(c): {str(dt): _fit(CodecFit, f"codecs.{c}.{dt}", fit)
                         for dt, fit in _mapping(f"codecs.{c}", per).items()}
                for c, per in _mapping("codecs", d["codecs"]).items()}
      reduce = {str(k): _fit(LinkFit, f"reduce.{k}", v)
                for k, v in _mapping("reduce", d.get("reduce", {})).items()}
      platform, source = d["platform"], d.get("source", "measured")
      n_peers = d["n_peers"]
      if not isinstance(platform, str) or not isinstance(source, str):
        raise ValueError("platform and source must be strings")
      if isinstance(n_peers, bool) or not isinstance(n_peers, int) or n_peers < 0:
        raise ValueError(f"n_peers must be an int >= 0, got {n_peers!r}")
      cal = cls(platform=platform, n_peers=n_peers, links=links, codecs=codecs,
                reduce=reduce, source=source, meta=dict(_mapping("meta", d.get("meta", {}))))
    except KeyError as e:
      raise _err(fn, f"malformed calibration: missing field {e}") from None
    except (TypeError, ValueError, AttributeError) as e:
      raise _err(fn, f"malformed calibration: {e}") from None
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
    """Writes the JSON atomically; default `default_path()`.

    The bytes go to a temporary file made by `tempfile.mkstemp` in the target's
    directory (an unpredictable name, created exclusively: a symlink planted there
    is never followed), are flushed to disk, and the file is renamed over the
    target (a rename replaces a symlink at the target, it does not follow it).
    Concurrent writers each write their own temporary file; the last rename wins.
    """
    p = Path(path) if path is not None else default_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
      with os.fdopen(fd, "w") as f:
        f.write(self.to_json())
        f.flush()
        os.fsync(f.fileno())
      os.chmod(tmp, 0o644)
      os.replace(tmp, p)
    except BaseException:
      try:
        os.unlink(tmp)
      except OSError:
        pass
      raise
    return p

  @classmethod
  def load(cls, path: str | os.PathLike | None = None) -> "Calibration":
    """Reads a file written by `save`; default `default_path()`.

    Raises:
      FileNotFoundError: the file is missing.
      ValueError: the path is not a regular file, or its content is not a valid
        calibration; the message names the file and the field.
    """
    p = Path(path) if path is not None else default_path()
    if p.exists() and not p.is_file():
      raise ValueError(f"calibration file {p}: not a regular file")
    with open(p, "rb") as f:
      text = f.read(_MAX_FILE_BYTES + 1)
    if len(text) > _MAX_FILE_BYTES:
      raise ValueError(f"calibration file {p}: larger than {_MAX_FILE_BYTES} bytes")
    try:
      return cls.from_json(text)
    except ValueError as e:
      raise ValueError(f"calibration file {p}: {e}") from None

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


_IGNORED: dict = {}     # (path, mtime, size) of a malformed default file -> its error


def active_calibration() -> Calibration | None:
  """The calibration in force without an argument: the one set with
  `set_calibration` (or activated by `calibrate`), else the file `default_path()`
  ($ZIPCCL_CALIBRATION or the cache directory) when it exists, else None.

  A default file that is not a valid calibration is ignored (None) with a warning
  that names it, once per version of the file: a stray or damaged file must not
  break the collectives, whose options work without a calibration.
  """
  if _ACTIVE is not None:
    return _ACTIVE
  p = default_path()
  try:
    return load_calibration(p)
  except (OSError, ValueError) as e:
    try:
      st = p.stat()
      key = (str(p), st.st_mtime_ns, st.st_size)
    except OSError:
      key = (str(p), None, None)
    if key not in _IGNORED:
      _IGNORED[key] = str(e)
      warnings.warn(f"zipccl_jax: ignoring the calibration file {p} ({e}); decisions use "
                    f"no calibration. Re-run zipccl_jax.calibrate or remove the file.",
                    RuntimeWarning, stacklevel=2)
    return None


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
