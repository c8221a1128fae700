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
`--only ctiming,timing` runs a subset of phases 3-7 (after the build and tests).
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
import itertools
import json
import os
import platform
import shutil
import statistics
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

# A phase subprocess gets the driver's start time (run_phase_subprocess), so the log has one timeline.
T0 = float(os.environ.get("ZIPCCL_GPU_CHECK_T0") or time.time())


def log(msg: str) -> None:
  print(f"[gpu_check +{time.time() - T0:6.1f}s] {msg}", flush=True)


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


# ---- shared helpers for the GPU phases ------------------------------------------------------


def backend_name(args) -> str:
  """What plays the GPU's part, for logs and the report."""
  return "CPU (rehearsal stand-in for the GPU)" if args.rehearse else "GPU"


def setup_jax(args):
  import jax
  import zipccl_jax as zc
  if args.rehearse:  # the CPU device plays the GPU's part: CPU vs CPU, every code path, no GPU needed
    return jax, zc, jax.devices("cpu")[0], jax.devices("cpu")[0]
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if not gpus:
    raise RuntimeError(f"no GPU device visible to jax: {jax.devices()}")
  if not zc.has_cuda_support():
    raise RuntimeError("zipccl_jax.has_cuda_support() is False: the CUDA module is not installed")
  return jax, zc, gpus[0], jax.devices("cpu")[0]


def make(dist: str, n: int, dtype, seed: int):
  import numpy as np
  rng = np.random.default_rng(seed)
  dtype = np.dtype(dtype)
  word = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
  if dist == "gauss":
    x = rng.standard_normal(n) * 0.02
  elif dist == "laplace":
    x = rng.laplace(size=n)
  elif dist == "zeros":
    x = np.zeros(n)
  elif dist == "bits":
    return rng.integers(0, 2**(8 * dtype.itemsize), n, dtype=np.uint64).astype(word).view(dtype)
  elif dist == "relu":
    x = np.maximum(rng.standard_normal(n), 0)
  # Zeros for the entropy codec's kind Z (format v3: the raw bits of +-0 elided when a
  # 4096-element block has no subnormal).
  elif dist == "relu_pm":  # half +-0 with balanced signs
    g = rng.standard_normal(n)
    x = np.where(rng.random(n) < 0.5, np.where(rng.random(n) < 0.5, -0.0, 0.0), g)
  elif dist == "negzeros":  # all -0: CONST-Z blocks
    x = np.full(n, -0.0)
  elif dist == "sparse":  # 95% +0
    x = np.where(rng.random(n) < 0.95, 0.0, rng.standard_normal(n))
  elif dist in ("zerosub", "zerosub9", "blockmix"):
    # zerosub: ReLU with a subnormal per ~1000 elements (no block Z-valid); zerosub9: the same with
    # subnormals whose top mantissa bit is set (entropy format v4, fp16: coded exponent 1, so the
    # elements of coded exponent 0 are exactly the zeros, yet no block is Z-valid); blockmix:
    # 4096-element blocks of +0, ReLU, Gaussian, -0 and ReLU with one subnormal, in turn.
    i = np.arange(n)
    g = rng.standard_normal(n)
    c = (i // 4096) % 5 if dist == "blockmix" else np.full(n, 4)
    x = np.select([c == 0, c == 1, c == 2, c == 3], [0.0, np.maximum(g, 0), g, -0.0], np.maximum(g, 0))
    w = x.astype(dtype).view(word).copy()
    sub = (rng.random(n) < 0.001) if dist != "blockmix" else ((c == 4) & (i % 4096 == 77))
    mbits = 10 if dtype == np.float16 else 7
    w[sub] = (1 << (mbits - 1)) | 1 if dist == "zerosub9" else 1  # else the smallest positive subnormal
    return w.view(dtype)
  elif dist in ("binade", "halfbinade"):
    # +-[1, 2) and +-[1, 1.5): one exponent, the top mantissa bit uniform or always 0 (entropy
    # format v4, fp16: two coded exponents (HUFF blocks) or one (CONST blocks with raw planes))
    x = np.where(rng.random(n) < 0.5, -1.0, 1.0) * (1 + rng.random(n) * (1.0 if dist == "binade" else 0.5))
  elif dist == "gelu":  # one-signed-ish activations: the entropy codec's joint (sign, exponent) kind
    g = rng.standard_normal(n)
    x = 0.5 * g * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g**3)))
  elif dist == "outlier":  # one huge value in some blocks
    x = rng.standard_normal(n)
    x[1000::2048 * 3] = 6e4 if dtype == np.float16 else 1e30
  elif dist == "specials":
    bits = {np.dtype("float16"): (5, 10), np.dtype("float32"): (8, 23)}.get(dtype, (8, 7))
    ebits, mbits = bits
    expo = ((1 << ebits) - 1) << mbits
    sign = 1 << (8 * dtype.itemsize - 1)
    pats = np.array([0, sign, expo, expo | sign, expo | 1, expo | (1 << (mbits - 1)) | 5, expo | sign | 3,
                     1, sign | 1, (1 << mbits) - 1, (1 << mbits) | 1, sign | ((1 << mbits) - 1)], dtype=np.uint64)
    w = (rng.standard_normal(n).astype(dtype)).view(word).copy()
    pick = rng.random(n) < 0.3
    w[pick] = pats[rng.integers(0, len(pats), int(pick.sum()))].astype(word)
    return w.view(dtype)
  else:
    raise ValueError(dist)
  return x.astype(dtype)


def sections(dtype, n: int, nbytes: int) -> list[tuple[str, int, int]]:
  """The row's sections (format v4) in a row of nbytes bytes: the escape section runs to the end;
  "planes" includes the plane section's padding (its end is the library's min_nbytes)."""
  import numpy as np
  import zipccl_jax as zc
  rb = 3 if np.dtype(dtype).itemsize == 4 else 1
  al = lambda v: -(-v // 128) * 128  # noqa: E731
  nb = -(-n // 2048)
  t0 = 128
  r0 = t0 + al(8 * nb)
  p0 = r0 + al(rb * n)
  e0 = zc.codecs.get("zipccl").min_nbytes(dtype, n)
  return [("header", 0, 128), ("table", t0, r0), ("raw", r0, p0), ("planes", p0, e0), ("escapes", e0, max(nbytes, e0))]


def describe_diff(a, b, dtype, n) -> str:
  import numpy as np
  if a.shape != b.shape:
    return f"shape {a.shape} vs {b.shape}"
  diff = np.flatnonzero(a.reshape(a.shape[0], -1) != b.reshape(b.shape[0], -1))
  if not diff.size:
    return "identical"
  nbytes = a.shape[-1]
  parts = []
  for name, lo, hi in sections(dtype, n, nbytes):
    cols = diff % nbytes
    k = int(((cols >= lo) & (cols < hi)).sum())
    if k:
      parts.append(f"{name}: {k}")
  i = int(diff[0])
  r, c = divmod(i, nbytes)
  return (f"{diff.size} bytes differ ({', '.join(parts)}); first at row {r} byte {c}: "
          f"gpu {a.reshape(-1)[i]:#04x} cpu {b.reshape(-1)[i]:#04x}")


def checksum_np(buf):
  """Format v2 checksum of the bytes given (a row's first used_nbytes; numpy, for re-sealing
  corrupted payloads): bytes 24..31 read as zero."""
  import numpy as np
  b = buf.copy()
  b[24:32] = 0
  w = b.view("<u4").astype(np.uint64)
  j = np.arange(w.size, dtype=np.uint64)
  with np.errstate(over="ignore"):
    return int(np.sum(w * (2 * j + 1), dtype=np.uint64))


# ---- phase 3: identity ------------------------------------------------------------------------


def compare_case(x, pg, sg, pc, sc, yg, stg, stc, dtype, n) -> tuple[bool, bool, str]:
  """(encode identical, decode ok, what differs) for one identity case: the GPU's payload and stats
  (pg, sg) against the CPU's (pc, sc), and the GPU's decode (yg, stg) of the CPU payload against the
  CPU decoder's status stc and the input x (rows that fail must be all-one bits). A function of its
  own so that the mismatch reports, which a CPU-vs-CPU rehearsal never reaches, can be tested
  (tests/test_gpu_check.py)."""
  import numpy as np
  word = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
  enc_ok = pg.shape == pc.shape and bool((pg == pc).all()) and bool((sg == sc).all())
  msg = "" if enc_ok else ("payload " + describe_diff(pg, pc, dtype, n) +
                           ("" if (sg == sc).all() else f"; stats gpu {sg.tolist()} cpu {sc.tolist()}"))
  dec_ok = bool((stg == stc).all())
  if not dec_ok:
    msg += f" decode status gpu {stg.tolist()} cpu {stc.tolist()}"
  good = stc == 0
  if good.any():
    same = (yg[good].view(word) == x[good].view(word))
    if not same.all():
      dec_ok = False
      i = int(np.flatnonzero(~same.reshape(-1))[0])
      msg += (f" decoded values differ at {i}: {yg[good].view(word).reshape(-1)[i]:#x} != "
              f"{x[good].view(word).reshape(-1)[i]:#x}")
  if (~good).any() and not (yg[~good].view(word) == np.iinfo(word).max).all():
    dec_ok = False
    msg += " a row that failed to decode is not all-one bits"
  return enc_ok, dec_ok, msg


def corrupt_summary(dtype_name: str, sg, scc, same) -> dict:
  """Logs and summarises one batch of corrupted payloads: `same` says per payload whether the GPU
  agreed with the CPU (sg, scc: their decoder statuses)."""
  import numpy as np
  hist = {int(k): int(v) for k, v in zip(*np.unique(scc, return_counts=True))}
  ok = bool(same.all())
  bad = np.flatnonzero(~same)[:8].tolist()
  log(f"  {'ok  ' if ok else 'FAIL'} {dtype_name}: {len(same)} corrupted payloads, CPU statuses {hist}"
      + ("" if ok else f"; mismatches at {bad}: gpu {sg[bad].tolist()} cpu {scc[bad].tolist()}"))
  return {"dtype": dtype_name, "count": int(len(same)), "ok": ok, "cpu_status_hist": hist}


def time_calls(jax, fn, args, reps: int, rounds: int) -> tuple[float, float]:
  """(median, min) seconds per call of fn(*args) over `rounds` rounds of `reps` back-to-back calls,
  after one warm-up call (compilation)."""
  out = fn(*args)
  jax.block_until_ready(out)
  times = []
  for _ in range(rounds):
    t = time.perf_counter()
    for _ in range(reps):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t) / reps)
  del out
  return statistics.median(times), min(times)


def phase_identity(args) -> dict:
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, cpu = setup_jax(args)
  import zipccl_jax as zcodec
  bf16, f16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
  dtypes = [bf16, f16, f32]
  enc_fn, dec_fn = {}, {}
  # GPU calls take the tile-kernel variants in turn (set_tile_groups), so every
  # variant meets the cases and decodes payloads another variant encoded. The
  # choice is read when XLA runs (or captures) the call: one jitted function per
  # variant.
  variants, variant_calls = itertools.cycle(GROUP_VARIANTS), {g: 0 for g in GROUP_VARIANTS}

  def variant(dev) -> int:
    if dev is not gpu:  # (in a rehearsal the CPU is both, and every call rotates)
      return 0
    g = next(variants)
    set_tile_groups(g)
    variant_calls[g] += 1
    return g

  def encode(dev, x2d):
    key = (x2d.shape, x2d.dtype, variant(dev))
    if key not in enc_fn:
      enc_fn[key] = jax.jit(zcodec.encode_rows)
    p, s = enc_fn[key](jax.device_put(x2d, dev))
    return np.asarray(p), np.asarray(s)

  def decode(dev, p2d, n, dtype):
    key = (p2d.shape, n, dtype, variant(dev))
    if key not in dec_fn:
      dec_fn[key] = jax.jit(lambda q: zcodec.decode_rows(q, n, dtype))
    y, s = dec_fn[key](jax.device_put(p2d, dev))
    return np.asarray(y), np.asarray(s)

  results, failures = [], 0

  def case(dtype, dist, n, rows=1, seed=0):
    nonlocal failures
    t = time.time()
    name = f"{np.dtype(dtype).name:8s} {dist:8s} rows={rows} n={n}"
    if rows * n >= (1 << 20):  # announce big cases (the last line names a case that crashed)
      print(f"  ...  {name}", flush=True)
    x = make(dist, rows * n, dtype, seed).reshape(rows, n)
    pg, sg = encode(gpu, x)
    pc, sc = encode(cpu, x)
    yg, stg = decode(gpu, pc, n, dtype)
    _, stc = decode(cpu, pc, n, dtype)
    enc_ok, dec_ok, msg = compare_case(x, pg, sg, pc, sc, yg, stg, stc, dtype, n)
    # Prefix decoding: the rows cut to the largest used size (rows that do not fit: 4).
    cut = min(int(sc[:, 2].max(initial=0)) * 128, pc.shape[1]) if rows else 0
    yg2, stg2 = decode(gpu, pc[:, :cut], n, dtype)
    _, stc2 = decode(cpu, pc[:, :cut], n, dtype)
    _, dec2_ok, msg2 = compare_case(x, pc, sc, pc, sc, yg2, stg2, stc2, dtype, n)
    dec_ok = dec_ok and dec2_ok
    msg += (" prefix:" + msg2) if msg2 else ""
    ok = enc_ok and dec_ok
    failures += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {name} status={sc[:, 0].tolist()[:4]} "
          f"esc={sc[:, 1].tolist()[:4]} ({time.time() - t:.1f}s) {msg}", flush=True)
    results.append({"case": name.split(), "ok": ok, "encode_identical": enc_ok, "decode_ok": dec_ok, "detail": msg})

  log("IDENTITY: GPU encode vs CPU encode (bytes + stats), GPU decode of CPU payloads")
  sizes = [0, 1, 7, 8, 1001, 2047, 2048, 2049, 4097, 100003, 1 << 20]
  for dt in dtypes:
    for n in sizes:
      case(dt, "gauss", n)
    for dist in ["laplace", "zeros", "bits", "relu", "outlier", "specials"]:
      for n in ([2049, 300001] if not args.quick else [4099]):
        case(dt, dist, n, seed=n)
    case(dt, "bits", 50000)            # does not fit (random bits)
    case(dt, "gauss", 0, rows=2)       # n = 0
    case(dt, "gauss", 2049, rows=3)    # several rows, misaligned (odd n)
    case(dt, "outlier", 7, rows=5)     # tiny misaligned rows
    case(dt, "bits", 3001, rows=4)     # rows that do not fit, several at once
  # Large cases. A rehearsal caps them at 1M elements (4 MiB of fp32), same odd tails, same overflow.
  big = (lambda v: min(v, 1 << 20)) if args.rehearse else (lambda v: v)  # noqa: E731
  if not args.quick:
    case(f16, "gauss", 1 << 20, rows=2)
    case(f32, "laplace", big(1 << 22) + 5)
  case(bf16, "gauss", big(1 << 28) + 3)   # 256M+ elements
  if not args.quick:
    case(bf16, "bits", big(1 << 24) + 1)  # 16M random bits: does not fit, at scale

  log("IDENTITY: corrupted payloads (GPU status == CPU status)")
  corrupt = []
  for dt in dtypes:
    n = 50001
    x = make("gauss", n, dt, 7).reshape(1, n)
    pc, sc = encode(cpu, x)
    row = pc[0]
    used = int(sc[0, 2]) * 128
    secs = {k: (lo, hi) for k, lo, hi in sections(dt, n, used)}
    nb = -(-n // 2048)
    esc_used = int(sc[0, 1])
    muts = []

    def reseal(b):
      b[24:32] = np.frombuffer(np.uint64(checksum_np(b[:used])).tobytes(), np.uint8)
      return b

    def flip(pos, bit=0, reseal_=False):
      b = row.copy()
      b[pos] ^= np.uint8(1 << bit)
      return reseal(b) if reseal_ else b

    def setbytes(pos, vals, reseal_=True):
      b = row.copy()
      b[pos:pos + len(vals)] = np.array(vals, np.uint8)
      return reseal(b) if reseal_ else b

    for pos in [0, 3, 4, 5, 6, 7, 8, 16, 24, 32, 33, 40, 47, 48, 100, 127]:
      muts += [flip(pos), flip(pos, 1, reseal_=True)]
    muts += [setbytes(7, [1]), setbytes(7, [2]), setbytes(40, list(np.uint64(esc_used - 1).tobytes())),
             setbytes(48, list(np.uint64(esc_used + 1).tobytes())),
             setbytes(16, list(np.uint64(used + 128).tobytes())), setbytes(16, list(np.uint64(2**64 - 128).tobytes()))]
    t0, _ = secs["table"]
    for b in [0, nb // 2, nb - 1]:
      for off, bit in [(0, 0), (4, 0), (4, 3), (5, 2), (6, 0), (6, 7), (7, 0), (7, 1)]:
        muts += [flip(t0 + 8 * b + off, bit), flip(t0 + 8 * b + off, bit, reseal_=True)]
    t1 = secs["table"][1]
    if t0 + 8 * nb < t1:
      muts += [flip(t0 + 8 * nb, 0), flip(t1 - 1, 4, reseal_=True)]
    for name in ["raw", "planes", "escapes"]:
      lo, hi = secs[name]
      rng = np.random.default_rng(sum(map(ord, name)))
      for _ in range(6):
        p = int(rng.integers(lo, hi))
        muts += [flip(p, int(rng.integers(8))), flip(p, int(rng.integers(8)), reseal_=True)]
    pl0, pl1 = secs["planes"]
    muts += [flip(pl1 - 1, 7, reseal_=True), flip(pl1 - 1, 7)]  # padding bit of the last block
    e0, e1 = secs["escapes"]
    muts += [flip(e0, 0, reseal_=True), flip(e0 + esc_used, 0), flip(e1 - 1, 0, reseal_=True)]
    muts += [setbytes(e0, [200]), flip(e1, 3), flip(len(row) - 1, 5)]  # fp16: escape > 31 (7); past used: OK
    r0, r1 = secs["raw"]
    muts += [flip(r1 - 1, 0), flip(r1 - 1, 0, reseal_=True)]  # raw padding
    batch = np.stack(muts)
    _, sg = decode(gpu, batch, n, dt)
    _, scc = decode(cpu, batch, n, dt)
    corrupt.append(corrupt_summary(np.dtype(dt).name, sg, scc, sg == scc))
    failures += not corrupt[-1]["ok"]
  log(f"IDENTITY: {len(results)} cases, {failures} failures")
  set_tile_groups(0)
  log(f"IDENTITY: GPU calls per tile-kernel variant: {variant_calls}")
  return {"ok": failures == 0, "failures": failures, "cases": results, "corrupt": corrupt,
          "variant_calls": {str(k): v for k, v in variant_calls.items()}}


# ---- phase 4: timing ---------------------------------------------------------------------------


def phase_timing(args) -> dict:
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, cpu = setup_jax(args)
  import jax.numpy as jnp
  import zipccl_jax as zcodec
  bf16, f16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
  plan = [(bf16, 64 << 20), (bf16, 1 << 30), (f32, 64 << 20)]
  if not args.quick:
    plan += [(f32, 1 << 30), (f16, 64 << 20)]
  if args.rehearse:  # the same plan 256 times smaller: 256 KiB and 4 MiB
    plan = [(dt, size >> 8) for dt, size in plan]
  reps, rounds = (10, 5) if args.quick else (20, 7)

  def bench(fn, *a):
    return time_calls(jax, fn, a, reps, rounds)

  rows, key = [], jax.random.PRNGKey(int(time.time()))
  for dt, size in plan:
    n = size // dt.itemsize
    nbytes = zc.codecs.get("zipccl").max_nbytes(dt, n)
    label = next(f"{size >> k} {u}" for k, u in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B")) if size >> k)
    log(f"TIMING: {label} {dt.name} (n = {n}), fresh Gaussian data")
    key, sub = jax.random.split(key)
    with jax.default_device(gpu):
      x = (jax.random.normal(sub, (1, n), jnp.float32) * 0.02 + 1e-3).astype(dt)  # never zero
      xb = jax.lax.bitcast_convert_type(x, jnp.uint16 if dt.itemsize == 2 else jnp.uint32)
      salt = jnp.zeros((), xb.dtype)
    x = jax.device_put(x, gpu)
    cpy = jax.jit(lambda v, s: v ^ s)
    t_copy, t_copy_min = bench(cpy, xb, salt)
    in_bytes = n * dt.itemsize
    copy_bw = 2 * in_bytes / t_copy
    pc, sc = zcodec.encode_rows(jax.device_put(x, cpu))  # the CPU codec's bytes for this data
    pc, sc = np.asarray(pc), np.asarray(sc)
    # Every variant of the tile kernels (set_tile_groups, docs/cuda.md): fresh jitted
    # functions per variant, since the handler reads the choice when XLA runs (or
    # captures into a CUDA graph) the call.
    for groups in GROUP_VARIANTS:
      set_tile_groups(groups)
      enc = jax.jit(zcodec.encode_rows)
      dec = jax.jit(lambda p: zcodec.decode_rows(p, n, dt))
      t_enc, t_enc_min = bench(enc, x)
      payload, stats = enc(x)
      t_dec, t_dec_min = bench(dec, payload)
      # Bit identity of exactly this data: GPU encode vs CPU encode, and the round trip.
      y, st = dec(payload)
      roundtrip = bool(jnp.array_equal(jax.lax.bitcast_convert_type(y, xb.dtype), xb)) and int(st[0]) == 0
      identical = bool(np.array_equal(np.asarray(payload), pc)) and bool(np.array_equal(np.asarray(stats), sc))
      esc, used = int(np.asarray(stats)[0, 1]), int(np.asarray(stats)[0, 2]) * 128
      # The encoder writes its whole max_nbytes buffer; the decoder reads the used bytes.
      for op, t, tmin, moved in [("encode", t_enc, t_enc_min, in_bytes + nbytes),
                                 ("decode", t_dec, t_dec_min, used + in_bytes)]:
        r = {"size": label, "dtype": dt.name, "op": op, "groups": groups, "n": n, "input_bytes": in_bytes,
             "payload_bytes": nbytes, "used_bytes": used, "escapes": esc, "time_us": t * 1e6, "time_min_us": tmin * 1e6,
             "gbps_input": in_bytes / t / 1e9, "gbps_moved": moved / t / 1e9, "copy_gbps": copy_bw / 1e9,
             "copy_time_us": t_copy * 1e6, "roofline_share": (moved / t) / copy_bw,
             "bit_identical": identical if op == "encode" else roundtrip}
        rows.append(r)
        log(f"  {op} G={groups}: {t * 1e6:9.1f} us  {r['gbps_input']:7.1f} GB/s of input  moved "
            f"{r['gbps_moved']:7.1f} GB/s  copy {copy_bw / 1e9:7.1f} GB/s  share {r['roofline_share']:.2f}  "
            f"bit-identical {r['bit_identical']}")
      del payload, stats, y
    set_tile_groups(0)
    del x, xb, pc, sc
  # Both checks of exactly this data count: a fast but wrong codec is not a pass.
  return {"ok": all(r["bit_identical"] for r in rows), "rows": rows,
          "method": f"median over {rounds} rounds of {reps} back-to-back jitted calls "
          "(block_until_ready after each round); copy = jitted x ^ s over the same bytes"}


# ---- phase 5: the entropy codec (cuda/entropy.cu) -------------------------------------------------


def entropy_checksum_np(b) -> int:
  """The common v2 row checksum (COMMON.md) of an entropy payload row: over [0, used_nbytes) with
  bytes 24..31 read as zero, sum_j w_j (2j + 1) mod 2^64 over its u32 words."""
  import numpy as np
  used = int.from_bytes(bytes(b[16:24]), "little")
  w = np.frombuffer(bytes(b[:used]), "<u4").astype(np.uint64)
  w[6:8] = 0
  return int((w * (2 * np.arange(w.size, dtype=np.uint64) + np.uint64(1))).sum(dtype=np.uint64))


def phase_entropy(args) -> dict:
  """The entropy codec on the GPU against the CPU codec: encode bytes and stats, GPU decode of CPU
  payloads (whole rows and rows cut to the largest used_nbytes), decoder statuses of corrupted
  payloads; then encode/decode time of 64 MiB bf16 next to a copy of the same bytes."""
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, cpu = setup_jax(args)
  import jax.numpy as jnp
  ent = zc.codecs.get("entropy")
  bf16, f16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
  fns = {}

  def enc(dev, x2d):
    key = ("enc", x2d.shape, x2d.dtype, dev.platform)
    if key not in fns:
      fns[key] = jax.jit(ent.encode_rows)
    return tuple(np.asarray(a) for a in fns[key](jax.device_put(x2d, dev)))

  def dec(dev, p2d, n, dtype):
    key = ("dec", p2d.shape, n, dtype, dev.platform)
    if key not in fns:
      fns[key] = jax.jit(lambda q: ent.decode_rows(q, n, dtype))
    return tuple(np.asarray(a) for a in fns[key](jax.device_put(p2d, dev)))

  cases, failures = [], 0

  def case(dtype, dist, n, rows=1, seed=0):
    nonlocal failures
    t = time.time()
    name = f"{np.dtype(dtype).name:8s} {dist:8s} rows={rows} n={n}"
    if rows * n >= (1 << 20):
      print(f"  ...  {name}", flush=True)
    x = make(dist, rows * n, dtype, seed).reshape(rows, n)
    xw = x.view(np.uint16)
    pg, sg = enc(gpu, x)
    pc, sc = enc(cpu, x)
    msg = []
    if not np.array_equal(pg, pc):
      bad = np.argwhere(pg != pc)
      msg.append(f"{len(bad)} payload bytes differ, first at row {bad[0][0]} byte {bad[0][1]}: "
                 f"gpu {pg[tuple(bad[0])]:#04x} cpu {pc[tuple(bad[0])]:#04x}")
    if not np.array_equal(sg, sc):
      msg.append(f"stats gpu {sg.tolist()[:3]} cpu {sc.tolist()[:3]}")
    used = int(sc[:, 2].max()) * 128 if rows else 0
    for label, p in (("full", pc), ("prefix", pc[:, :used])):
      yg, stg = dec(gpu, p, n, dtype)
      if not (stg == 0).all():
        msg.append(f"{label} decode status gpu {stg.tolist()[:4]}")
      elif not np.array_equal(yg.view(np.uint16), xw):
        i = np.argwhere(yg.view(np.uint16) != xw)[0]
        msg.append(f"{label} decode differs at {tuple(i)}: {yg.view(np.uint16)[tuple(i)]:#06x} != {xw[tuple(i)]:#06x}")
    ok = not msg
    failures += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {name} used/128={sc[:, 2].tolist()[:3]} raw_blocks={sc[:, 1].tolist()[:3]} "
          f"({time.time() - t:.1f}s) {'; '.join(msg)}", flush=True)
    cases.append({"case": name.split(), "ok": ok, "detail": "; ".join(msg)})

  log("ENTROPY: GPU encode vs CPU encode (bytes + stats), GPU decode of CPU payloads (whole and prefix)")
  for dt in (bf16, f16):
    for n in [0, 1, 7, 4095, 4096, 4097, 100003]:
      case(dt, "gauss", n, seed=n)
    for dist in ["laplace", "gelu", "relu", "zeros", "bits", "outlier", "specials",
                 "relu_pm", "negzeros", "sparse", "zerosub", "zerosub9", "blockmix", "binade", "halfbinade"]:
      case(dt, dist, 4096 * 5 + 3 if args.quick else 300001, seed=len(dist))
    case(dt, "gauss", 4097, rows=3)
    case(dt, "gelu", 7, rows=5)
  big = (lambda v: min(v, 1 << 20)) if args.rehearse else (lambda v: v)  # noqa: E731
  case(bf16, "gauss", big(1 << 26) + 3)  # 64M+ elements: 16385 blocks, long look-back chains
  if not args.quick:
    case(f16, "gelu", 1 << 20, rows=2)

  log("ENTROPY: corrupted payloads (GPU status == CPU status)")
  corrupt = []
  # Gaussian (HUFF-E blocks) and ReLU (kind Z: HUFF-Z blocks).
  for dt, dist in [(bf16, "gauss"), (f16, "gauss"), (bf16, "relu"), (f16, "relu")]:
    n = 50001
    x = make(dist, n, dt, 11).reshape(1, n)
    pc, sc = enc(cpu, x)
    used = int(sc[0, 2]) * 128
    row = pc[0, :used]
    rng = np.random.default_rng(5)
    muts = []
    for lo, hi in [(0, 56), (56, 128), (128, 256), (256, used)]:
      for k in range(24):
        b = row.copy()
        b[int(rng.integers(lo, hi))] ^= np.uint8(1 << int(rng.integers(8)))
        if k % 2 and lo >= 128:  # re-sealed: block-level statuses instead of BAD_CHECKSUM
          b[24:32] = np.frombuffer(np.uint64(entropy_checksum_np(b)).tobytes(), np.uint8)
        muts.append(b)
    for pos, val in [(7, 1), (5, 3), (6, 1), (33, 7), (100, 1)]:
      b = row.copy()
      b[pos] = val
      b[24:32] = np.frombuffer(np.uint64(entropy_checksum_np(b)).tobytes(), np.uint8)
      muts.append(b)
    batch = np.stack(muts)
    yg, sg = dec(gpu, batch, n, dt)
    yc, scc = dec(cpu, batch, n, dt)
    same = (sg == scc) & (yg.view(np.uint16) == yc.view(np.uint16)).all(axis=1)
    corrupt.append(corrupt_summary(f"{np.dtype(dt).name} {dist}", sg, scc, same))
    failures += not corrupt[-1]["ok"]

  log("ENTROPY: timing")
  rows_t = []
  reps, rounds = (10, 5) if args.quick else (20, 7)
  # Gaussian (HUFF-E blocks), GELU-like activations (one-signed-ish: HUFF-J blocks, the
  # joint kind's 512-symbol alphabet and 7-bit packed plane) and ReLU (half +0: HUFF-Z
  # blocks, the compaction and expansion of the raw planes); fp16 (format v4: 64 / 128
  # symbols, byte plane + 2 / 1 packed bits) Gaussian and ReLU.
  plan = [(bf16, 64 << 20, "gauss"), (bf16, 64 << 20, "gelu"), (bf16, 64 << 20, "relu"), (f16, 64 << 20, "gauss"),
          (f16, 64 << 20, "relu")] + ([] if args.quick else [(bf16, 1 << 30, "gauss")])
  for dt, size, dist in plan:
    size >>= 8 if args.rehearse else 0
    n = size // 2
    with jax.default_device(gpu):
      g = jax.random.normal(jax.random.PRNGKey(3), (1, n), jnp.float32)
      if dist == "gelu":
        g = 0.5 * g * (1 + jnp.tanh(0.7978845608 * (g + 0.044715 * g**3)))
      elif dist == "relu":
        g = jnp.maximum(g, 0)
      else:
        g = g * 0.02 + 1e-3
      xv = g.astype(dt)
      del g
      xb = jax.lax.bitcast_convert_type(xv, jnp.uint16)
      salt = jnp.zeros((), jnp.uint16)
    xv = jax.device_put(xv, gpu)
    encf = jax.jit(ent.encode_rows)
    decf = jax.jit(lambda q: ent.decode_rows(q, n, dt))

    def bench(fn, *a):
      return time_calls(jax, fn, a, reps, rounds)[0]

    t_copy = bench(jax.jit(lambda v, s_: v ^ s_), xb, salt)
    t_enc = bench(encf, xv)
    payload, stats = encf(xv)
    t_dec = bench(decf, payload)
    y, st = decf(payload)
    pc, sc = enc(cpu, np.asarray(xv))
    identical = bool(np.array_equal(np.asarray(payload), pc)) and bool(np.array_equal(np.asarray(stats), sc))
    roundtrip = bool(jnp.array_equal(jax.lax.bitcast_convert_type(y, jnp.uint16), xb)) and int(st[0]) == 0
    ratio = 2 * n / (int(sc[0, 2]) * 128)
    for op, t, okb in [("encode", t_enc, identical), ("decode", t_dec, roundtrip)]:
      r = {"dtype": dt.name, "data": dist, "op": op, "n": n, "input_bytes": 2 * n, "time_us": t * 1e6,
           "gbps_input": 2 * n / t / 1e9, "copy_gbps": 4 * n / t_copy / 1e9, "ratio": ratio, "bit_identical": okb}
      rows_t.append(r)
      log(f"  entropy {dt.name} {dist} {op}: {t * 1e6:9.1f} us  {r['gbps_input']:7.1f} GB/s of input  copy {r['copy_gbps']:7.1f} GB/s"
          f"  ratio {ratio:.3f}  bit-identical {okb}")
    failures += not (identical and roundtrip)
  log(f"ENTROPY: {len(cases)} cases, {failures} failures")
  return {"ok": failures == 0, "failures": failures, "cases": cases, "corrupt": corrupt, "rows": rows_t,
          "method": f"median over {rounds} rounds of {reps} back-to-back jitted calls; copy = jitted x ^ s"}


def phase_collectives(args) -> dict:
  """The five compressed collectives and a gradient, jitted inside shard_map on a 1-device mesh of the
  GPU, for both codecs: the CUDA handlers inside lax.switch branches of the slot ladder. Every result
  is compared bit for bit with the lax collective (with one participant they are identities, but the
  whole encode -> agree -> switch -> decode path runs on the GPU), and stats must report a compressed
  rung on compressible data and the raw rung on random bits."""
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, _ = setup_jax(args)
  import jax.numpy as jnp
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array([gpu]), ("x",))
  failures, cases = 0, []
  n = 1 << 20 if not args.rehearse else 1 << 14
  ops = {
      "all_gather": (lambda v, c: zc.compressed_all_gather(v, "x", codec=c, tiled=True),
                     lambda v: jax.lax.all_gather(v, "x", tiled=True)),
      "psum_scatter": (lambda v, c: zc.compressed_psum_scatter(v, "x", codec=c, tiled=True),
                       lambda v: jax.lax.psum_scatter(v, "x", tiled=True)),
      "psum": (lambda v, c: zc.compressed_psum(v, "x", codec=c), lambda v: jax.lax.psum(v, "x")),
      "all_to_all": (lambda v, c: zc.compressed_all_to_all(v, "x", 0, 0, codec=c, tiled=True),
                     lambda v: jax.lax.all_to_all(v, "x", 0, 0, tiled=True)),
      "ppermute": (lambda v, c: zc.compressed_ppermute(v, "x", [(0, 0)], codec=c),
                   lambda v: jax.lax.ppermute(v, "x", [(0, 0)])),
  }
  for dt in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)):
    for dist in ("gauss", "bits"):
      x = jax.device_put(make(dist, n, dt, 7), gpu)
      for codec in ("zipccl", "entropy"):
        if codec == "entropy" and dt == np.float32:
          continue
        for name, (f, ref) in ops.items():
          t = time.time()
          try:
            g = jax.jit(jax.shard_map(lambda v: f(v, codec), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            r = jax.jit(jax.shard_map(ref, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            got, want = np.asarray(g(x)), np.asarray(r(x))
            word = {2: np.uint16, 4: np.uint32}[dt.itemsize]
            if name in ("psum", "psum_scatter"):
              # one participant: the sum is the input. lax may flush denormals to zero and quieten
              # NaNs (XLA:CPU does), so lax's bits or the input's are right, and NaN must stay NaN
              same = ((got.view(word) == want.view(word)) | (got.view(word) == np.asarray(x).view(word))
                      | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))))
            else:  # one participant: a gather / permute returns the input's bits exactly (lax may
              # quieten NaNs on the way, so the input is the reference, not lax)
              same = got.view(word) == np.asarray(x).view(word)
            ok = got.dtype == want.dtype and got.shape == want.shape and bool(same.all())
            detail = "" if ok else f"{int((~same).sum())} words differ"
          except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
          failures += not ok
          cases.append({"case": [dt.name, dist, codec, name], "ok": ok, "detail": detail})
          print(f"  {'ok  ' if ok else 'FAIL'} {dt.name:8s} {dist:6s} {codec:8s} {name:12s} "
                f"({time.time() - t:.1f}s) {detail}", flush=True)
  # grad through a compressed psum_scatter and all_gather (FSDP's pair), bf16, both codecs
  x = jax.device_put(make("gauss", n, ml_dtypes.bfloat16, 9), gpu)
  for codec in ("zipccl", "entropy"):
    def loss(v, f):
      return jnp.sum(f(v).astype(jnp.float32) ** 2)
    fz = jax.shard_map(lambda v: jax.grad(loss)(v, lambda u: zc.compressed_all_gather(u, "x", codec=codec, tiled=True)),
                      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    fr = jax.shard_map(lambda v: jax.grad(loss)(v, lambda u: jax.lax.all_gather(u, "x", tiled=True)),
                      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    try:
      got, want = np.asarray(jax.jit(fz)(x)), np.asarray(jax.jit(fr)(x))
      ok = np.array_equal(got.view(np.uint16), want.view(np.uint16))
      detail = "" if ok else f"{int((got.view(np.uint16) != want.view(np.uint16)).sum())} words differ"
    except Exception as e:  # noqa: BLE001
      ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
    failures += not ok
    cases.append({"case": ["bfloat16", "gauss", codec, "grad(all_gather)"], "ok": ok, "detail": detail})
    print(f"  {'ok  ' if ok else 'FAIL'} bfloat16 gauss  {codec:8s} grad(all_gather) {detail}", flush=True)
  log(f"COLLECTIVES: {len(cases)} cases, {failures} failures")
  return {"ok": failures == 0, "failures": failures, "cases": cases}


# ---- phase 7: the time of one compressed collective on the GPU ----------------------------------


def phase_ctiming(args) -> dict:
  """One jitted collective of 64 MiB of Gaussian bf16 on a 1-device mesh of the GPU: lax, the raw
  transport (codec="raw") and both codecs (policy="always"), for the five collectives. With one
  participant nothing crosses a link, so the time over lax's is what a compressed call costs the GPU
  per call: the codec kernels, the size agreement, the slot switch (whose branch index XLA reads on
  the host), the slot copies. Results are checked bit for bit as in phase_collectives."""
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, _ = setup_jax(args)
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array([gpu]), ("x",))
  size = (64 << 20) >> (8 if args.rehearse else 0)
  dt = np.dtype(ml_dtypes.bfloat16)
  n = size // dt.itemsize
  reps, rounds = (10, 5) if args.quick else (20, 7)
  x = jax.device_put(make("gauss", n, dt, 11), gpu)
  xw = np.asarray(x).view(np.uint16)
  ops = {
      "all_gather": lambda v, c: (zc.compressed_all_gather(v, "x", codec=c, policy="always", tiled=True)
                                  if c else jax.lax.all_gather(v, "x", tiled=True)),
      "psum_scatter": lambda v, c: (zc.compressed_psum_scatter(v, "x", codec=c, policy="always", tiled=True)
                                    if c else jax.lax.psum_scatter(v, "x", tiled=True)),
      "psum": lambda v, c: (zc.compressed_psum(v, "x", codec=c, policy="always") if c
                            else jax.lax.psum(v, "x")),
      "all_to_all": lambda v, c: (zc.compressed_all_to_all(v, "x", 0, 0, codec=c, policy="always", tiled=True)
                                  if c else jax.lax.all_to_all(v, "x", 0, 0, tiled=True)),
      "ppermute": lambda v, c: (zc.compressed_ppermute(v, "x", [(0, 0)], codec=c, policy="always") if c
                                else jax.lax.ppermute(v, "x", [(0, 0)])),
  }
  rows, bad = [], 0
  for name, f in ops.items():
    row = {"collective": name}
    for codec in (None, "raw", "zipccl", "entropy"):
      g = jax.jit(jax.shard_map(lambda v, c=codec, f=f: f(v, c), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
      got = np.asarray(g(x)).view(np.uint16)
      # one participant: every op returns its input (a sum of one term; lax may quieten NaNs, the
      # Gaussian data has none)
      ok = got.shape == xw.shape and bool((got == xw).all())
      bad += not ok
      t, tmin = time_calls(jax, g, (x,), reps, rounds)
      row[codec or "lax"] = {"time_us": t * 1e6, "time_min_us": tmin * 1e6, "bit_identical": ok}
    rows.append(row)
    log(f"  {name:12s} " + "  ".join(f"{k} {row[k]['time_us']:8.1f} us" for k in ("lax", "raw", "zipccl", "entropy")))
  log(f"CTIMING: {len(rows) * 4} calls timed, {bad} results not bit-identical")
  return {"ok": bad == 0, "rows": rows, "bytes": size,
          "method": f"median over {rounds} rounds of {reps} back-to-back jitted calls, {size / 2**20:g} MiB bf16"}


# ---- driver --------------------------------------------------------------------------------------

# The tile kernels' variants (8-element groups per thread; cuda/window.cu, docs/cuda.md).
GROUP_VARIANTS = (1, 2, 4)


def set_tile_groups(groups: int) -> None:
  """Chooses the CUDA tile-kernel variant of later calls in this process (0: the default).

  The CUDA module's setter (ZIPCCL_CUDA_GROUPS is read once per process); a no-op
  where the module is missing (a rehearsal without nvcc: the CPU has no variants).
  """
  try:
    import zipccl_jax._zipccl_cuda as cuda
  except ImportError:
    return
  cuda.set_tile_groups(groups)

PHASES = {"identity": phase_identity, "timing": phase_timing, "entropy": phase_entropy,
          "collectives": phase_collectives, "ctiming": phase_ctiming}


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
              "entropy": 600 if not args.quick else 300, "collectives": 300, "ctiming": 300}
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
