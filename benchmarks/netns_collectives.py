"""Wall-clock time of compressed vs uncompressed collectives over a slow network.

Runs N jax.distributed processes (CPU, gloo collectives) on 127.0.0.1 inside a
fresh network namespace whose loopback is rate-limited with tc/tbf (default 1
Gbit/s), so that time on the wire dominates as it does between hosts, and times
all_gather and psum of Gaussian bf16 with codec=None (jax.lax, which XLA:CPU
widens to f32 on the wire), codec="raw" (uint16 bits through the same rows) and
codec="zipccl". Needs root and iproute2 (`ip`, `tc`); the namespace and its
rules are removed at the end. Only loopback inside that namespace is used.

    sudo python benchmarks/netns_collectives.py [--rate 1gbit] [--procs 2] [--mib 8,32]

Prints a table and writes benchmarks/results/netns_collectives_<date>.md/.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODECS = (None, "raw", "zipccl")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# ---- worker ------------------------------------------------------------------------------


def worker(pid: int, nproc: int, port: int, sizes_mib: list[int], reps: int, out: str) -> None:
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                             process_id=pid, initialization_timeout=120)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import zipccl_jax as zc

  zc.tune_host_allocator()
  mesh = jax.make_mesh((nproc,), ("dp",), axis_types=(jax.sharding.AxisType.Explicit,))
  rows = []
  for mib in sizes_mib:
    n_local = mib * 2**20 // 2
    rng = np.random.default_rng(1000 + pid)
    local = (rng.standard_normal(n_local) * 0.02).astype(jnp.bfloat16)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("dp")), local)
    for op in ("all_gather", "psum"):
      for codec in CODECS:
        if op == "all_gather":
          body = lambda v, c=codec: zc.compressed_all_gather(v, "dp", tiled=True, codec=c,
                                                             policy="always")
        else:
          body = lambda v, c=codec: zc.compressed_psum(v, "dp", codec=c, policy="always")
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")))
        wire = zc.hlo_wire_bytes(f.lower(x).compile().as_text())
        jax.block_until_ready(f(x))   # compile + warm-up
        jax.block_until_ready(f(x))
        times = []
        for _ in range(reps):
          t = time.perf_counter()
          jax.block_until_ready(f(x))
          times.append(time.perf_counter() - t)
        rows.append(dict(op=op, codec=str(codec), mib=mib, median_s=statistics.median(times),
                         best_s=min(times), wire_sent=wire.common_sent, wire_operand=wire.common))
        if pid == 0:
          print(f"  {op:10s} {str(codec):6s} {mib:4d} MiB/process: median "
                f"{statistics.median(times) * 1e3:8.1f} ms", flush=True)
  if pid == 0:
    with open(out, "w") as fh:
      json.dump(rows, fh)


# ---- launcher ----------------------------------------------------------------------------


def _run(cmd, **kw):
  return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def launch(args) -> int:
  if os.geteuid() != 0:
    print("netns_collectives: needs root (ip netns, tc)", file=sys.stderr)
    return 2
  ns = f"zcbench{os.getpid()}"
  out = Path(tempfile.mkdtemp()) / "rows.json"
  try:
    _run(["ip", "netns", "add", ns])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    if args.rate != "none":
      _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
            "rate", args.rate, "burst", "256kb", "latency", "50ms"])
    port = 23456
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    procs = []
    for pid in range(args.procs):
      cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "--worker", str(pid),
             str(args.procs), str(port), args.mib, str(args.reps), str(out)]
      procs.append(subprocess.Popen(cmd, env=env, stdout=None if pid == 0 else subprocess.DEVNULL,
                                    stderr=subprocess.STDOUT if pid else None))
    deadline = time.time() + args.timeout
    for p in procs:
      p.wait(timeout=max(1, deadline - time.time()))
    bad = [i for i, p in enumerate(procs) if p.returncode]
    if bad:
      print(f"netns_collectives: workers {bad} failed", file=sys.stderr)
      return 1
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    print("netns_collectives: timed out", file=sys.stderr)
    return 1
  finally:
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
  rows = json.loads(out.read_text())
  report(rows, args)
  return 0


def report(rows, args) -> None:
  base = {(r["op"], r["mib"]): r for r in rows if r["codec"] == "raw"}
  lines = [f"# Collectives over a rate-limited loopback ({args.rate}, {args.procs} processes)", "",
           f"Date {datetime.date.today()}; machine {platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} cores; jax.distributed on CPU with gloo, one device per process, "
           "inside a network namespace whose loopback is shaped by tc tbf (all processes share it). "
           f"Gaussian bf16 (sigma 0.02), policy='always'; median of {args.reps} calls after "
           "warm-up. 'sent' = bytes leaving one process by the HLO model "
           "(zipccl_jax.hlo_wire_bytes). codec=None is jax.lax (XLA:CPU widens bf16 to f32 on "
           "the wire); 'raw' moves the same uint16 bits through zipccl's rows.", "",
           "| op | MiB/process | codec | sent bytes | median ms | best ms | speed-up vs raw |",
           "|---|---:|---|---:|---:|---:|---:|"]
  for r in rows:
    b = base[(r["op"], r["mib"])]
    lines.append(f"| {r['op']} | {r['mib']} | {r['codec']} | {r['wire_sent']:,.0f} | "
                 f"{r['median_s'] * 1e3:.1f} | {r['best_s'] * 1e3:.1f} | "
                 f"{b['median_s'] / r['median_s']:.2f}x |")
  lines += ["", f"Reproduce: `sudo python benchmarks/netns_collectives.py --rate {args.rate} "
            f"--procs {args.procs} --mib {args.mib}`"]
  text = "\n".join(lines) + "\n"
  print(text)
  res = ROOT / "benchmarks" / "results"
  res.mkdir(parents=True, exist_ok=True)
  stem = f"netns_collectives_{datetime.date.today()}"
  (res / f"{stem}.md").write_text(text)
  (res / f"{stem}.json").write_text(json.dumps(dict(rate=args.rate, procs=args.procs, rows=rows),
                                               indent=1))
  print(f"wrote {res / stem}.md")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rate", default="1gbit", help="tc tbf rate of the loopback, or 'none'")
  ap.add_argument("--procs", type=int, default=2)
  ap.add_argument("--mib", default="8,32", help="bf16 MiB per process, comma-separated")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--timeout", type=int, default=900)
  ap.add_argument("--worker", nargs=6, metavar=("PID", "NPROC", "PORT", "MIB", "REPS", "OUT"))
  args = ap.parse_args(argv)
  if args.worker:
    pid, nproc, port, mib, reps, out = args.worker
    worker(int(pid), int(nproc), int(port), [int(m) for m in mib.split(",")], int(reps), out)
    return 0
  return launch(args)


if __name__ == "__main__":
  sys.exit(main())
