"""Measuring a calibration on the user's machine: `calibrate`.

`calibrate()` measures, on the user's mesh,

  * every codec's encode and decode time per dtype, as latency + bytes/throughput
    (fitted over a few sizes; bytes are *raw* bytes), and its compression ratio on
    synthetic Gaussian and heavy-tailed data (or the user's samples);
  * the link: latency alpha (s) and per-byte time beta (s/byte) of each XLA
    collective the transport uses (all-gather; all-to-all as the transport runs it,
    N - 1 collective permutes on CPU; collective-permute; the all-reduce of the
    size agreement), by timing uncompressed uint8 collectives of a few message
    sizes inside `jax.shard_map` over the given mesh axis, and what the library's
    raw and compressed transports cost beyond the model's terms;
  * the ordered float32 sum of the reductions.

Process 0's numbers are broadcast to every process, so that every process holds
the same calibration and decides alike.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform as _platform
import statistics
import time
import warnings
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from zipccl_jax._src import row_ops
from zipccl_jax._src.calibration import (
    DTYPES, Calibration, CodecFit, LinkFit, _RESIDUAL_ALGOS, _platform_name,
    default_calibration, default_path, set_calibration)
from zipccl_jax._src.calibration_agreement import agree_across_processes
from zipccl_jax._src.codecs import api as codec_api
from zipccl_jax._src.codecs import registry
from zipccl_jax._src.collectives import api as coll
from zipccl_jax._src.costmodel import (
    _ITEMSIZE, _check_int, _dtype_name, _fmt_bytes, _wire_rows, fit_alpha_beta, model_time)

def available_codecs() -> tuple[str, ...]:
  """The registered compressing codecs ("raw" and None are transport modes)."""
  return tuple(registry.names())


def _codec_supports(codec: str, dtype: str) -> bool:
  return registry.get(codec).supports(np.dtype(dtype))


def _codec_fns(codec: str):
  """(encode(v) -> Encoded, decode(Encoded) -> y, Encoded -> (payload, status)):
  one row of a registered codec through the tensor-level API."""
  return (lambda v: codec_api.encode(v, codec=codec), codec_api.decode,
          lambda enc: (enc.payload, enc.status))


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
  axes = meter.axes
  perm = [(i, (i + 1) % n_peers) for i in range(n_peers)]
  bf16 = jnp.bfloat16
  programs = {
      "all_gather": (lambda r: np.zeros(r, np.uint8),
                     lambda v: lax.all_gather(v[0], axes, tiled=True)[None],
                     lambda r: np.zeros(r // 2, bf16),
                     lambda v: coll.compressed_all_gather(v[0], axes, tiled=True, codec="raw")[None]),
      # The all-to-all the transport runs: on CPU N - 1 collective permutes
      # (`row_ops.a2a_slot`), elsewhere lax.all_to_all. Timing lax.all_to_all on
      # CPU fitted a link up to ~12% slower than the transport's (gloo, 10 Gbit/s,
      # 2 processes), and the raw transport's copy term cannot go below 0 to
      # correct it.
      "all_to_all": (lambda r: np.zeros((n_peers, r), np.uint8),
                     lambda v: row_ops.a2a_slot(v[0], v.shape[-1], axes)[None],
                     lambda r: np.zeros((n_peers, r // 2), bf16),
                     lambda v: coll.compressed_all_to_all(v[0], axes, 0, 0, tiled=True,
                                                        codec="raw")[None]),
      "ppermute": (lambda r: np.zeros(r, np.uint8),
                   lambda v: lax.ppermute(v[0], axes, perm)[None],
                   lambda r: np.zeros(r // 2, bf16),
                   lambda v: coll.compressed_ppermute(v[0], axes, perm, codec="raw")[None]),
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
  return fits


def sample_ratio(codec: str, samples: Sequence) -> float:
  """raw bytes / used bytes of `codec` over the given arrays (one row each), on the
  first local device. A row that does not fit counts as raw (the raw rung)."""
  encode, _, parts = _codec_fns(codec)
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
  jnp_dtype = np.dtype(dtype)
  xs, te, td = [], [], []
  encode, decode, parts = _codec_fns(codec)
  enc_f = meter.smap(lambda v: jax.tree.map(lambda a: a[None], encode(v[0])))
  dec_f = meter.smap(lambda e: decode(jax.tree.map(lambda a: a[0], e))[None])
  for nbytes in sizes:
    n = max(nbytes // jnp_dtype.itemsize, 1)
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
        "all_gather": ((m,), lambda v: coll.compressed_all_gather(v[0], axes, tiled=True, **kw)[None]),
        "all_to_all": ((n, m), lambda v: coll.compressed_all_to_all(v[0], axes, 0, 0, tiled=True,
                                                                  **kw)[None]),
        "ppermute": ((m,), lambda v: coll.compressed_ppermute(v[0], axes, ring, **kw)[None]),
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
    # A measurement is never thrown away: a file that cannot be written (a
    # read-only cache directory, a full disk) is a warning, and the calibration is
    # still returned and activated.
    try:
      p = cal.save(path)
      log(f"calibrate: wrote {p}")
    except OSError as e:
      warnings.warn(f"calibrate: could not save the calibration to "
                    f"{path if path is not None else default_path()} ({e}); it is returned "
                    f"{'and activated ' if activate else ''}but not saved",
                    RuntimeWarning, stacklevel=2)
  if activate:
    set_calibration(cal)
  log(cal.summary())
  return cal
