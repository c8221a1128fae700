"""benchmarks/gpu_check.py without a GPU: its --rehearse mode runs every phase with the
CPU standing in for the GPU, so that bugs of the script itself cost no GPU minutes.

The rehearsal compares CPU with CPU and so never reaches the code that reports a
mismatch; those paths and the GPU-only branches of the report writer are called
directly here.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np

import zipccl_jax as zc
from benchmarks import gpu_check as gc
from benchmarks import gpu_check_codec as gcc

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"




def test_rehearsal_runs_every_gpu_phase_on_the_cpu(tmp_path):
  results = ROOT / "benchmarks" / "results"
  before = set(results.iterdir())
  # Smallest settings: --quick, no build, no tests/test_window.py (the suite runs that file itself).
  res = subprocess.run([sys.executable, str(SCRIPT), "--rehearse", "--quick", "--skip-build", "--skip-tests",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
  log = res.stdout + res.stderr
  assert res.returncode == 0, log[-6000:]
  assert "Traceback" not in log, log[-6000:]
  assert set(results.iterdir()) == before, "a rehearsal wrote into benchmarks/results/"

  mds, jsons = list(tmp_path.glob("gpu_check_rehearsal_*.md")), list(tmp_path.glob("gpu_check_rehearsal_*.json"))
  assert len(mds) == 1 and len(jsons) == 1, sorted(p.name for p in tmp_path.iterdir())
  md, rep = mds[0].read_text(), json.loads(jsons[0].read_text())
  assert "rehearsal" in md.lower() and "not GPU" in md
  assert rep["rehearsal"] is True and "rehearsal" in rep["mode"]

  ident = rep["identity"]
  assert ident["ok"] is True and ident["failures"] == 0 and ident["exit"] == 0, ident.get("error")
  assert len(ident["cases"]) >= 60 and all(c["ok"] for c in ident["cases"])
  names = {" ".join(c["case"]) for c in ident["cases"]}
  # Rows that do not fit, several rows, misaligned rows and the (shrunk) large case all ran.
  assert any("bits" in s and "rows=4" in s for s in names) and any("n=0" in s for s in names)
  assert any("rows=5 n=7" in s for s in names) and any("n=1048579" in s for s in names)
  assert [c["dtype"] for c in ident["corrupt"]] == ["bfloat16", "float16", "float32"]
  assert all(c["ok"] and c["count"] > 100 for c in ident["corrupt"])
  hist = {int(k) for c in ident["corrupt"] for k in c["cpu_status_hist"]}
  assert hist == set(range(10)), hist  # the corrupted payloads reach every decoder status

  tim = rep["timing"]
  assert tim["ok"] is True and tim["exit"] == 0, tim.get("error")
  # Every size, both ops, every tile-kernel variant G (cuda/window.cu; ZIPCCL_CUDA_GROUPS).
  variants = list(gcc.GROUP_VARIANTS)
  assert [r["size"] for r in tim["rows"]] == sum(([s] * 2 * len(variants) for s in ("256 KiB", "4 MiB", "256 KiB")), [])
  assert [r["groups"] for r in tim["rows"]] == sum(([g, g] for g in variants), []) * 3
  assert all(r["bit_identical"] and r["time_us"] > 0 for r in tim["rows"])
  # The entropy codec's phase: every case, the (shrunk) 64M case, corruptions, timing with identity.
  en = rep["entropy"]
  assert en["ok"] is True and en["failures"] == 0 and en["exit"] == 0, en.get("error")
  assert len(en["cases"]) >= 30 and all(c["ok"] for c in en["cases"])
  en_names = {" ".join(c["case"]) for c in en["cases"]}
  assert any("n=1048579" in s for s in en_names) and any("rows=3 n=4097" in s for s in en_names)
  # Kind Z (format v3): zero data in both dtypes, corrupted ReLU payloads (HUFF-Z blocks).
  for dist in ("relu_pm", "negzeros", "sparse", "zerosub", "blockmix"):
    assert {dt for s in en_names if f" {dist} " in f" {s} " for dt in ("bfloat16", "float16") if dt in s} == {
        "bfloat16", "float16"}, (dist, en_names)
  assert [c["dtype"] for c in en["corrupt"]] == ["bfloat16 gauss", "float16 gauss", "bfloat16 relu", "float16 relu"]
  assert all(c["ok"] and c["count"] > 90 for c in en["corrupt"])
  en_hist = {int(k) for c in en["corrupt"] for k in c["cpu_status_hist"]}
  assert {0, 1, 2, 3, 4, 5, 6, 8} <= en_hist, en_hist
  # --quick: 64 MiB (shrunk) bf16 Gaussian, bf16 GELU-like (HUFF-J blocks), bf16 ReLU (HUFF-Z),
  # fp16 Gaussian and fp16 ReLU.
  assert [(r["dtype"], r["data"], r["op"]) for r in en["rows"]] == [
      (d, k, op) for d, k in (("bfloat16", "gauss"), ("bfloat16", "gelu"), ("bfloat16", "relu"),
                              ("float16", "gauss"), ("float16", "relu"))
      for op in ("encode", "decode")]
  assert all(r["bit_identical"] for r in en["rows"])
  assert "## Entropy codec" in md
  # Planned vs ladder between matmuls: the ladder's calls are conditionals, the plan's are not.
  pl = rep["planned"]
  assert pl["ok"] is True and pl["exit"] == 0, pl.get("error")
  rows = pl["rows"]
  assert rows["ladder"]["conditionals"] >= pl["layers"] and rows["planned"]["conditionals"] == 0
  assert all(r["bit_identical"] and r["step_us"] > 0 for r in rows.values())
  assert "## Planned vs ladder" in md
  # The identity phase rotated the variants over its GPU-side calls.
  assert set(ident["variant_calls"]) == {str(g) for g in variants} and min(ident["variant_calls"].values()) > 20


def test_rehearsal_refuses_the_results_directory():
  res = subprocess.run([sys.executable, str(SCRIPT), "--rehearse", "--out", str(ROOT / "benchmarks" / "results")],
                       capture_output=True, text=True, timeout=60)
  assert res.returncode == 2 and "must not be benchmarks/results" in res.stderr, res.stderr


def _case(dtype, n, rows):
  x = gcc.make("gauss", rows * n, dtype, 1).reshape(rows, n)
  p, s = (np.asarray(a) for a in zc.encode_rows(jax.numpy.asarray(x)))
  y, st = (np.asarray(a) for a in zc.decode_rows(jax.numpy.asarray(p), n, dtype))
  return x, p, s, y, st


def test_mismatch_reports():
  """What a GPU run prints when the GPU and the CPU disagree (never reached by CPU vs CPU)."""
  for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)):
    n, rows = 5001, 3
    x, p, s, y, st = _case(dtype, n, rows)
    assert gcc.compare_case(x, p, s, p, s, y, st, st, dtype, n) == (True, True, "")

    secs = dict((k, (lo, hi)) for k, lo, hi in gcc.sections(dtype, n, p.shape[1]))
    assert secs["escapes"] == (zc.codecs.get("zipccl").min_nbytes(dtype, n), p.shape[1]) and p.shape[1] == zc.codecs.get("zipccl").max_nbytes(dtype, n)
    pg = p.copy()
    pg[1, secs["planes"][0] + 3] ^= 4
    pg[2, secs["table"][0]] ^= 1
    sg = s.copy()
    sg[2, 1] += 1
    enc_ok, dec_ok, msg = gcc.compare_case(x, pg, sg, p, s, y, st, st, dtype, n)
    assert (enc_ok, dec_ok) == (False, True)
    assert "2 bytes differ (table: 1, planes: 1); first at row 1" in msg and "stats gpu" in msg, msg

    stg, yg = st.copy(), y.copy()
    stg[0] = 8
    yg.view(np.uint8)[2, 7] ^= 1
    enc_ok, dec_ok, msg = gcc.compare_case(x, p, s, p, s, yg, stg, st, dtype, n)
    assert (enc_ok, dec_ok) == (True, False)
    assert "decode status gpu [8, 0, 0] cpu [0, 0, 0]" in msg and "decoded values differ at" in msg, msg

    # A row that failed on both sides must be all-one bits on the GPU too.
    stf = st.copy()
    stf[1] = 8
    yf = y.copy()
    yf.view(np.uint8)[1] = 0xFF
    assert gcc.compare_case(x, p, s, p, s, yf, stf, stf, dtype, n)[1] is True
    yf.view(np.uint8)[1, 5] = 0
    enc_ok, dec_ok, msg = gcc.compare_case(x, p, s, p, s, yf, stf, stf, dtype, n)
    assert (enc_ok, dec_ok) == (True, False) and "not all-one bits" in msg, msg

  assert gcc.describe_diff(p[:, :-128], p, dtype, n).startswith("shape")


def test_checksum_matches_the_codec():
  """checksum_np re-seals the corrupted payloads of the identity phase: it must be the format's checksum."""
  for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)):
    _, p, s, _, _ = _case(dtype, 4099, 2)
    for row, st in zip(p, s):
      used = int(st[2]) * 128
      assert gcc.checksum_np(row[:used]) == int.from_bytes(row[24:32].tobytes(), "little")
      assert gcc.checksum_np(row) == gcc.checksum_np(row[:used])  # bytes past used are zero


def _report(**phases):
  base = {"date": "2026-01-02T03:04:05Z", "git": "abc1234", "mode": "full",
          "device": {"device": "NVIDIA H200", "nvidia_smi": "NVIDIA H200, 143771 MiB", "jax": "0.10.2",
                     "python": "3.11"}}
  return {**base, **phases}


def test_report_of_a_gpu_run_and_of_failed_phases(tmp_path, monkeypatch, capsys):
  """The report writer's GPU-only branches ($OUT, build log copy, ptxas table, no rehearsal labels) and its
  failure branches, with made-up phase results."""
  out, extra = tmp_path / "results", tmp_path / "OUT"
  out.mkdir()
  (out / "gpu_check_build.log").write_text("build log")
  monkeypatch.setenv("OUT", str(extra))
  args = argparse.Namespace(out=out, quick=False, rehearse=False)
  row = {"size": "1 GiB", "dtype": "bfloat16", "op": "encode", "groups": 4, "time_us": 400.0, "gbps_input": 2684.0,
         "gbps_moved": 4500.0, "copy_gbps": 4000.0, "roofline_share": 1.1, "bit_identical": False}
  gc.write_report(args, _report(
      build={"ok": True, "ptxas": {"encode_kernel<BF16> sm_90": {"registers": 48, "smem": 12472, "stack": 0,
                                                                 "spill_stores": 0, "spill_loads": 0}}},
      tests={"ok": False, "summary": "1 failed, 85 passed"},
      identity={"ok": False, "failures": 1, "cases": [{"ok": True}, {"ok": False}],
                "corrupt": [{"dtype": "float16", "count": 127, "ok": False, "cpu_status_hist": {"0": 127}}]},
      timing={"ok": False, "rows": [row], "method": "m"}))
  md = (out / "gpu_check_20260102T030405.md").read_text()
  assert "GPU check" in md and "rehearsal" not in md.lower()
  assert "| encode_kernel<BF16> sm_90 | 48 | 12472 | 0 | 0/0 |" in md
  assert "on the GPU backend: 1 failed, 85 passed" in md and "1/2 cases identical (see JSON)" in md
  assert "same status on GPU and CPU: NO" in md and "| 1 GiB | bfloat16 | encode | 4 | 400.0 | 2684 |" in md
  for f in ("gpu_check_20260102T030405.md", "gpu_check_20260102T030405.json", "gpu_check_build.log"):
    assert (extra / f).exists(), f

  # Phases whose process crashed: only an error string comes back.
  args = argparse.Namespace(out=tmp_path / "r2", quick=True, rehearse=True)
  gc.write_report(args, _report(build={"ok": False, "error": "nvcc not found"},
                                identity={"ok": False, "error": "RuntimeError: boom", "exit": 0},
                                timing={"ok": False, "error": "phase process exited -11 without a result"}))
  md = next((tmp_path / "r2").glob("gpu_check_rehearsal_*.md")).read_text()
  assert "- build: FAILED" in md and "0/0 cases identical (RuntimeError: boom)" in md
  assert "Timing failed: phase process exited -11" in md
  assert not list(extra.glob("gpu_check_rehearsal_*")), "a rehearsal wrote to $OUT"
  capsys.readouterr()
