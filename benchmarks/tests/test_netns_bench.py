"""benchmarks/netns_bench.py's oracle and report (the parts that run without root).

The harness trusts `reference` to say what every collective must return and
`check` to catch a wrong answer; both are checked here against the collectives
themselves on the 8 simulated devices, and the report is rendered from made-up
samples.
"""
from __future__ import annotations

import argparse
import importlib.util
import json

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from benchmarks import netns_bench as nb
from benchmarks import netns_bench_report as nbr
from benchmarks import netns_bench_worker as nbw
from zipccl_jax import costmodel as cm

N = 8


def _call(mesh, coll, codec, x):
  ring = [(i, (i + 1) % N) for i in range(N)]
  kw = dict(codec=codec, policy="always")
  body = {
      "all_gather": lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw),
      "psum_scatter": lambda v: zc.compressed_psum_scatter(v, "x", scatter_dimension=0,
                                                           tiled=True, **kw),
      "psum": lambda v: zc.compressed_psum(v, "x", **kw),
      "all_to_all": lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, **kw),
      "ppermute": lambda v: zc.compressed_ppermute(v, "x", ring, **kw),
  }[coll]
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  y = f(x)
  return [np.asarray(s.data).reshape(-1) for s in sorted(
      y.addressable_shards, key=lambda s: s.index[0].start or 0)]


@pytest.mark.parametrize("coll", nbw.COLLECTIVES)
def test_reference_matches_the_collectives(mesh8, coll):
  n, kind = 4096, "weights"
  inputs = [nbw.make_data(kind, o, n) for o in range(N)]
  x = jax.device_put(np.concatenate(inputs), jax.sharding.NamedSharding(mesh8, P("x")))
  for codec in ("raw", "zipccl"):
    got = _call(mesh8, coll, codec, x)
    for pid in range(N):
      ref, red = nbw.reference(coll, inputs, pid)
      assert red == (coll in ("psum_scatter", "psum"))
      assert nbw.check(got[pid], ref) == (0, 0.0), (coll, kind, codec, pid)
  # jax.lax's reductions pass the tolerance check (their order is XLA's).
  got = _call(mesh8, coll, None, x)
  for pid in range(N):
    ref, red = nbw.reference(coll, inputs, pid)
    c = n // N
    sl = slice(pid * c, (pid + 1) * c) if coll == "psum_scatter" else slice(0, n)
    tol = nbw.tolerance(ref, inputs, sl) if red else None
    assert nbw.check(got[pid], ref, tol)[0] == 0, (coll, kind, pid)


def test_check_catches_wrong_results():
  ref = nbw.make_data("gaussian", 0, 1000)
  y = ref.copy()
  assert nbw.check(y, ref) == (0, 0.0)
  u = y.view(np.uint16)
  u[17] ^= 1                       # one flipped mantissa bit
  assert nbw.check(y, ref)[0] == 1
  tol = nbw.tolerance(ref, [ref], slice(0, 1000))
  assert nbw.check(y, ref, tol)[0] == 0            # one ulp is within a reduction's tolerance
  y[500:] = 0                                     # a gross error (half the chunk lost)
  bad, err = nbw.check(y, ref, tol)
  assert bad >= 400 and err > 0
  # NaN payloads compare as bits: the same NaN is fine, a different one is not.
  a = np.array([0x7FC1, 0x3F80], np.uint16).view(ref.dtype)
  b = np.array([0x7FC2, 0x3F80], np.uint16).view(ref.dtype)
  assert nbw.check(a, a.copy()) == (0, 0.0) and nbw.check(b, a)[0] == 1


def test_data_is_deterministic_and_distinct():
  for kind in nbw.DATA:
    a, b = nbw.make_data(kind, 1, 5000), nbw.make_data(kind, 1, 5000)
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    assert not np.array_equal(a.view(np.uint16), nbw.make_data(kind, 2, 5000).view(np.uint16))
    assert np.all(np.isfinite(a.astype(np.float32)))
  g = nbw.make_data("gradients", 0, 3 * 10**5)
  # Real gradients: heavier tails than a Gaussian of the same spread.
  f = g.astype(np.float64)
  kurt = np.mean((f - f.mean()) ** 4) / np.var(f) ** 2
  assert kurt > 4.0


def test_plan_budget_and_arguments():
  args = argparse.Namespace(grid="2:1,4;4:1", links=("none", "1"),
                            collectives=nbw.COLLECTIVES, data=nbw.DATA)
  settings = nb.plan(args, [None, "raw", "zipccl"])
  assert [s["procs"] for s in settings] == [2, 4]
  assert set(settings[0]["round_s"]) == {"1@none", "1@1", "4@none", "4@1"}
  # A slower link and a bigger size take longer; the budget scale cuts rounds.
  assert settings[0]["round_s"]["4@1"] > settings[0]["round_s"]["1@1"] > \
      settings[0]["round_s"]["1@none"]
  assert nb.allowances(settings, 3, 1e6, 2) == 1.0
  assert 0 < nb.allowances(settings, 3, 60, 2) < 1.0
  with pytest.raises(SystemExit):
    nb.main(["--links", "fast", "--dry-run"])
  with pytest.raises(SystemExit):
    nb.main(["--collectives", "psum,all_reduce", "--dry-run"])
  assert nb.main(["--smoke", "--dry-run"]) == 0
  # --chunks: variants "<codec>@v" of the compressing codecs
  assert nbw.codec_variant("zipccl@4") == ("zipccl", 4)
  assert nbw.codec_variant("zipccl@auto") == ("zipccl", "auto")
  assert nbw.codec_variant("zipccl") == ("zipccl", 1)
  assert nbw.codec_variant("raw") == ("raw", None) and nbw.codec_variant("None") == (None, None)
  assert nb.main(["--smoke", "--dry-run", "--chunks", "1,auto,4", "--tag", "c4"]) == 0
  for bad in (["--chunks", "0"], ["--chunks", "x"], ["--tag", "a/b"]):
    with pytest.raises(SystemExit):
      nb.main(["--smoke", "--dry-run"] + bad)


def test_report_from_samples(tmp_path):
  """summarize + write_report on made-up samples: medians of the slowest process,
  ratios, auto's pick, wrong results listed, md/json (and png with matplotlib)."""
  cal = cm.projected_calibration(cm.default_calibration("cpu"), link_gbit=1, encode_GBps=3,
                                decode_GBps=3.5)
  cal = zc.Calibration.from_json(cal.to_json())
  results = []
  for pid in range(2):
    samples, events = [], []
    for rnd in range(3):
      for codec, t in (("None", 0.02), ("raw", 0.010), ("zipccl", 0.007),
                       ("zipccl@4", 0.0072)):
        samples.append(dict(mib=16.0, link="1", collective="all_gather", data="gaussian",
                            codec=codec, round=rnd, t=t * (1 + 0.1 * pid + 0.01 * rnd), bad=0))
    if pid == 1:
      events.append(dict(kind="wrong_result", pid=1, procs=2, mib=16.0, link="1",
                         collective="all_gather", data="gaussian", codec="None", round=2,
                         wrong_elements=5, elements=100, max_abs_error=1.5, exact_check=True))
    results.append(dict(pid=pid, procs=2, pinned=True, samples=samples, events=events,
                        bytes=[dict(mib=16.0, collective="all_gather", codec=c, sent=s,
                                    operand=s) for c, s in (("None", 2e7), ("raw", 1e7),
                                                            ("zipccl", 7.1e6),
                                                            ("zipccl@4", 7.2e6))],
                        calibrations={"1": cal.to_dict()}, errors=[]))
  args = argparse.Namespace(grid="2:16", links=("1",), rounds=3, data=("gaussian",),
                            collectives=("all_gather",), budget=60.0, smoke=True, pin="auto",
                            out=str(tmp_path))
  doc = nbr.summarize(args, results, [None, "raw", "zipccl", "zipccl@4"], "", 12.0, [])
  (row,) = doc["rows"]
  # Median over rounds (x1.00, 1.01, 1.02) of the slowest process (pid 1: +0.1).
  assert row["times"]["raw"] == pytest.approx(0.010 * 1.11)
  assert row["time_ratio"]["zipccl"] == pytest.approx(0.7)
  assert row["byte_ratio"]["zipccl"] == pytest.approx(0.71)
  assert row["auto"] == "zipccl" and row["auto_over_best"] == pytest.approx(1.0)
  # a chunked variant: its own column, modelled with its chunk count
  assert row["time_ratio"]["zipccl@4"] == pytest.approx(0.72)
  assert row["model"]["zipccl@4"] == pytest.approx(cm.model_time(
      "all_gather", "bfloat16", 8 * 2**20, 2, cal, "zipccl", chunks=4))
  assert doc["wrong_results"] == 1
  nbr.write_report(args, doc)
  md = next(tmp_path.glob("netns_smoke.md")).read_text()
  assert "**1 wrong results**" in md and "| 2 | 1 Gbit/s | 16 | 0.70 (0.71) |" in md
  assert json.loads(next(tmp_path.glob("netns_smoke.json")).read_text())["rows"]
  # --replot: one plot from the rows of several results; results of other codecs refused
  first = next(tmp_path.glob("netns_smoke.json"))
  other = tmp_path / "other.json"
  other.write_text(json.dumps(dict(doc, rows=[dict(row, mib=64.0)])))
  has_mpl = importlib.util.find_spec("matplotlib") is not None
  out = tmp_path / "plots"
  assert nb.main(["--replot", str(first), str(other), "--tag", "both", "--out", str(out)]) == (
      0 if has_mpl else 1)
  assert (out / "netns_both.png").exists() == has_mpl
  other.write_text(json.dumps(dict(doc, codecs=["raw"])))
  with pytest.raises(SystemExit, match="different codecs"):
    nb.main(["--replot", str(first), str(other), "--out", str(out)])
