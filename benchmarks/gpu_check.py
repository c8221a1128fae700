#!/usr/bin/env python3
"""One-shot check of the zipccl CUDA codec on a GPU machine (about 5 minutes).

Run from the repository root, on a machine with an NVIDIA GPU, jax with its CUDA
plugin, nanobind, scikit-build-core, cmake and a CUDA toolkit (nvcc); no network
is needed:

    python3 benchmarks/gpu_check.py            # everything
    python3 benchmarks/gpu_check.py --quick    # fewer cases and sizes
    python3 benchmarks/gpu_check.py --skip-build --out /tmp/results

Phases (each GPU phase runs in its own process, so a fault in one cannot hide the
others' results):
  1. build    pip install --no-build-isolation --no-deps . with ZIPCCL_CUDA=ON and
              ptxas -v, printing registers / spills / stack per kernel
  2. tests    pytest -x -q tests/test_window*.py on the GPU backend (from a copy of
              tests/, so that the installed package is the one imported)
  3. identity GPU encode vs CPU encode, byte for byte, on many distributions and
              sizes (n = 0, 1, 7, odd, 2047..2049, 1M, 256M+ bf16, overflow, several
              rows, misaligned rows); GPU decode of CPU payloads bit-exact; corrupted
              payloads give the same decoder status on both
  4. timing   encode / decode of 64 MiB and 1 GiB (bf16, fp32; fp16 64 MiB) of fresh
              Gaussian data, next to a device-to-device copy (x ^ s) of the same bytes
              in the same run; medians of back-to-back jitted calls
  5. entropy  the entropy codec (cuda/entropy.cu): GPU vs CPU bytes and stats (bf16, fp16,
              n = 0 .. 64M+), GPU decode of whole and prefix-cut rows, statuses of
              corrupted payloads, encode/decode GB/s of 64 MiB bf16 next to a copy
  6. collectives  the five collectives x both codecs on a 1-device mesh, bit for bit
  7. ctiming  the time of one 64 MiB bf16 collective on that mesh: lax, codec="raw",
              both codecs (what a compressed call costs the GPU per call)
  8. planned  K layers of a matmul and a compressed psum_scatter, under lax, the ladder
              (jax.jit) and zipccl_jax.jit: step time, when the host's call returns, the
              overhead per call over lax, conditionals in the HLO
`--only ctiming,planned` runs a subset of phases 3-8 (after the build and tests).
The table (markdown) and all numbers (JSON) go to benchmarks/results/ (or --out),
and also to $OUT when that variable is set.

Rehearsal on a machine without a GPU (to find bugs of this script before spending
GPU minutes on them):

    python3 benchmarks/gpu_check.py --rehearse --quick --skip-build --out /tmp/rehearse

runs every phase with the CPU standing in for the GPU (JAX_PLATFORMS=cpu; the
identity phase compares CPU with CPU, so it must match trivially, but every case
and every comparison runs) and with sizes of a few MiB at most (timing: the GPU
plan's sizes / 256). Without --skip-build the build runs as above but installs
into a temporary --target with its own build directory, never into the current
environment. Reports are named gpu_check_rehearsal_*, say "rehearsal", go only to
--out (default: a new temporary directory; never benchmarks/results/ nor $OUT).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if __name__ == "__main__":
  # Run as a script: import the installed zipccl_jax (with its compiled modules), never the
  # source tree. (Imported as `benchmarks.gpu_check` by the tests, it leaves sys.path alone.)
  sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]

if __package__:
  from benchmarks.gpu_check_codec import T0, backend_name, log, phase_identity, phase_timing
  from benchmarks.gpu_check_collectives import phase_collectives, phase_ctiming, phase_planned
  from benchmarks.gpu_check_entropy import phase_entropy
else:  # run as a script: its folder is on sys.path
  from gpu_check_codec import T0, backend_name, log, phase_identity, phase_timing  # type: ignore[no-redef]
  from gpu_check_collectives import phase_collectives, phase_ctiming, phase_planned  # type: ignore[no-redef]
  from gpu_check_entropy import phase_entropy  # type: ignore[no-redef]


def run_capture(cmd: list[str], timeout: int, **kw) -> tuple[int, str]:
  """(exit status, stdout + stderr) of cmd; -1 and the output so far on a timeout."""
  try:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    return r.returncode, r.stdout + r.stderr
  except subprocess.TimeoutExpired as e:
    # TimeoutExpired carries bytes whatever text=True says (str() of them would give "b'...'").
    parts = [x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x]
    return -1, "".join(parts) + f"\n[timed out after {timeout}s]\n"


# ---- phase 1: build ----------------------------------------------------------------------

def _load_ptxas():
  """tests/ptxas.py (the ptxas -v parser the CUDA build test uses), loaded by path:
  this script keeps the source tree off sys.path."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("zipccl_tests_ptxas", ROOT / "tests" / "ptxas.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


parse_ptxas = _load_ptxas().parse_ptxas


def find_nvcc() -> str | None:
  cands = [shutil.which("nvcc")]
  for env in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
    v = os.environ.get(env)
    if v:
      cands += [v, os.path.join(v, "bin", "nvcc")]
  cands += sorted(Path("/usr/local").glob("cuda*/bin/nvcc"), reverse=True)
  for c in cands:
    if c and os.path.isfile(c) and os.access(c, os.X_OK):
      return str(c)
  return None


def phase_build(args) -> dict:
  nvcc = find_nvcc()
  if nvcc is None:
    log("BUILD: no nvcc found (PATH, $CUDACXX, $CUDA_HOME, /usr/local/cuda*): cannot build the CUDA module")
    return {"ok": False, "error": "nvcc not found"}
  ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
  log(f"BUILD: nvcc {nvcc} ({ver[-1] if ver else '?'}); architectures {args.archs}")
  env = dict(os.environ, ZIPCCL_CUDA="ON", CUDACXX=nvcc)
  cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-v",
         "-C", "cmake.define.ZIPCCL_PTXAS_VERBOSE=ON",
         "-C", f"cmake.define.ZIPCCL_CUDA_ARCHITECTURES={args.archs}",
         "-C", "build.verbose=true", "."]
  with tempfile.TemporaryDirectory(prefix="gpu_check_build_") as tmp:
    if args.rehearse:
      # The same build, but installed into a throw-away --target with its own build directory: the
      # rehearsal must not replace the (editable) package of the environment it runs in, nor reconfigure
      # the build/ directory that package uses. The phases after it import the environment's package.
      cmd[-1:] = ["-C", f"build-dir={tmp}/build", "--target", f"{tmp}/site", "."]
    log("BUILD: " + " ".join(cmd))
    t = time.time()
    rc, out = run_capture(cmd, args.build_timeout, cwd=ROOT, env=env)
    if rc != 0 and "externally-managed-environment" in out:
      log("BUILD: externally managed Python: retrying with --break-system-packages")
      rc, out = run_capture(cmd[:-1] + ["--break-system-packages", "."], args.build_timeout, cwd=ROOT, env=env)
  (args.out / "gpu_check_build.log").write_text(out)
  usage = parse_ptxas(out)
  log(f"BUILD: pip exit {rc} after {time.time() - t:.0f}s (log: {args.out / 'gpu_check_build.log'})")
  if rc != 0:
    print("\n".join(out.splitlines()[-60:]), flush=True)
  for name, u in sorted(usage.items()):
    log(f"  ptxas {name:30s} regs {u.get('registers', '?'):>3} smem {u.get('smem', '?'):>6} "
        f"stack {u.get('stack', '?')} spill st/ld {u.get('spill_stores', '?')}/{u.get('spill_loads', '?')}")
  clean = bool(usage) and all(u.get("stack") == 0 and u.get("spill_stores") == 0 and u.get("spill_loads") == 0
                              for u in usage.values())
  log(f"BUILD: ptxas: {'no spills, no stack' if clean else 'SPILLS OR STACK (or no report)'}")
  return {"ok": rc == 0, "seconds": time.time() - t, "ptxas": usage, "ptxas_clean": clean, "nvcc": nvcc}


def sub_python(code: str, timeout: int = 120) -> tuple[int, str]:
  with tempfile.TemporaryDirectory() as d:
    return run_capture([sys.executable, "-c", code], timeout, cwd=d)


# ---- phase 2: tests -----------------------------------------------------------------------


def phase_tests(args) -> dict:
  src = ROOT / "tests" / "test_window.py"
  if not src.exists():
    log("TESTS: tests/test_window.py not found, skipped")
    return {"ok": None, "skipped": True}
  with tempfile.TemporaryDirectory() as d:
    shutil.copytree(ROOT / "tests", Path(d) / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    # the window codec's tests, its malformed payloads included (test_window_malformed.py)
    files = ["tests/test_window.py"] + (["tests/test_window_malformed.py"]
                                        if (ROOT / "tests" / "test_window_malformed.py").exists() else [])
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files]
    log(f"TESTS: {' '.join(cmd)} (in a copy of tests/, default backend = {backend_name(args)})")
    t = time.time()
    rc, out = run_capture(cmd, args.test_timeout, cwd=d)
  tail = "\n".join(out.strip().splitlines()[-25:])
  print(tail, flush=True)
  summary = out.strip().splitlines()[-1] if out.strip() else ""
  log(f"TESTS: exit {rc} after {time.time() - t:.0f}s: {summary}")
  return {"ok": rc == 0, "exit": rc, "summary": summary, "tail": tail}


# ---- driver --------------------------------------------------------------------------------------

PHASES = {"identity": phase_identity, "timing": phase_timing, "entropy": phase_entropy,
          "collectives": phase_collectives, "ctiming": phase_ctiming, "planned": phase_planned}


def run_phase_subprocess(name: str, args, timeout: int) -> dict:
  with tempfile.TemporaryDirectory() as d:
    res_file = Path(d) / "res.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", name, "--phase-result", str(res_file),
           "--out", str(args.out)] + (["--quick"] if args.quick else []) + (["--rehearse"] if args.rehearse else [])
    log(f"{name.upper()}: running in a subprocess (timeout {timeout}s)")
    try:
      r = subprocess.run(cmd, cwd=d, timeout=timeout, env=dict(os.environ, ZIPCCL_GPU_CHECK_T0=repr(T0)))
      rc = r.returncode
    except subprocess.TimeoutExpired:
      rc = -1
      log(f"{name.upper()}: TIMED OUT after {timeout}s")
    if res_file.exists():
      out = json.loads(res_file.read_text())
    else:
      out = {"ok": False, "error": f"phase process exited {rc} without a result (crash? see output above)"}
    out["exit"] = rc
    return out


def device_info(args) -> dict:
  info = {"host": platform.node(), "python": sys.version.split()[0]}
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.memory",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    info["nvidia_smi"] = (smi.stdout or smi.stderr).strip()  # stderr says why when it fails
  except Exception as e:  # noqa: BLE001
    info["nvidia_smi"] = f"unavailable: {e}"
  plat = "cpu" if args.rehearse else "gpu"  # the device that plays the GPU's part
  code = (f"import jax, json; d=[x for x in jax.devices() if x.platform=={plat!r}]; "
          "print(json.dumps({'jax': jax.__version__, 'device': d[0].device_kind if d else None}))")
  rc, out = sub_python(code)
  try:
    info.update(json.loads(out.strip().splitlines()[-1]))
  except Exception:  # noqa: BLE001
    info["jax_error"] = out[-500:]
  return info


def write_report(args, report: dict) -> None:
  stamp = report["date"].replace(":", "").replace("-", "")[:15]
  dev = report["device"].get("device") or report["device"].get("nvidia_smi", "?")
  gpu = backend_name(args)
  if args.rehearse:  # nobody may mistake these numbers for GPU numbers
    stamp = f"rehearsal_{stamp}"
    lines = [f"# zipccl CUDA codec: CPU rehearsal of the GPU check ({report['date']})", "",
             "**Rehearsal: the CPU stands in for the GPU and sizes are shrunk. No GPU was used; "
             "these are not GPU results.**", "", f"- device: {dev} (CPU)"]
  else:
    lines = [f"# zipccl CUDA codec: GPU check ({report['date']})", "", f"- device: {dev}"]
  lines += [f"- nvidia-smi: {report['device'].get('nvidia_smi', '?')}",
            f"- jax {report['device'].get('jax', '?')}, python {report['device'].get('python', '?')}",
            f"- mode: {report['mode']}; git {report.get('git', '?')}", ""]
  b = report.get("build", {})
  if b.get("ptxas"):
    lines += ["## ptxas (-Xptxas -v)", "", "| kernel | registers | smem | stack | spill st/ld |", "|---|---|---|---|---|"]
    for k, u in sorted(b["ptxas"].items()):
      lines.append(f"| {k} | {u.get('registers')} | {u.get('smem', '')} | {u.get('stack')} | "
                   f"{u.get('spill_stores')}/{u.get('spill_loads')} |")
    lines.append("")
  t = report.get("tests", {})
  lines += ["## Checks", "", f"- build: {'ok' if b.get('ok') else 'FAILED' if b else 'skipped'}",
            f"- tests/test_window.py on the {gpu} backend: {t.get('summary', 'skipped')}"]
  ident = report.get("identity", {})
  if ident:
    n_cases = len(ident.get("cases", []))
    lines.append(f"- bit identity {gpu} vs CPU: {n_cases - ident.get('failures', 0)}/{n_cases} cases identical"
                 + ("" if ident.get("ok") else f" ({ident.get('error', 'see JSON')})"))
    for c in ident.get("corrupt", []):
      lines.append(f"- corrupted payloads {c['dtype']}: {c['count']} cases, same status on {gpu} and CPU: "
                   f"{'yes' if c['ok'] else 'NO'} (CPU statuses {c['cpu_status_hist']})")
  tim = report.get("timing", {})
  if tim.get("rows"):
    lines += ["", "## Throughput" + (" (CPU rehearsal, tiny sizes: not GPU numbers)" if args.rehearse else ""),
              "", f"Method: {tim.get('method')}.", "",
              "| size | dtype | op | G | time (us) | GB/s of input | moved GB/s | copy GB/s | roofline share | "
              "bit-identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in tim["rows"]:
      lines.append(f"| {r['size']} | {r['dtype']} | {r['op']} | {r.get('groups', '')} | {r['time_us']:.1f} | "
                   f"{r['gbps_input']:.0f} | "
                   f"{r['gbps_moved']:.0f} | {r['copy_gbps']:.0f} | {r['roofline_share']:.2f} | "
                   f"{'yes' if r['bit_identical'] else 'NO'} |")
    lines += ["", "roofline share = (input + payload bytes) / time, divided by the copy's (read + write) "
              "bandwidth measured in the same run. G = 8-element groups per thread of the tile kernels "
              "(set_tile_groups / ZIPCCL_CUDA_GROUPS; without them 4 for 16-bit dtypes, 2 for fp32: "
              "cuda/window.cu groups_per_thread)."]
  elif tim:
    lines += ["", f"Timing failed: {tim.get('error', '?')}"]
  en = report.get("entropy", {})
  if en:
    n_cases = len(en.get("cases", []))
    lines += ["", "## Entropy codec (cuda/entropy.cu)", "",
              f"- bit identity {gpu} vs CPU: {n_cases - en.get('failures', 0)}/{n_cases} cases identical"
              + ("" if en.get("ok") else f" ({en.get('error', 'see JSON')})")]
    for c in en.get("corrupt", []):
      lines.append(f"- corrupted payloads {c['dtype']}: {c['count']} cases, same status on {gpu} and CPU: "
                   f"{'yes' if c['ok'] else 'NO'} (CPU statuses {c['cpu_status_hist']})")
    if en.get("rows"):
      lines += ["", "| dtype | data | op | n | time (us) | GB/s of input | copy GB/s | ratio | bit-identical |",
                "|---|---|---|---|---|---|---|---|---|"]
      for r in en["rows"]:
        lines.append(f"| {r['dtype']} | {r.get('data', 'gauss')} | {r['op']} | {r['n']} | {r['time_us']:.1f} | "
                     f"{r['gbps_input']:.1f} | "
                     f"{r['copy_gbps']:.0f} | {r['ratio']:.3f} | {'yes' if r['bit_identical'] else 'NO'} |")
      lines += ["", "Before the restructuring of cuda/entropy.cu (H200, gpu_check_20261130T172752): bf16 Gaussian "
                "64 MiB encode 29.0 GB/s, decode 102 GB/s; 1 GiB 30.8 / 113.6; fp16 64 MiB 49 / 128."]
  co = report.get("collectives", {})
  if co:
    n_cases = len(co.get("cases", []))
    lines += ["", "## Collectives on a 1-device mesh of the " + gpu, "",
              f"- {n_cases - co.get('failures', 0)}/{n_cases} cases bit-identical to lax"
              + ("" if co.get("ok") else f" ({co.get('error', 'see JSON')})")]
    for c in co.get("cases", []):
      if not c["ok"]:
        lines.append(f"  - FAIL {' '.join(c['case'])}: {c['detail']}")
  ct = report.get("ctiming", {})
  if ct.get("rows"):
    lines += ["", "## One collective on a 1-device mesh of the " + gpu + " (time per call)", "",
              f"Method: {ct.get('method')}; policy=\"always\". Nothing crosses a link: the time over lax's "
              "is the compressed transport's own cost per call (codec kernels, agreement, slot switch, copies).",
              "", "| collective | lax us | raw transport us | zipccl us | entropy us | zipccl - lax us | "
              "entropy - lax us | bit-identical |", "|---|---|---|---|---|---|---|---|"]
    for r in ct["rows"]:
      t = {k: r[k]["time_us"] for k in ("lax", "raw", "zipccl", "entropy")}
      ok = all(r[k]["bit_identical"] for k in t)
      lines.append(f"| {r['collective']} | {t['lax']:.1f} | {t['raw']:.1f} | {t['zipccl']:.1f} | "
                   f"{t['entropy']:.1f} | {t['zipccl'] - t['lax']:.1f} | {t['entropy'] - t['lax']:.1f} | "
                   f"{'yes' if ok else 'NO'} |")
  elif ct:
    lines += ["", f"Collective timing failed: {ct.get('error', '?')}"]
  pl = report.get("planned", {})
  if pl.get("rows"):
    lines += ["", "## Planned vs ladder between matmuls on the " + gpu, "",
              f"Method: {pl.get('method')}. The host returns from a ladder step only once the device "
              "reached its last conditional (XLA:GPU reads a branch index on the host); a planned step "
              "returns after its validation.", "",
              "| variant | step us | call returns after us | us per call over lax | conditionals | "
              "bit-identical |", "|---|---|---|---|---|---|"]
    for name, r in pl["rows"].items():
      lines.append(f"| {name} | {r['step_us']:.1f} | {r['return_us']:.1f} | {r['per_call_over_lax_us']:+.1f} | "
                   f"{r['conditionals']} | {'yes' if r['bit_identical'] else 'NO'} |")
  elif pl:
    lines += ["", f"Planned vs ladder failed: {pl.get('error', '?')}"]
  md = "\n".join(lines) + "\n"
  print("\n" + md, flush=True)
  dests = [args.out]
  if os.environ.get("OUT") and not args.rehearse:  # a rehearsal writes to --out only
    dests.append(Path(os.environ["OUT"]))
  for d in dests:
    try:
      d.mkdir(parents=True, exist_ok=True)
      (d / f"gpu_check_{stamp}.md").write_text(md)
      (d / f"gpu_check_{stamp}.json").write_text(json.dumps(report, indent=1, default=str))
      if d != args.out and (args.out / "gpu_check_build.log").exists():
        shutil.copy(args.out / "gpu_check_build.log", d / "gpu_check_build.log")
      log(f"report written to {d / f'gpu_check_{stamp}.md'} (+ .json)")
    except OSError as e:
      log(f"could not write to {d}: {e}")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="fewer identity cases and timing sizes")
  ap.add_argument("--skip-build", action="store_true", help="use the installed zipccl_jax as is")
  ap.add_argument("--skip-tests", action="store_true", help="do not run tests/test_window*.py")
  ap.add_argument("--out", type=Path, help="results directory (default: benchmarks/results/; with --rehearse "
                  "a new temporary directory)")
  ap.add_argument("--archs", default="90", help="ZIPCCL_CUDA_ARCHITECTURES for the build (default 90: H100/H200)")
  ap.add_argument("--build-timeout", type=int, default=300)
  ap.add_argument("--test-timeout", type=int, default=180)
  ap.add_argument("--rehearse", action="store_true",
                  help="dry run without a GPU: the CPU stands in for the GPU, sizes of a few MiB, the build (if "
                  "not skipped) into a temporary directory, reports named gpu_check_rehearsal_* to --out only")
  ap.add_argument("--only", default=None,
                  help=f"comma-separated GPU phases to run (default: all of {', '.join(PHASES)})")
  ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
  ap.add_argument("--phase-result", type=Path, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.rehearse:
    if args.out is None:
      args.out = Path(tempfile.mkdtemp(prefix="gpu_check_rehearse_"))
    elif args.out.resolve().is_relative_to(RESULTS.resolve()):
      ap.error("--rehearse writes CPU numbers: --out must not be benchmarks/results/")
    # Every process of the rehearsal (tests, phases, device query) sees the CPU backend only, also on a
    # machine that has a GPU.
    os.environ["JAX_PLATFORMS"] = "cpu"
  args.out = (args.out or RESULTS).resolve()
  args.out.mkdir(parents=True, exist_ok=True)
  only = list(PHASES) if args.only is None else [p.strip() for p in args.only.split(",") if p.strip()]
  if not only or any(p not in PHASES for p in only):
    ap.error(f"--only: choose from {', '.join(PHASES)}, got {args.only!r}")

  if args.phase:  # child process: one GPU phase
    try:
      res = PHASES[args.phase](args)
    except Exception as e:  # noqa: BLE001
      traceback.print_exc()
      res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    args.phase_result.write_text(json.dumps(res, default=str))
    return 0

  report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "rehearsal": args.rehearse,
            "mode": ("rehearsal on the CPU, " if args.rehearse else "") + ("quick" if args.quick else "full")}
  if args.rehearse:
    log(f"REHEARSAL: the CPU stands in for the GPU, sizes shrunk; results go to {args.out}")
  try:
    report["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                   text=True).stdout.strip() or "?"
  except OSError:
    report["git"] = "?"
  if not args.skip_build:
    report["build"] = phase_build(args)
  report["device"] = device_info(args)
  log(f"DEVICE: {report['device']}")
  rc, out = sub_python("import zipccl_jax as z; print('has_cuda_support', z.has_cuda_support())")
  log(f"IMPORT: {out.strip().splitlines()[-1] if out.strip() else out}")
  if not args.skip_tests:
    report["tests"] = phase_tests(args)
  timeouts = {"identity": 600 if not args.quick else 300, "timing": 300,
              "entropy": 600 if not args.quick else 300, "collectives": 300, "ctiming": 300,
              "planned": 300}
  for name in only:
    report[name] = run_phase_subprocess(name, args, timeout=timeouts[name])
  write_report(args, report)
  # A phase that ran must have passed (tests: ok is None when tests/test_window.py is missing).
  ok = (report.get("build", {}).get("ok", True) and report.get("tests", {}).get("ok") is not False
        and all(report[name].get("ok") for name in only))
  log(f"DONE in {time.time() - T0:.0f}s: {'all checks passed' if ok else 'SOME CHECKS FAILED'}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
