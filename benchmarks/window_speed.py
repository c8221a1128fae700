"""Window codec ("zipccl") CPU speed on one core, bf16 and fp16: the AVX2 block path
against the portable one (ZIPCCL_DISABLE_SIMD=1), optionally against a run on an
earlier build, and instructions per element (callgrind) of this tree's ffi/ against
a base revision's.

    python benchmarks/window_speed.py [--speed-mib 64] [--runs 7] [--base REV]
        [--instr-n 1048576] [--json-out F] [--before F] [--skip-instr] [--out PATH]
    -> benchmarks/results/window_speed_<date>.md (or --out)

Speed: every (path, case) runs in a fresh subprocess (this script's internal
`_worker` command) with ZIPCCL_NUM_THREADS=1, because the native code reads its
environment once. Per case: GB/s = input bytes / median of --runs calls (after two
warm-up calls) of jax.jit(zipccl_jax.encode) / jax.jit(zipccl_jax.decode) in wall
time, and of the row codec on preallocated host buffers (encode_into /
decode_into) in thread CPU time (waiting for a core on a loaded machine does not
count there). --json-out keeps the numbers; --before F adds a run saved that way
(e.g. on the build before a change) as "before" columns.

Instructions: benchmarks/window_instr.cc built with g++ -O3 against this tree's
ffi/ and against `git archive REV ffi`, run under valgrind --tool=callgrind with
--toggle-collect on encode_row / decode_row; equal payload hashes show that both
builds (and both paths) write the same bytes. Needs g++, valgrind, git and the
project's .venv (XLA FFI headers, jax).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script: its folder is on sys.path
  import common  # type: ignore[no-redef]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16, log = common.BF16, common.log
F16 = np.dtype(np.float16)
CASES = ("gauss-bf16", "gauss-fp16", "laplace-fp16", "relu-fp16")
PATHS = ("avx2", "portable")
DT_CODE = {"bf16": 1, "fp16": 2}


def make_case(name: str, size_mib: float) -> np.ndarray:
  """Deterministic inputs: Gaussian sigma 0.02, Laplace scale 0.02, ReLU of the Gaussian."""
  kind, dt = name.split("-")
  dtype = BF16 if dt == "bf16" else F16
  n = int(size_mib * 2**20) // 2
  rng = np.random.default_rng(20261201)
  if kind == "laplace":
    v = rng.laplace(0.0, 0.02, n).astype(np.float32)
  else:
    v = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
    if kind == "relu":
      v = np.maximum(v, 0)
  return v.astype(dtype)


def _thread_gbps(fn, nbytes: int, runs: int) -> float:
  """Input bytes / median thread CPU time of fn() (after one warm-up call)."""
  fn()
  times = []
  for _ in range(runs):
    t0 = time.thread_time()
    fn()
    times.append(time.thread_time() - t0)
  return nbytes / statistics.median(times) / 1e9


def _worker(args) -> None:
  import jax
  import zipccl_jax as z

  out = {}
  for case in args.cases.split(","):
    x = make_case(case, args.speed_mib)
    n, nbytes = x.size, x.nbytes
    xj = jax.device_put(x)
    enc = jax.jit(z.encode)
    dec = jax.jit(z.decode)
    e = jax.block_until_ready(enc(xj))
    y = jax.block_until_ready(dec(e))
    ok = int(e.status) == 0 and np.array_equal(np.asarray(y).view(np.uint16), x.view(np.uint16))
    t_enc, _ = common.median_time(lambda: jax.block_until_ready(enc(xj)), args.runs)
    t_dec, _ = common.median_time(lambda: jax.block_until_ready(dec(e)), args.runs)
    row = {"n": n, "escapes": int(e.escape_count), "status": int(e.status),
           "used_nbytes": int(e.used_nbytes), "roundtrip_ok": bool(ok),
           "jit_encode": nbytes / t_enc / 1e9, "jit_decode": nbytes / t_dec / 1e9}
    nat = z.native()
    code = DT_CODE[case.split("-")[1]]
    cap = int(e.payload.shape[-1]) - nat.row_nbytes(code, n, 0)  # the FFI encoder's capacity
    buf = np.zeros(nat.row_nbytes(code, n, cap), np.uint8)
    xb = x.view(np.uint8).reshape(-1)
    yb = np.empty(nbytes, np.uint8)
    nat.encode_into(code, xb, n, cap, buf)
    host_ok = nat.decode_into(code, buf, n, yb) == 0 and np.array_equal(yb, xb)
    row["roundtrip_ok"] = bool(ok and host_ok and np.array_equal(buf, np.asarray(e.payload)))
    row["host_encode"] = _thread_gbps(lambda: nat.encode_into(code, xb, n, cap, buf), nbytes, args.runs)
    row["host_decode"] = _thread_gbps(lambda: nat.decode_into(code, buf, n, yb), nbytes, args.runs)
    log(f"{args.path} {case}: jit {row['jit_encode']:.2f} / {row['jit_decode']:.2f} GB/s, host "
        f"{row['host_encode']:.2f} / {row['host_decode']:.2f} GB/s, escapes {row['escapes']}, "
        f"{'ok' if row['roundtrip_ok'] else 'FAILED'}")
    out[case] = row
  with open(args.json_out, "w") as f:
    json.dump(out, f)


def speed_rows(size_mib: float, runs: int) -> dict:
  """{path: {case: row}}, each path in its own subprocess."""
  res = {}
  for path in PATHS:
    env = dict(os.environ, ZIPCCL_NUM_THREADS="1", JAX_PLATFORMS="cpu")
    env.pop("ZIPCCL_DISABLE_SIMD", None)
    if path == "portable":
      env["ZIPCCL_DISABLE_SIMD"] = "1"
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
      jpath = tf.name
    try:
      subprocess.run([sys.executable, os.path.abspath(__file__), "_worker", "--cases", ",".join(CASES),
                      "--speed-mib", str(size_mib), "--runs", str(runs), "--json-out", jpath,
                      "--path", path], env=env, check=True)
      with open(jpath) as f:
        res[path] = json.load(f)
    finally:
      os.unlink(jpath)
  return res


# ---- instructions per element (callgrind) ---------------------------------------------


_env = common.single_thread_env


def _line(tool: str, n: int, dt: int, data: str, portable: bool) -> dict:
  out = subprocess.run([tool, str(n), "1", str(dt), data], check=True, capture_output=True, text=True,
                       env=_env(portable)).stdout
  m = re.search(r"escapes=(\d+) enc_status=(\d+) status=(\d+) match=(\d+) hash=(\w+)", out)
  if not m:
    raise RuntimeError(f"unexpected output of {tool}: {out!r}")
  return {"escapes": int(m[1]), "ok": m[2] == "0" and m[3] == "0" and m[4] == "1", "hash": m[5]}


def _instr(tool: str, n: int, dt: int, data: str, portable: bool, tmp: str) -> dict:
  res = _line(tool, n, dt, data, portable)
  for f in ("encode_row", "decode_row"):
    cg = os.path.join(tmp, f"cg.{os.path.basename(tool)}.{f}")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
                    f"--toggle-collect=zipccl::cpu::{f}*", tool, str(n), "1", str(dt), data],
                   check=True, capture_output=True, env=_env(portable))
    with open(cg) as fh:
      ir = next(int(ln.split()[1]) for ln in fh if ln.startswith(("summary:", "totals:")))
    res[f] = ir / n
  return res


def instr_rows(base: str, n: int) -> dict:
  out = {"base": base, "n": n, "rows": []}
  with tempfile.TemporaryDirectory() as tmp:
    out["head"], tools = common.build_before_after(base, tmp, "window_instr.cc", "codec_cpu.cc")
    for case in CASES:
      data, dt = case.split("-")
      for portable in (False, True):
        r = {"case": case, "path": "portable" if portable else "avx2"}
        for k, tool in tools.items():
          log(f"callgrind {k} {case} {r['path']}")
          r[k] = _instr(tool, n, DT_CODE[dt], data, portable, tmp)
        out["rows"].append(r)
  return out


# ---- report ---------------------------------------------------------------------------


def _command(args) -> str:
  """The command line of this run (--before's file named BEFORE.json)."""
  cmd = f"python benchmarks/window_speed.py --speed-mib {args.speed_mib:g} --runs {args.runs}"
  cmd += f" --base {args.base} --instr-n {args.instr_n}"
  cmd += "".join(f" --{k}" for k in ("skip_instr", "skip_speed") if getattr(args, k)).replace("_", "-")
  if args.before:
    cmd += f" --before BEFORE.json --before-label '{args.before_label}'"
  if args.out:
    cmd += f" --out {os.path.relpath(os.path.abspath(args.out), ROOT)}"
  return cmd


def report(speed, before, instr, info, args, wall) -> list[str]:
  lines = [f"# Window codec CPU speed, bf16 and fp16, one core ({info['date']})", "",
           f"Machine: {info['cpu']}, {info['usable_cores']} usable cores, SIMD: {info['simd']}; "
           f"1-min load average at start {info.get('loadavg_1m')}; versions: "
           + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".", "",
           f"Command: `{_command(args)}` (ZIPCCL_NUM_THREADS=1; wall {wall:.0f} s)."]
  if before:
    lines += ["", f"BEFORE.json: the timing part of this script (`--skip-instr --json-out "
              f"BEFORE.json`) run earlier on this machine against a build of {args.before_label}."]
  lines += [""]
  if speed and before and instr:
    ins = {(r["case"], r["path"]): r for r in instr["rows"]}
    lines += ["## Summary: after / before, default path (AVX2 where the CPU has it)", "",
              "Speed-ups are ratios of noisy medians (shared 2-core machine); the instruction "
              "ratios are exact.", "",
              "| case | jit encode GB/s | jit decode GB/s | host encode GB/s | host decode GB/s | "
              "encode instr/elem (before/after) | decode instr/elem (before/after) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for case in CASES:
      a, b, r = speed["avx2"][case], before["avx2"][case], ins.get((case, "avx2"))
      cells = [f"{b[k]:.2f} -> {a[k]:.2f} ({a[k] / b[k]:.2f}x)"
               for k in ("jit_encode", "jit_decode", "host_encode", "host_decode")]
      if r:
        cells += [f"{r['before'][f]:.2f} -> {r['after'][f]:.2f} ({r['before'][f] / r['after'][f]:.2f}x)"
                  for f in ("encode_row", "decode_row")]
      else:
        cells += ["n/a", "n/a"]
      lines.append(f"| {case} | " + " | ".join(cells) + " |")
    lines += [""]
  if speed:
    lines += [f"## Speed, 1 thread, {args.speed_mib} MiB per case (GB/s = input bytes / median of "
              f"{args.runs}, 1 GB = 1e9 B)", "",
              "jit = `jax.jit(zipccl_jax.encode)` / `jax.jit(zipccl_jax.decode)`, wall time (includes "
              "XLA's fresh output buffers and their page faults); host = the row codec on "
              "preallocated buffers, thread CPU time. The machine is shared: timings are noisy, "
              "the callgrind counts below are not. `portable` = ZIPCCL_DISABLE_SIMD=1.", "",
              "| case | path | escapes | jit encode | jit decode | host encode | host decode | round trip |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    runs = [("before", before), ("after", speed)] if before else [("this build", speed)]
    for case in CASES:
      for label, res in runs:
        for path in PATHS:
          r = res.get(path, {}).get(case)
          if r is None:
            continue
          lines.append(f"| {case} | {label}, {path} | {100 * r['escapes'] / r['n']:.2f}% | "
                       f"{r['jit_encode']:.2f} | {r['jit_decode']:.2f} | {r['host_encode']:.2f} | "
                       f"{r['host_decode']:.2f} | {'ok' if r['roundtrip_ok'] else 'FAILED'} |")
  if instr:
    lines += ["", f"## Instructions per element (callgrind), one row of {instr['n']} elements", "",
              f"encode_row / decode_row, before = `{instr['base']}`'s ffi/, after = `{instr['head']}`'s; "
              "same payload hash = byte-identical encodings.", "",
              "| case | path | encode before | encode after | decode before | decode after | "
              "same bytes | round trip |", "|---|---|---:|---:|---:|---:|---|---|"]
    for r in instr["rows"]:
      b, a = r["before"], r["after"]
      lines.append(f"| {r['case']} | {r['path']} | {b['encode_row']:.2f} | {a['encode_row']:.2f} | "
                   f"{b['decode_row']:.2f} | {a['decode_row']:.2f} | "
                   f"{'yes' if a['hash'] == b['hash'] else 'NO'} | "
                   f"{'ok' if a['ok'] and b['ok'] else 'FAILED'} |")
  return lines


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = ap.add_subparsers(dest="cmd")
  w = sub.add_parser("_worker")
  w.add_argument("--cases", required=True)
  w.add_argument("--speed-mib", type=float, required=True)
  w.add_argument("--runs", type=int, required=True)
  w.add_argument("--json-out", required=True)
  w.add_argument("--path", required=True)
  ap.add_argument("--speed-mib", type=float, default=64)
  ap.add_argument("--runs", type=int, default=7)
  ap.add_argument("--base", default="dfb778c", help="git revision of the callgrind 'before' build")
  ap.add_argument("--instr-n", type=int, default=1 << 20, help="elements of the callgrind row")
  ap.add_argument("--skip-instr", action="store_true", help="no callgrind part")
  ap.add_argument("--skip-speed", action="store_true", help="no timing part")
  ap.add_argument("--json-out", default=None, help="also write the timings here")
  ap.add_argument("--before", default=None, help="timings of an earlier run (its --json-out)")
  ap.add_argument("--before-label", default="the base revision", help="what --before measured")
  ap.add_argument("--out", default=None, help="report path (default results/window_speed_<date>.md)")
  args = ap.parse_args(argv)
  if args.cmd == "_worker":
    _worker(args)
    return 0
  info = common.machine_info()
  t0 = time.time()
  speed = None if args.skip_speed else speed_rows(args.speed_mib, args.runs)
  if speed is not None and args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(speed, f)
  before = None
  if args.before:
    with open(args.before) as f:
      before = json.load(f)
  instr = None if args.skip_instr else instr_rows(args.base, args.instr_n)
  lines = report(speed, before, instr, info, args, time.time() - t0)
  common.write_lines(args.out or os.path.join(common.RESULTS, f"window_speed_{common.today()}.md"), lines)
  return 0


if __name__ == "__main__":
  sys.exit(main())
