"""The calibrated cost model (zipccl_jax/_src/costmodel.py): decisions and agreement
(calibration files: test_calibration.py).

Decisions are checked on hand-made calibrations (exact numbers), so the tests do
not depend on how busy the machine is; `calibrate` itself runs once on the 8
simulated devices with tiny sizes and once across 2 real processes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import zipccl_jax as zc
from zipccl_jax import costmodel as cm
from zipccl_jax._src import calibrate as cm_src

from tests.costmodel_cases import GBIT, cal as _cal

BF16_NP = np.dtype(ml_dtypes.bfloat16)
RESIDUAL_ALGOS = ("all_gather", "all_to_all", "ppermute")
SIZES = [2**k for k in range(6, 26, 2)]         # row elements 64 .. 16 Mi
LINKS = [0.5, 1, 2, 5, 10, 25, 100, 400]        # Gbit/s

pytestmark = pytest.mark.usefixtures("no_global_calibration")


@pytest.mark.parametrize("collective", cm.COLLECTIVES)
@pytest.mark.parametrize("n_peers", [2, 4, 16])
def test_decision_monotonic_in_link_speed(collective, n_peers):
  for m in SIZES:
    answers = [cm.decide(collective, "bfloat16", m, n_peers, _cal(link_gbit=g))[0] for g in LINKS]
    # Slower links never make compression less attractive: once False, stays False.
    first_false = answers.index(False) if False in answers else len(answers)
    assert not any(answers[first_false:]), (collective, m, list(zip(LINKS, answers)))


@pytest.mark.parametrize("collective", cm.COLLECTIVES)
@pytest.mark.parametrize("link", [1, 5, 25])
def test_decision_monotonic_in_size(collective, link):
  cal = _cal(link_gbit=link)
  answers = [cm.decide(collective, "bfloat16", m, 4, cal)[0] for m in SIZES]
  first_true = answers.index(True) if True in answers else len(answers)
  assert all(answers[first_true:]), (collective, link, list(zip(SIZES, answers)))


def test_slow_link_compresses_fast_link_does_not():
  m = 2**22   # 8 MiB bf16 rows
  for coll in cm.COLLECTIVES:
    assert cm.decide(coll, "bfloat16", m, 2, _cal(link_gbit=1)) == (True, "zipccl"), coll
    assert cm.decide(coll, "bfloat16", m, 2, _cal(link_gbit=100)) == (False, None), coll
  # Tiny rows are latency-bound: the agreement and codec latency cost more than they save.
  assert cm.decide("all_gather", "bfloat16", 64, 2, _cal(link_gbit=1)) == (False, None)
  # A codec that does not compress never pays.
  assert cm.decide("all_gather", "bfloat16", m, 2, _cal(link_gbit=1, ratio=1.0))[0] is False


def test_defaults_do_not_compress():
  for plat in ("cpu", "gpu"):
    cal = cm.default_calibration(plat)
    for coll in cm.COLLECTIVES:
      for dt in cm.DTYPES:
        for n in (2, 8, 64):
          for m in (2**10, 2**16, 2**20, 2**26):
            assert cm.decide(coll, dt, m, n, cal) == (False, None), (plat, coll, dt, n, m)
  # resolve_calibration falls back to them when nothing else is set (and "auto"
  # then keeps its static rule: active_calibration is None).
  assert cm.resolve_calibration(None).source == "defaults"
  assert cm.active_calibration() is None


def test_picks_the_faster_codec_and_ties_identically():
  base = _cal(link_gbit=0.1, codecs=("zipccl",))
  fast = dict(base.codecs["zipccl"])
  slow = {d: cm.CodecFit(f.encode_latency_s, f.encode_s_per_byte * 4, f.decode_latency_s,
                         f.decode_s_per_byte * 4, 1.6, 1.6, 1.6) for d, f in fast.items()}
  import dataclasses
  cal = dataclasses.replace(base, codecs={"zipccl": fast, "entropy": slow})
  # Slow link: the better ratio wins; medium link: the faster codec wins.
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal) == (True, "entropy")
  cal5 = dataclasses.replace(cal, links={a: cm.LinkFit(50e-6, 1 / (1 * GBIT))
                                         for a in cm.ALGORITHMS})
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal5) == (True, "zipccl")
  # Restricting the candidates is honoured; unknown names are skipped.
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal, codecs=("zipccl", "nope")) == \
      (True, "zipccl")
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal, codecs=()) == (False, None)
  # Equal codecs: the first in sorted order, whatever order they were given in.
  same = dataclasses.replace(base, codecs={"b": fast, "a": fast})
  assert cm.decide("psum", "bfloat16", 2**22, 2, same, codecs=("b", "a"))[1] == "a"
  # fastest_codec (codec="auto"): decide's codec, but also where raw is faster
  # (then decide says no); None without a candidate or without a message.
  for c in (cal, cal5, same):
    for coll in cm.COLLECTIVES:
      ok, best = cm.decide(coll, "bfloat16", 2**22, 2, c)
      assert ok and cm.fastest_codec(coll, "bfloat16", 2**22, 2, c) == best, coll
  fast_link = dataclasses.replace(cal, links={a: cm.LinkFit(5e-6, 1 / (400 * GBIT))
                                              for a in cm.ALGORITHMS})
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, fast_link) == (False, None)
  assert cm.fastest_codec("all_gather", "bfloat16", 2**22, 2, fast_link) == "zipccl"
  assert cm.fastest_codec("all_gather", "bfloat16", 2**22, 2, cal, codecs=("nope",)) is None
  assert cm.fastest_codec("all_gather", "bfloat16", 0, 2, cal) is None
  assert cm.fastest_codec("all_gather", "bfloat16", 2**22, 1, cal) is None
  with pytest.raises(ValueError, match="fastest_codec: collective"):
    cm.fastest_codec("gather", "bfloat16", 8, 2, cal)
  with pytest.raises(TypeError, match="fastest_codec: codecs must be codec names"):
    cm.fastest_codec("psum", "bfloat16", 8, 2, cal, codecs=(1,))


def test_identical_inputs_identical_decisions_also_in_another_process(tmp_path):
  cal = _cal(link_gbit=1, enc_GBps=2.0, dec_GBps=2.5, ratio=1.33, n_peers=4)
  grid = [(c, d, m, n) for c in cm.COLLECTIVES for d in cm.DTYPES for m in SIZES
          for n in (2, 4, 8)]
  mine = [cm.decide(c, d, m, n, cal) for c, d, m, n in grid]
  again = cm.Calibration.from_json(cal.to_json())
  assert again == cal and hash(again) == hash(cal) and again.fingerprint == cal.fingerprint
  assert [cm.decide(c, d, m, n, again) for c, d, m, n in grid] == mine
  assert any(a for a, _ in mine) and not all(a for a, _ in mine)   # the grid is not trivial
  path = cal.save(tmp_path / "cal.json")
  code = ("import json, sys\nfrom zipccl_jax import costmodel as cm\n"
          "grid = json.loads(sys.argv[2])\ncal = cm.Calibration.load(sys.argv[1])\n"
          "print(json.dumps([list(cm.decide(c, d, m, n, cal)) for c, d, m, n in grid]))\n")
  out = subprocess.run([sys.executable, "-c", code, str(path), json.dumps(grid)],
                       capture_output=True, text=True, timeout=120, check=True)
  assert [tuple(x) for x in json.loads(out.stdout)] == mine


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(collective="all_reduce"), ValueError, "collective"),
    (dict(dtype=np.int32), TypeError, "dtype"),
    (dict(row_elements=-1), ValueError, "row_elements"),
    (dict(row_elements=1.5), TypeError, "row_elements"),
    (dict(n_peers=0), ValueError, "n_peers"),
    (dict(margin=1.0), ValueError, "margin"),
    (dict(codecs=(3,)), TypeError, "codecs"),
    (dict(chunks=0), ValueError, "chunks"),
])
def test_decide_errors_name_the_argument(kwargs, exc, words):
  args = dict(collective="psum", dtype="bfloat16", row_elements=1024, n_peers=2,
              calibration=_cal())
  args.update(kwargs)
  with pytest.raises(exc, match=f"decide: {words}"):
    cm.decide(**args)


def test_model_time_unknown_codec_names_it():
  with pytest.raises(ValueError, match="codec 'entropy'"):
    cm.model_time("psum", "bfloat16", 1024, 2, _cal(), "entropy")


def test_mix_factor_and_sample_row():
  """The speed scaling of `calibrate`: a byte mix's time over the Gaussian time."""
  assert cm_src._mix_factor(2.0, 4.0, 0.5) == 1.5       # half the bytes twice as slow
  assert cm_src._mix_factor(2.0, 1.0, 1.0) == 0.5       # the samples alone, faster
  assert cm_src._mix_factor(0.0, 1.0, 0.5) == 1.0       # no Gaussian time: unscaled
  row = cm_src._sample_row([np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)],
                           10, np.float32)
  assert row.tolist() == [0, 1, 2, 1, 1, 1, 1, 0, 1, 2]
  with pytest.raises(ValueError, match="samples: no elements"):
    cm_src._sample_row([np.zeros(0, np.float32)], 4, np.float32)
  # Old calibration files (no mix factors) load with factor 1.
  f = cm.CodecFit(1e-6, 1e-9, 1e-6, 1e-9, 1.4)
  assert (f.encode_mix_factor, f.decode_mix_factor) == (1.0, 1.0)


def test_fit_alpha_beta():
  x = np.array([1e3, 1e4, 1e5, 1e6])
  f = cm.fit_alpha_beta(x, 3e-4 + 2e-9 * x)
  assert f.alpha_s == pytest.approx(3e-4, rel=1e-9) and f.beta_s_per_byte == pytest.approx(2e-9)
  assert f.bandwidth_gbit == pytest.approx(4.0)
  # One slow call at a small size (seen on a loaded machine: 2.8 ms for a 4 KiB row
  # next to 0.5 ms for 64 KiB) moves neither the bandwidth nor the latency much.
  x = np.array([2**12, 2**16, 2**20, 2**22], np.float64)
  t = 1e-4 + 16e-9 * x
  t[0] += 2.5e-3
  f = cm.fit_alpha_beta(x, t)
  assert f.beta_s_per_byte == pytest.approx(16e-9, rel=0.02)
  assert f.alpha_s == pytest.approx(1e-4, rel=0.5)
  # Noise that makes a parameter negative is clamped at 0.
  assert cm.fit_alpha_beta([1, 2, 3], [3.0, 2.0, 1.0]).beta_s_per_byte == 0.0
  assert cm.fit_alpha_beta([1e3, 1e6], [1e-7, 1e-3]).alpha_s == 0.0
  with pytest.raises(ValueError, match="fit_alpha_beta"):
    cm.fit_alpha_beta([1], [1])
  with pytest.raises(ValueError, match="fit_alpha_beta"):
    cm.fit_alpha_beta([1, 2], [0, 1])


def test_chunks_model_overlap():
  cal = _cal(link_gbit=2, enc_GBps=1.5, dec_GBps=1.5)
  serial = cm.model_time("all_gather", "bfloat16", 2**22, 2, cal, "zipccl", chunks=1)
  piped = cm.model_time("all_gather", "bfloat16", 2**22, 2, cal, "zipccl", chunks=4,
                        overlap=1.0)
  assert piped < serial
  # Overlap makes compression pay on a link where the serial transport does not.
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal, chunks=1)[0] is False
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal, chunks=8, overlap=1.0)[0] is True
  # Without overlap (XLA:CPU, measured: the default of a "cpu" calibration) chunks
  # only add latencies.
  assert cal.platform == "cpu" and cm.overlap_fraction(cal) == 0.0
  assert cm.model_time("all_gather", "bfloat16", 2**22, 2, cal, "zipccl", chunks=4) > serial
  assert cm.decide("all_gather", "bfloat16", 2**22, 2, cal, chunks=8)[0] is False
  # Raw is not pipelined: chunks only changes the compressed time.
  assert cm.model_time("psum", "bfloat16", 2**20, 2, cal, None, chunks=4) == \
      cm.model_time("psum", "bfloat16", 2**20, 2, cal, None, chunks=1)


def test_agreement_takes_process_0s_numbers():
  """Three threads stand in for three processes; broadcast is a barrier exchange."""
  nproc = 3
  barrier = threading.Barrier(nproc)
  slot = {}

  def make_broadcast(pid):
    def broadcast(arr):
      if pid == 0:
        slot["v"] = np.array(arr)
      barrier.wait()
      got = np.array(slot["v"])
      barrier.wait()
      assert got.shape == np.asarray(arr).shape   # the contract: same shape everywhere
      return got
    return broadcast

  mine = [_cal(link_gbit=1 + pid, n_peers=nproc) for pid in range(nproc)]
  results = [None] * nproc
  errors = []

  def run(pid):
    try:
      # Non-source processes pass a placeholder of the source's shape, as required.
      results[pid] = cm.agree_across_processes(mine[pid], process_index=pid,
                                               broadcast=make_broadcast(pid))
    except Exception as e:   # pragma: no cover - reported below
      errors.append(e)

  # The length broadcast has one element everywhere, the payload broadcast the
  # source's length: workers of other processes allocate from the received length.
  threads = [threading.Thread(target=run, args=(p,)) for p in range(nproc)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  assert not errors, errors
  assert all(r == mine[0] for r in results)
  assert len({r.fingerprint for r in results}) == 1 and mine[1] != mine[0]
  # A single process: unchanged, no broadcast.
  assert cm.agree_across_processes(mine[2]) is mine[2]


def test_project():
  cal = _cal(link_gbit=10, n_peers=2)
  rows = cm.project(cal, n_hosts=(2, 16), message_bytes=(2**20, 2**26), link_gbit=1)
  assert len(rows) == len(cm.COLLECTIVES) * 4
  big = [r for r in rows if r.message_bytes == 2**26]
  assert all(r.compress and r.ratio < 0.9 for r in big), cm.format_projection(big)
  # A GPU-speed codec on a 100 Gbit/s link pays for large messages; a CPU-speed one does not.
  gpu = cm.project(cal, n_hosts=(8,), message_bytes=(2**26,), collectives=("all_gather",),
                   link_gbit=100, encode_GBps=800, decode_GBps=1000)
  cpu = cm.project(cal, n_hosts=(8,), message_bytes=(2**26,), collectives=("all_gather",),
                   link_gbit=100)
  assert gpu[0].compress and not cpu[0].compress
  table = cm.format_projection(rows)
  assert table.count("\n") == len(rows) + 1 and "compressed/raw" in table
  with pytest.raises(ValueError, match="link_gbit"):
    cm.project(cal, link_gbit=0)
  with pytest.raises(ValueError, match="n_hosts"):
    cm.project(cal, n_hosts=(1,))
  with pytest.raises(ValueError, match="codec must be"):
    cm.project(cal, codec="nope")
  with pytest.raises(ValueError, match="link_efficiency"):
    cm.project(cal, link_efficiency=0)
  # codec=None: each row takes what codec="auto" would (the fastest modelled codec).
  two = dataclasses.replace(cal, codecs={"zipccl": cal.codecs["zipccl"], "entropy": {
      d: dataclasses.replace(f, ratio=1.6) for d, f in cal.codecs["zipccl"].items()}})
  assert {r.codec for r in cm.project(two, link_gbit=1)} == {"entropy"}
  assert {r.codec for r in cm.project(two, link_gbit=1, codec="zipccl")} == {"zipccl"}
  with pytest.raises(ValueError, match="no codec numbers for bfloat16"):
    cm.project(dataclasses.replace(cal, codecs={}))


def test_raw_transport_copies_count_for_the_raw_path_only():
  """copy_s_per_byte (the uncompressed transport's bitcast copies on XLA:CPU) adds
  to the raw path's time per received byte, not to the compressed path's; a
  calibration file without it (written before) loads with 0."""
  base = _cal(link_gbit=10)
  copy = 0.5e-9
  links = {a: dataclasses.replace(f, copy_s_per_byte=copy if a != "all_reduce" else 0.0)
           for a, f in base.links.items()}
  cal = dataclasses.replace(base, links=links)
  m, n = 1 << 20, 4
  for coll, wire in (("all_gather", (n - 1) * 2 * m), ("ppermute", 2 * m),
                     ("psum_scatter", (n - 1) * 2 * m)):
    d_raw = cm.model_time(coll, "bfloat16", m, n, cal) - cm.model_time(coll, "bfloat16", m, n, base)
    assert d_raw == pytest.approx(copy * wire, rel=1e-9), coll
    assert cm.model_time(coll, "bfloat16", m, n, cal, "zipccl") == \
        cm.model_time(coll, "bfloat16", m, n, base, "zipccl")
  d = cal.to_dict()
  for v in d["links"].values():
    v.pop("copy_s_per_byte")
  assert all(f.copy_s_per_byte == 0.0 for f in cm.Calibration.from_dict(d).links.values())
  assert cm.Calibration.from_dict(cal.to_dict()) == cal


def test_a_bare_sample_above_the_raw_transport_is_noise():
  """`_bounded_bare`: the raw transport runs the bare collective plus copies, so a
  bare sample above it is re-timed once and bounded by it; a plausible one is kept
  without another timing."""
  from zipccl_jax._src import calibrate as cmi
  calls, logs = [], []
  again = lambda t: (lambda: calls.append(t) or t)   # noqa: E731
  assert cmi._bounded_bare(0.030, 0.035, again(0.5), "all_to_all", logs.append) == 0.030
  assert calls == []
  assert cmi._bounded_bare(0.0487, 0.035, again(0.031), "all_to_all", logs.append) == 0.031
  assert cmi._bounded_bare(0.0487, 0.035, again(0.040), "all_to_all", logs.append) == 0.035
  assert calls == [0.031, 0.040] and len(logs) == 1 and "still above" in logs[0]


class _ScriptedMeter:
  """A stand-in for costmodel._Meter: bare collectives take alpha + bytes * beta
  (the first timing of the largest bare size 10x that: a noisy sample), the raw
  transport (bf16 rows) 5% more than the bare collective."""

  reps = 3

  def __init__(self, alpha, beta, big):
    self.alpha, self.beta, self.big, self.seen_big = alpha, beta, big, False

  def smap(self, body):
    return body

  def array(self, a):
    return a

  def time(self, f, a, **_):
    nbytes = a.size * a.dtype.itemsize
    t = self.alpha + self.beta * nbytes
    if a.dtype == np.uint8 and a.size == self.big and not self.seen_big:
      self.seen_big = True
      return 10 * t
    return t * 1.05 if a.dtype != np.uint8 else t


def test_measure_links_fits_past_a_noisy_largest_sample():
  """_measure_links with a noisy bare sample at the largest size: the fit's slope is
  the true one (before: 10x the sample at the largest size set the LAD fit's slope)."""
  from zipccl_jax._src import calibrate as cmi
  sizes = [1 << 12, 1 << 14, 1 << 16, 1 << 18]
  alpha, beta = 50e-6, 1e-9
  meter = _ScriptedMeter(alpha, beta, big=sizes[-1])
  meter.axes = "x"
  points = {}
  fits = cmi._measure_links(meter, 2, sizes, lambda *_: None, points)
  ag = fits["all_gather"]
  rows = cmi._wire_rows("all_gather", 2)
  assert ag.beta_s_per_byte == pytest.approx(beta / rows, rel=1e-6), ag
  assert ag.alpha_s == pytest.approx(alpha, rel=1e-6), ag
  assert max(t for _, t in points["all_gather"]) < 2 * (alpha + beta * sizes[-1])


def test_calibrate_on_8_devices(mesh8, tmp_path):
  path = tmp_path / "c.json"
  cal = zc.calibrate(mesh8, "x", dtypes=("bfloat16",), codec_bytes=(2**12, 2**15),
                     link_row_bytes=(2**10, 2**13), reps=1, warmup=1, path=path)
  assert cal.source == "measured" and cal.n_peers == 8 and cal.platform == "cpu"
  assert set(cal.links) == set(cm.ALGORITHMS)
  assert all(f.alpha_s >= 0 and f.beta_s_per_byte >= 0 for f in cal.links.values())
  # the uncompressed transport was timed too, at the largest row size
  points = cal.meta["link_points"]
  for algo in ("all_gather", "all_to_all", "ppermute"):
    assert len(points[algo]) == 2 and len(points[f"{algo}/raw"]) == 1
    assert cal.links[algo].copy_s_per_byte >= 0
  assert cal.links["all_reduce"].copy_s_per_byte == 0
  fit = cal.codecs["zipccl"]["bfloat16"]
  # The window codec compresses Gaussian bf16 (1.41 at large n; >= 1.3 at 32 KiB rows).
  assert fit.ratio_gaussian > 1.3 and 1.0 <= fit.ratio <= fit.ratio_gaussian
  assert fit.encode_s_per_byte > 0 and fit.decode_s_per_byte > 0
  assert cm.Calibration.load(path) == cal
  assert cm.resolve_calibration(None) == cal     # activate=True
  # The residuals: each codec's compressed transports timed end to end at the
  # largest row size; with them the model reproduces that measured call (unless
  # clamped at -0.5 x the model), on every dtype of the codec.
  for codec, per in cal.codecs.items():
    f = per["bfloat16"]
    for algo in RESIDUAL_ALGOS:
      (wire, t, t_model), = points[f"{algo}/{codec}"]
      assert wire == (1 if algo == "ppermute" else 7) * 2**13 and t > 0 and t_model > 0
      extra = f.extra_s_per_byte(algo)
      assert extra == max((t - t_model) / wire, -0.5 * t_model / wire)
      probe = dataclasses.replace(cal, codecs={codec: {"bfloat16": cm_src.gaussian_fit(f)}})
      assert cm.model_time(algo, "bfloat16", 2**12, 8, probe, codec) == pytest.approx(
          t_model + extra * wire, rel=1e-9)
      assert cm.model_time(algo, "bfloat16", 2**12, 8, probe, codec, residual=False) == (
          pytest.approx(t_model, rel=1e-9))
  assert "residual ns per received byte" in cal.summary()
  # The speeds hold the time on the ratio's data (half heavy-tailed): the Gaussian
  # fit divides the factor back out.
  for codec, per in cal.codecs.items():
    f = per["bfloat16"]
    assert 0.2 < f.encode_mix_factor < 5 and 0.2 < f.decode_mix_factor < 5, (codec, f)
    g = cm_src.gaussian_fit(f)
    assert g.encode_s_per_byte * f.encode_mix_factor == pytest.approx(f.encode_s_per_byte)
    assert g.decode_s_per_byte * f.decode_mix_factor == pytest.approx(f.decode_s_per_byte)
    assert g.ratio == f.ratio_gaussian and g.encode_mix_factor == g.decode_mix_factor == 1.0
  assert "speeds on the ratio's data" in cal.summary()
  # The user's own tensors set the assumed ratio: Gaussian alone compresses better
  # than the synthetic mix; a row of all-distinct exponents does not fit (ratio 1).
  gauss = cm.synthetic("gaussian", 2**15, BF16_NP, seed=3)
  with_samples = zc.calibrate(mesh8, "x", dtypes=("bfloat16",), codec_bytes=(2**12, 2**15),
                              link_row_bytes=(2**10, 2**13), reps=1, save=False,
                              activate=False, samples=[gauss])
  assert with_samples.codecs["zipccl"]["bfloat16"].ratio == pytest.approx(
      cm.sample_ratio("zipccl", [gauss]))
  assert cm.sample_ratio("zipccl", [gauss]) > fit.ratio
  wild = (np.arange(2**15, dtype=np.uint32).astype(np.uint16) * np.uint16(40503)).view(BF16_NP)
  assert cm.sample_ratio("zipccl", [wild]) == 1.0
  with pytest.raises(TypeError, match=r"calibrate: samples\[0\]"):
    zc.calibrate(mesh8, "x", save=False, samples=[np.zeros(4, np.int8)])
  # Re-measuring the links only keeps the codec numbers.
  again = zc.calibrate(mesh8, "x", link_row_bytes=(2**10, 2**13), reps=1, save=False,
                       activate=False, reuse_codecs=cal)
  # (but the residuals belong to the links: measured again)
  def speeds(c):
    return {k: {d: dataclasses.replace(f, **{f"extra_{a}_s_per_byte": 0.0 for a in RESIDUAL_ALGOS})
                for d, f in per.items()} for k, per in c.codecs.items()}
  assert speeds(again) == speeds(cal) and again.reduce == cal.reduce
  assert again.meta["link_points"]["all_gather/zipccl"] != points["all_gather/zipccl"]
  with pytest.raises(TypeError, match="calibrate: reuse_codecs"):
    zc.calibrate(mesh8, "x", save=False, reuse_codecs={"codecs": {}})
  with pytest.raises(ValueError, match="calibrate: axis_name"):
    zc.calibrate(mesh8, "nope", save=False)
  with pytest.raises(ValueError, match="calibrate: axis_name is required"):
    zc.calibrate(mesh8, save=False)
  with pytest.raises(ValueError, match="calibrate: codecs"):
    zc.calibrate(mesh8, "x", codecs=("nope",), save=False)
  with pytest.raises(ValueError, match="calibrate: codec_bytes"):
    zc.calibrate(mesh8, "x", codec_bytes=(4096,), save=False)
  with pytest.raises(TypeError, match="calibrate: dtype"):
    zc.calibrate(mesh8, "x", dtypes=("int8",), save=False)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_calibrate_across_two_processes_agrees(tmp_path):
  """Two jax.distributed processes measure different numbers; both keep process 0's."""
  worker = Path(__file__).with_name("_costmodel_worker.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)
  port = _free_port()
  logs = [tmp_path / f"w{i}.log" for i in range(2)]
  procs = [subprocess.Popen([sys.executable, str(worker), str(i), "2", str(port), str(tmp_path)],
                            stdout=open(logs[i], "w"), stderr=subprocess.STDOUT, env=env,
                            cwd=str(worker.parent.parent)) for i in range(2)]
  deadline = time.monotonic() + 150
  try:
    while any(p.poll() is None for p in procs):
      bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
      if bad or time.monotonic() > deadline:
        i = bad[0] if bad else 0
        pytest.fail(f"worker {i} failed or timed out:\n{logs[i].read_text()[-3000:]}")
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.wait()
  assert [p.returncode for p in procs] == [0, 0], [lg.read_text()[-2000:] for lg in logs]
  files = [(tmp_path / f"calibration{i}.json").read_bytes() for i in range(2)]
  assert files[0] == files[1]
  cal = cm.Calibration.from_json(files[0])
  assert cal.n_peers == 2 and cal.meta["process_count"] == 2
  dec = [json.loads((tmp_path / f"decisions{i}.json").read_text()) for i in range(2)]
  # Every call is timed after a barrier as the slowest process's time (process 1
  # sleeps 50 ms per call): both processes get the same median, >= 50 ms.
  assert dec[0]["skewed_s"] == dec[1]["skewed_s"] >= 0.05, dec
  assert dec[0] == dec[1] and dec[0]["agree"] is True


def test_residual_enters_the_compressed_model_per_received_byte():
  """CodecFit.extra_<algo>_s_per_byte adds per received raw byte of each algorithm
  the collective uses (psum: its all-to-all and its all-gather), only to the
  compressed path; projecting another codec speed drops it; old files load as 0."""
  cal = _cal(link_gbit=2.0, n_peers=4)
  f = cal.codecs["zipccl"]["bfloat16"]
  extra = {"all_gather": 0.3e-9, "all_to_all": 0.2e-9, "ppermute": -0.1e-9}
  with_extra = dataclasses.replace(cal, codecs={"zipccl": {"bfloat16": dataclasses.replace(
      f, **{f"extra_{a}_s_per_byte": v for a, v in extra.items()})}})
  m = 2**20
  for coll, algos in (("all_gather", ("all_gather",)), ("psum_scatter", ("all_to_all",)),
                      ("all_to_all", ("all_to_all",)), ("psum", ("all_to_all", "all_gather")),
                      ("ppermute", ("ppermute",))):
    base = cm.model_time(coll, "bfloat16", m, 4, cal, "zipccl")
    got = cm.model_time(coll, "bfloat16", m, 4, with_extra, "zipccl")
    want = base + sum(extra[a] * (1 if a == "ppermute" else 3) * 2 * m for a in algos)
    assert got == pytest.approx(want, rel=1e-12), coll
    assert cm.model_time(coll, "bfloat16", m, 4, with_extra, "zipccl", residual=False) == base
    assert cm.model_time(coll, "bfloat16", m, 4, with_extra, None) == cm.model_time(
        coll, "bfloat16", m, 4, cal, None)
  # a positive residual can turn a decision around
  assert cm.decide("all_gather", "bfloat16", m, 4, cal)[0]
  big = dataclasses.replace(cal, codecs={"zipccl": {"bfloat16": dataclasses.replace(
      f, extra_all_gather_s_per_byte=1e-9)}})
  assert not cm.decide("all_gather", "bfloat16", m, 4, big)[0]
  # another codec speed (e.g. a GPU's) has its own residual: dropped
  proj = cm.projected_calibration(with_extra, encode_GBps=300.0, decode_GBps=300.0)
  assert all(proj.codecs["zipccl"]["bfloat16"].extra_s_per_byte(a) == 0 for a in extra)
  assert cm.projected_calibration(with_extra, link_gbit=25.0).codecs == with_extra.codecs
  # round trip, and a file written before the residuals loads with 0
  assert cm.Calibration.from_json(with_extra.to_json()) == with_extra
  d = json.loads(with_extra.to_json())
  for a in extra:
    del d["codecs"]["zipccl"]["bfloat16"][f"extra_{a}_s_per_byte"]
  assert cm.Calibration.from_dict(d) == dataclasses.replace(cal, codecs={"zipccl": {"bfloat16": f}})
