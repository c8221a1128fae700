"""Entropy codec CPU speed, this tree against a base revision: instructions per
element (callgrind, independent of machine load), the best of many timings on an
L2-resident row (the quietest slice a loaded machine gives), and single-thread
GB/s medians through jax.jit on 64 MiB of Gaussian bf16 next to the window codec
and ZipNN measured in the same run.

    python benchmarks/entropy_speed.py [--base REV] [--instr-n 1048576] [--speed-mib 64] [--runs 7]
    -> benchmarks/results/entropy_speed_<date>.md

Both builds compile benchmarks/entropy_instr.cc (this tree's) against their own
ffi/ sources (the base's taken with `git archive`), with the flags of
benchmarks/entropy_instr.sh; equal payload hashes show that both write the same
bytes. Needs g++, valgrind, git and the project's .venv (XLA FFI headers, jax;
ZipNN for its row, `pip install zipnn` + a CPU torch). ZIPCCL_NUM_THREADS=1.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("ZIPCCL_NUM_THREADS", "1")  # read once, at the codec's first use

if __package__:
  from benchmarks import common, entropy_ratio  # noqa: E402
else:
  import common  # type: ignore[no-redef]  # noqa: E402
  import entropy_ratio  # type: ignore[no-redef]  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
log = common.log
DT_NAME = {1: "bf16", 2: "fp16"}
# (dtype code, portable path): the AVX2/BMI2 path for both dtypes, the portable
# path (ZIPCCL_DISABLE_SIMD=1) for bf16.
INSTR_CASES = [(1, False), (2, False), (1, True)]


_env = common.single_thread_env


def _line(tool: str, n: int, reps: int, dt: int, portable: bool) -> dict:
  """The tool's summary line: payload hash, round trip, best-of-reps GB/s."""
  out = subprocess.run([tool, str(n), str(reps), str(dt)], check=True, capture_output=True,
                       text=True, env=_env(portable)).stdout
  m = re.search(r"used=(\d+) .*status=(\d+) match=(\d+) hash=(\w+) enc ([\d.]+) GB/s dec ([\d.]+)", out)
  if not m:
    raise RuntimeError(f"unexpected output of {tool}: {out!r}")
  return {"used": int(m[1]), "ok": m[2] == "0" and m[3] == "1", "hash": m[4],
          "enc": float(m[5]), "dec": float(m[6])}


def _instr(tool: str, n: int, dt: int, portable: bool, tmp: str) -> dict:
  """Instructions per element of encode_row and decode_row (callgrind)."""
  res = {}
  for f in ("encode_row", "decode_row"):
    cg = os.path.join(tmp, f"cg.{os.path.basename(tool)}.{f}.{dt}.{int(portable)}")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
                    f"--toggle-collect=zipccl::ent::cpu::{f}*", tool, str(n), "1", str(dt)],
                   check=True, capture_output=True, env=_env(portable))
    with open(cg) as fh:
      ir = next(int(ln.split()[1]) for ln in fh if ln.startswith(("summary:", "totals:")))
    res[f] = ir / n
  return res


def native_rows(base: str, n: int, best_n: int, best_reps: int) -> dict:
  out = {"base": base}
  with tempfile.TemporaryDirectory() as tmp:
    out["head"], tools = common.build_before_after(base, tmp, "entropy_instr.cc", "entropy_cpu.cc")
    rows = []
    for dt, portable in INSTR_CASES:
      r = {"dtype": DT_NAME[dt], "path": "portable" if portable else "AVX2/BMI2"}
      for k, tool in tools.items():
        log(f"callgrind {k} {r['dtype']} {r['path']}")
        r[k] = _instr(tool, n, dt, portable, tmp)
        r[k].update(_line(tool, n, 1, dt, portable))
        best = _line(tool, best_n, best_reps, dt, portable)
        r[k]["best_enc"], r[k]["best_dec"] = best["enc"], best["dec"]
        r[k]["ok"] = r[k]["ok"] and best["ok"]
      rows.append(r)
    out["rows"] = rows
  return out


def _proc_gbps(fn, nbytes, runs):
  """Input bytes / median process CPU time (all threads, user + system: the codec's
  work and its page faults) of fn(), after one warm-up call. Waiting for a core on
  a loaded machine does not count; sharing it (SMT, caches) does."""
  return entropy_ratio._cpu_gbps(fn, nbytes, runs, clock=time.process_time)  # pylint: disable=protected-access


def cpu_time_rows(n: int, runs: int, tuned: bool = False) -> dict:
  """The jax.jit calls and ZipNN of entropy_ratio.speed_rows, in process CPU time.

  tuned: first zc.tune_host_allocator() (process-wide, so measured last): XLA's
  fresh output buffers come from the reused heap instead of new page-faulted
  mappings (zipccl_jax/_src/host.py); the codecs' rows then also get wall-clock
  medians (ZipNN is not measured again).
  """
  import jax
  import jax.numpy as jnp
  import zipccl_jax as zc
  if tuned:
    zc.tune_host_allocator()
  entropy = zc.get_codec("entropy")
  x = entropy_ratio.make("gaussian", n).astype(common.BF16)
  xj = jnp.asarray(x.reshape(1, -1))
  enc = jax.jit(entropy.encode_rows)
  dec = jax.jit(entropy.decode_rows, static_argnums=(1, 2))
  p, _ = enc(xj)
  out = {"entropy_encode": _proc_gbps(lambda: enc(xj)[0].block_until_ready(), x.nbytes, runs),
         "entropy_decode": _proc_gbps(lambda: dec(p, n, common.BF16)[0].block_until_ready(),
                                      x.nbytes, runs)}
  xw = jnp.asarray(x)
  wenc, wdec = jax.jit(zc.encode), jax.jit(zc.decode)
  e = wenc(xw)
  out["window_encode"] = _proc_gbps(lambda: jax.block_until_ready(wenc(xw)), x.nbytes, runs)
  out["window_decode"] = _proc_gbps(lambda: wdec(e).block_until_ready(), x.nbytes, runs)
  if tuned:
    med = entropy_ratio._median_gbps
    out["wall_entropy_encode"] = med(lambda: enc(xj)[0].block_until_ready(), x.nbytes, runs)
    out["wall_entropy_decode"] = med(lambda: dec(p, n, common.BF16)[0].block_until_ready(),
                                     x.nbytes, runs)
    out["wall_window_encode"] = med(lambda: jax.block_until_ready(wenc(xw)), x.nbytes, runs)
    out["wall_window_decode"] = med(lambda: wdec(e).block_until_ready(), x.nbytes, runs)
    return out
  z = entropy_ratio.zipnn_codec(common.BF16)
  if z is not None:
    raw = bytearray(x.tobytes())
    c = z.compress(raw)
    out["zipnn_encode"] = _proc_gbps(lambda: z.compress(bytearray(raw)), x.nbytes, runs)
    out["zipnn_decode"] = _proc_gbps(lambda: z.decompress(c), x.nbytes, runs)
  return out


def report(nat, speed, cpu, tuned, info, args, wall, load) -> list[str]:
  lines = [f"# Entropy codec: CPU speed, before and after ({info['date']})", "",
           f"Machine: {info['cpu']}, {info['usable_cores']} usable cores, SIMD: {info['simd']}; "
           f"1-min load average at start {info.get('loadavg_1m')}, other processes kept "
           f"{entropy_ratio._fmt(load, '.2f')} cores busy on average during the run (timings "
           f"under such load are noisy: medians of {args.runs} runs, and best-of-"
           f"{args.best_reps} timings; instruction counts are not affected); versions: "
           + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".", "",
           f"Command: `python benchmarks/entropy_speed.py --base {args.base} --instr-n "
           f"{args.instr_n} --speed-mib {args.speed_mib} --runs {args.runs}` "
           f"(ZIPCCL_NUM_THREADS=1); wall {wall:.0f} s.", ""]
  if nat:
    lines += [f"## Instructions per element (callgrind) and best-of-{args.best_reps} timing", "",
              f"Before = {nat['base']}, after = {nat['head']}. Instructions: valgrind "
              f"--tool=callgrind on one Gaussian row of {args.instr_n} elements (encode_row / "
              "decode_row, one thread; `benchmarks/entropy_instr.sh` measures the same for one "
              f"build). Best: the fastest of {args.best_reps} encodes and decodes of a "
              f"{args.best_n}-element row (L2-resident, thread CPU time, GB/s of input): the "
              "quietest slice the machine gave, a load-robust proxy for speed on a quiet core. "
              "Same bytes = equal payload hashes before and after.", "",
              "| row | encode instr/elem before | after | decode instr/elem before | after | "
              "best encode GB/s before | after | best decode GB/s before | after | same bytes |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in nat["rows"]:
      b, a = r["before"], r["after"]
      same = "yes" if b["hash"] == a["hash"] and b["used"] == a["used"] else "NO"
      ok = "" if (a["ok"] and b["ok"]) else " (round trip FAILED)"
      lines.append(f"| {r['dtype']}, {r['path']} path | {b['encode_row']:.2f} | "
                   f"{a['encode_row']:.2f} | {b['decode_row']:.2f} | {a['decode_row']:.2f} | "
                   f"{b['best_enc']:.2f} | {a['best_enc']:.2f} | {b['best_dec']:.2f} | "
                   f"{a['best_dec']:.2f} | {same}{ok} |")
    lines.append("")
  if speed:
    lines += [f"## Through jax.jit, 1 thread, {args.speed_mib} MiB Gaussian bf16 (GB/s = input "
              "bytes / median time, 1 GB = 1e9 B; this tree only)", "",
              "| codec | encode GB/s | decode GB/s |", "|---|---:|---:|"]
    lines += _gbps_rows(speed, _ROWS)
    if "zipnn_encode" in speed:
      lines += ["", f"Entropy codec vs ZipNN in this run: encode "
                f"{speed['entropy_encode'] / speed['zipnn_encode']:.1f}x, decode "
                f"{speed['entropy_decode'] / speed['zipnn_decode']:.1f}x (goal: >= 3x / >= 2x; "
                "absolute goal through jax.jit: encode >= 1.5 GB/s, decode >= 2.5 GB/s)."]
    if cpu:
      lines += ["", f"The same calls in process CPU time (median of {args.runs}; all threads, "
                "user + system: the codec's work and its page faults, not the time spent "
                "waiting for a core on this loaded machine; ZipNN's compress includes copying "
                "its input into a fresh bytearray):", "",
                "| codec | encode GB/s | decode GB/s |", "|---|---:|---:|"]
      lines += _gbps_rows(cpu, _ROWS[:3])
      if "zipnn_encode" in cpu:
        lines += ["", f"In CPU time: entropy codec vs ZipNN encode "
                  f"{cpu['entropy_encode'] / cpu['zipnn_encode']:.1f}x, decode "
                  f"{cpu['entropy_decode'] / cpu['zipnn_decode']:.1f}x."]
    if tuned:
      lines += ["", "With `zc.tune_host_allocator()` (measured after the rows above: XLA's "
                "output buffers reused from the heap, no page faults; zipccl_jax/_src/host.py):",
                "", "| codec | encode GB/s wall | decode GB/s wall | encode GB/s CPU time | "
                "decode GB/s CPU time |", "|---|---:|---:|---:|---:|"]
      for name, key in (("entropy codec (XLA FFI, jax.jit)", "entropy"),
                        ("window codec (XLA FFI, jax.jit)", "window")):
        lines.append(f"| {name} | {tuned['wall_' + key + '_encode']:.2f} | "
                     f"{tuned['wall_' + key + '_decode']:.2f} | {tuned[key + '_encode']:.2f} | "
                     f"{tuned[key + '_decode']:.2f} |")
      if cpu and "zipnn_encode" in cpu:
        lines += ["", f"In CPU time, tuned, vs ZipNN (CPU time, above): encode "
                  f"{tuned['entropy_encode'] / cpu['zipnn_encode']:.1f}x, decode "
                  f"{tuned['entropy_decode'] / cpu['zipnn_decode']:.1f}x."]
    lines += ["", "Round trip of the speed case: "
              f"{'ok' if speed['entropy_roundtrip_ok'] else 'FAILED'}. The window codec's rows "
              "are a load gauge: compare them with codec_<date>.md, measured on a quieter machine."]
  return lines


# (row label, key prefix) of the GB/s tables: key + "_encode" / "_decode" in the result dicts.
_ROWS = (("entropy codec (XLA FFI, jax.jit)", "entropy"),
         ("window codec (XLA FFI, jax.jit)", "window"),
         ("ZipNN (1 thread)", "zipnn"),
         ("entropy row codec, host buffers, thread CPU time", "entropy_host"),
         ("window row codec, host buffers, thread CPU time", "window_host"))


def _gbps_rows(d: dict, rows) -> list[str]:
  """Markdown rows "| label | encode | decode |" for the rows measured in d."""
  return [f"| {name} | {d[key + '_encode']:.2f} | {d[key + '_decode']:.2f} |"
          for name, key in rows if f"{key}_encode" in d]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--base", default="e57cefe", help="git revision to compare with")
  ap.add_argument("--instr-n", type=int, default=1 << 20, help="elements of the callgrind row")
  ap.add_argument("--best-n", type=int, default=1 << 16, help="elements of the best-of row")
  ap.add_argument("--best-reps", type=int, default=300)
  ap.add_argument("--speed-mib", type=float, default=64)
  ap.add_argument("--runs", type=int, default=7)
  ap.add_argument("--skip-native", action="store_true", help="no callgrind / best-of part")
  ap.add_argument("--skip-speed", action="store_true", help="no jax.jit part")
  ap.add_argument("--out", default=None, help="report path (default results/entropy_speed_<date>.md)")
  args = ap.parse_args(argv)
  info = entropy_ratio.machine_info()
  t0, snap0 = time.perf_counter(), common.cpu_snapshot()
  nat = None if args.skip_native else native_rows(args.base, args.instr_n, args.best_n,
                                                  args.best_reps)
  nspeed = int(args.speed_mib * 2**20) // 2
  speed = None if args.skip_speed else entropy_ratio.speed_rows(nspeed, args.runs)
  cpu = None if args.skip_speed else cpu_time_rows(nspeed, args.runs)
  tuned = None if args.skip_speed else cpu_time_rows(nspeed, args.runs, tuned=True)
  wall = time.perf_counter() - t0
  load = common.other_load(snap0, common.cpu_snapshot(), wall)
  path = args.out or os.path.join(common.RESULTS, f"entropy_speed_{common.today()}.md")
  common.write_lines(path, report(nat, speed, cpu, tuned, info, args, wall, load))
  ok = (nat is None or all(r["after"]["ok"] and r["before"]["ok"] for r in nat["rows"])) and \
       (speed is None or speed["entropy_roundtrip_ok"])
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
