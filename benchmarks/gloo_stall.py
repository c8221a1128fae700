"""Do small gloo collectives stall on this machine? Plain lax collectives, no codec.

On a 2-core VM (HZ=250, PREEMPT_NONE) with each process pinned to its own core,
some 64 KiB-1 MiB lax.all_gathers took ~3-4 ms instead of ~0.3 ms: XLA:CPU runs
gloo's ring all-gather on the calling thread, which hands every step to gloo's
I/O thread and back, and with both threads runnable on one core a handoff can
wait for the scheduler's next tick (4 ms). Sampled in /proc on such a machine,
the main thread and gloo's loop thread (`gloo::transport::tcp::Loop::run`) were
both runnable in ~23% of samples. A lax.ppermute of the same bytes, which needs
fewer handoffs, mostly did not stall. Unpinned (the scheduler may move a thread
to the other core) the stalls were rarer.

Everything a compressed or uncompressed transport adds to a call is small
next to such a stall below ~1 MiB per peer, so on a machine where this probe
shows stalls the sub-MiB cells of benchmarks/netns_bench.py measure the
scheduler, not the link (benchmarks/netns_compare.py shows how much they move
between identical runs).

This probe starts --procs processes on the host loopback (no shaping: the stall
is the CPU's), pinned (taskset, one core each, cycling over the cores) and
unpinned, and times lax.all_gather, lax.ppermute (shift by one) and lax.pmax of
8 bytes at each size, interleaved, a barrier before every call. Each call's
time is the slowest process's. It reports the 10th percentile, the median and
the 90th percentile, and the share of calls more than 2 ms above the 10th
percentile (a stall).

Usage: python benchmarks/gloo_stall.py [--procs 2] [--reps 41]
writes benchmarks/results/gloo_stall_<date>.md and .json (seconds).
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import common  # noqa: E402

PROGRAMS = ("all_gather", "ppermute", "pmax 8 B")
STALL_S = 2e-3     # a call this much above the 10th percentile counts as stalled


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def worker(pid: int, n: int, port: int, sizes: list, reps: int, out: str) -> None:
  """One process: times every program at every size; writes [size][program] -> [s]."""
  import jax
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", n, pid)
  mesh = Mesh(np.array(jax.devices()), ("x",))
  sharding = NamedSharding(mesh, P("x"))

  def array(a):
    return jax.make_array_from_callback((n,) + a.shape, sharding, lambda idx: a[None])

  def smap(body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  perm = [(j, (j + 1) % n) for j in range(n)]
  barrier = smap(lambda v: lax.pmax(v, "x"))
  tiny = array(np.zeros(2, np.int32))
  result = {}
  for nbytes in sizes:
    x = array(np.zeros(nbytes, np.uint8))
    progs = {"all_gather": (smap(lambda v: lax.all_gather(v[0], "x", tiled=True)[None]), x),
             "ppermute": (smap(lambda v: lax.ppermute(v, "x", perm)), x),
             "pmax 8 B": (barrier, tiny)}
    for f, a in progs.values():
      for _ in range(3):
        jax.block_until_ready(f(a))
    times = {k: [] for k in progs}
    for _ in range(reps):
      for k, (f, a) in progs.items():
        jax.block_until_ready(barrier(tiny))
        t0 = time.perf_counter()
        jax.block_until_ready(f(a))
        times[k].append(time.perf_counter() - t0)
    result[str(nbytes)] = times
  Path(out).write_text(json.dumps(result))
  jax.distributed.shutdown()


def run_mode(n: int, pinned: bool, sizes: list, reps: int, timeout: float) -> dict:
  """Starts n workers; returns [size][program] -> per-call slowest-process times."""
  cores = os.cpu_count() or 1
  port = _free_port()
  with tempfile.TemporaryDirectory() as tmp:
    procs = []
    for pid in range(n):
      cmd = ([ "taskset", "-c", str(pid % cores)] if pinned else []) + [
          sys.executable, __file__, "--worker", str(pid), str(n), str(port),
          ",".join(map(str, sizes)), str(reps), f"{tmp}/{pid}.json"]
      env = dict(os.environ, ZIPCCL_NUM_THREADS="1")
      procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True))
    t_end = time.monotonic() + timeout
    errs = []
    for p in procs:
      try:
        _, err = p.communicate(timeout=max(t_end - time.monotonic(), 1))
      except subprocess.TimeoutExpired:
        for q in procs:
          q.kill()
        raise SystemExit(f"gloo_stall: the workers ran past {timeout:.0f} s")
      if p.returncode:
        errs.append(err[-2000:])
    if errs:
      raise SystemExit("gloo_stall: a worker failed:\n" + errs[0])
    per = [json.loads(Path(f"{tmp}/{pid}.json").read_text()) for pid in range(n)]
  return {s: {k: [max(c) for c in zip(*(p[s][k] for p in per))] for k in per[0][s]}
          for s in per[0]}


def stats(ts: list) -> dict:
  ts = sorted(ts)
  q = lambda f: ts[min(int(f * len(ts)), len(ts) - 1)]
  p10 = q(0.1)
  return dict(p10=p10, median=statistics.median(ts), p90=q(0.9),
              stalled=sum(t > p10 + STALL_S for t in ts) / len(ts))


def kernel_facts() -> str:
  facts = []
  try:
    with gzip.open("/proc/config.gz", "rt") as f:
      cfg = f.read()
    for key in ("CONFIG_HZ=", "CONFIG_PREEMPT_NONE=y", "CONFIG_PREEMPT_VOLUNTARY=y",
                "CONFIG_PREEMPT=y"):
      line = next((ln for ln in cfg.splitlines() if ln.startswith(key)), None)
      if line:
        facts.append(line)
  except OSError:
    facts.append("kernel config not readable")
  return ", ".join(facts)


def _fmt(nbytes: int) -> str:
  return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 2**10} KiB"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog=__doc__.split("\n\n", 1)[1])
  ap.add_argument("--procs", type=int, default=2)
  ap.add_argument("--sizes", default="4096,65536,262144,1048576",
                  help="bytes per process, comma-separated")
  ap.add_argument("--reps", type=int, default=41, help="timed calls per program and size")
  ap.add_argument("--timeout", type=float, default=600)
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  ap.add_argument("--tag", default="")
  ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    pid, n, port, sizes, reps, out = args.worker
    worker(int(pid), int(n), int(port), [int(s) for s in sizes.split(",")], int(reps), out)
    return 0
  if args.procs < 2 or args.reps < 5:
    ap.error("--procs must be >= 2 and --reps >= 5")
  try:
    sizes = [int(s) for s in args.sizes.split(",")]
  except ValueError:
    ap.error(f"--sizes must be comma-separated ints, got {args.sizes!r}")
  if any(s < 1 for s in sizes):
    ap.error("--sizes must be positive")
  t0 = time.time()
  res = {}
  modes = ("pinned", "unpinned") if shutil.which("taskset") else ("unpinned",)
  if len(modes) == 1:
    print("gloo_stall: no taskset here: unpinned only", file=sys.stderr)
  for mode in modes:
    print(f"gloo_stall: {args.procs} processes, {mode} ...", file=sys.stderr, flush=True)
    res[mode] = run_mode(args.procs, mode == "pinned", sizes, args.reps, args.timeout)
  load = os.getloadavg()[0]
  date = datetime.date.today().isoformat()
  lines = [f"# Stalls of small gloo collectives ({date})", "",
           f"{args.procs} processes on the host loopback, one CPU device each, "
           f"ZIPCCL_NUM_THREADS=1; {os.cpu_count()} cores; {kernel_facts()}; load average "
           f"{load:.2f} at the end; {args.reps} calls per program and size, interleaved, a "
           f"barrier before each; each call's time is the slowest process's. 'stalled': "
           f"calls more than {STALL_S * 1e3:.0f} ms above the 10th percentile. "
           f"`benchmarks/gloo_stall.py` explains the mechanism.", "",
           "| mode | bytes per process | program | p10 ms | median ms | p90 ms | stalled |",
           "|---|---|---|---:|---:|---:|---:|"]
  table = {}
  for mode, per in res.items():
    for s in sizes:
      for k in PROGRAMS:
        st = stats(per[str(s)][k])
        table[f"{mode}/{s}/{k}"] = st
        lines.append(f"| {mode} | {_fmt(s)} | {k} | {st['p10'] * 1e3:.2f} | "
                     f"{st['median'] * 1e3:.2f} | {st['p90'] * 1e3:.2f} | {st['stalled']:.0%} |")
  lines += ["", f"Reproduce: `python benchmarks/gloo_stall.py --procs {args.procs} --reps "
            f"{args.reps} --sizes {','.join(map(str, sizes))}` ({time.time() - t0:.0f} s)", ""]
  common.write_report(args.out, f"gloo_stall_{date}" + (f"_{args.tag}" if args.tag else ""),
                      "\n".join(lines),
                      dict(date=date, procs=args.procs, reps=args.reps, sizes=sizes,
                           kernel=kernel_facts(), load=load, stats=table, times=res))
  return 0


if __name__ == "__main__":
  sys.exit(main())
