"""Does XLA:CPU run a codec FFI call while a gloo collective is in flight?

The question behind chunked transports (docs/design.md, "Overlap"): in ONE jitted
program, an FFI custom call (zipccl's encode or decode) that does not depend on an
XLA collective, and does not feed it, could run while the collective waits on the
wire. This probe measures whether it does.

Two processes (gloo, one CPU device each), each pinned to its own core with one
codec thread (ZIPCCL_NUM_THREADS=1), in a network namespace whose loopback is
shaped with tc tbf (benchmarks/netns_bench.py's `Net`). Per process it times,
medians over --reps calls, each after a barrier:

  wire     all_gather of a uint8[W] block            (the transfer alone)
  codec    encode_rows (or decode_rows) of x          (the codec alone)
  both     both in one program, independent           (overlap: ~max(wire, codec))
  chain    both in one program, the collective's operand depends on the
           codec's output (forced series: ~wire + codec)

and reports overlap = (wire + codec - both) / min(wire, codec): 1 = the codec is
completely hidden under the transfer, 0 = serial. Variants: the XLA flag sets
given by --flags (each a separate pair of processes).

    python benchmarks/overlap_probe.py                       # needs root (netns)
    python benchmarks/overlap_probe.py --rate 1gbit --wire-mib 8 --codec-mib 32

Writes benchmarks/results/overlap_probe_<date>.md and .json.
"""
from __future__ import annotations

import argparse
import functools
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_FLAGS = ("", "--xla_cpu_enable_concurrency_optimized_scheduler=true")


def _worker(cfg: dict, pid: int) -> dict:
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{cfg['port']}",
                             num_processes=2, process_id=pid, initialization_timeout=120)
  import jax.numpy as jnp
  import ml_dtypes
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P

  import zipccl_jax as zc

  mesh = jax.make_mesh((2,), ("dp",), axis_types=(jax.sharding.AxisType.Explicit,))
  sh = NamedSharding(mesh, P("dp"))
  K = cfg["pieces"]
  rng = np.random.default_rng(pid)
  w_bytes = int(cfg["wire_mib"] * 2**20)
  n = int(cfg["codec_mib"] * 2**20) // 2
  x = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
  w = rng.integers(0, 255, w_bytes, dtype=np.uint8)
  xs = jax.make_array_from_process_local_data(sh, x)
  ws = jax.make_array_from_process_local_data(sh, w)
  payload_host = np.asarray(jax.device_get(
      jax.jit(jax.shard_map(lambda v: zc.encode_rows(v.reshape(K, -1))[0], mesh=mesh,
                            in_specs=P("dp"),
                            out_specs=P("dp")))(xs).addressable_shards[0].data))
  ps = jax.make_array_from_process_local_data(sh, payload_host)   # [K, max_nbytes] per process

  def gather(v):
    return lax.all_gather(v, "dp", tiled=True)

  from zipccl_jax._src import codec as _codec, ffi as _ffi  # the raw FFI call (probe only)

  def encode_all_results(v):
    """encode_rows without dropping the workspace result: nothing the call writes is
    dead, so XLA cannot hand its memory to a later op."""
    _ffi.register()
    m = v.shape[-1]
    call = jax.ffi.ffi_call(
        _ffi.ENCODE_TARGET,
        (_codec._result_type((1, _codec.max_nbytes(v.dtype, m)), jnp.uint8, v),
         _codec._result_type((1, 4), jnp.int32, v),
         _codec._result_type((1, _codec.workspace_nbytes(m)), jnp.uint8, v)),
        vmap_method="broadcast_all")
    return call(v, jnp.zeros(v.shape[:-1], jnp.uint8))   # no row skipped

  def codec_op(kind, v, p):
    if kind == "encode":
      pay, st = zc.encode_rows(v[None])
      return st, pay
    if kind == "encode_live":
      pay, st, ws = encode_all_results(v[None])
      return st, pay, ws
    y, status = zc.decode_rows(p, n // K, jnp.bfloat16)
    return status[:, None], y

  cw = w_bytes // K
  cn = n // K

  def dep(st):
    return (st.reshape(-1)[0] & 0).astype(jnp.uint8)   # 0, but XLA cannot know it

  def progs(kind):
    # Every program has K pieces of wire and/or K pieces of codec work: XLA:CPU's
    # thunk executor runs programs of <= 8 thunks in sequence whatever their
    # dependencies, and a chunked transport has many thunks.
    def codec_piece(v, p, k):
      # all results stay live (returned): XLA's buffer assignment would otherwise
      # reuse a dead result's memory for a later op, and the thunk executor orders
      # the two ops by that reuse
      return codec_op(kind, v[k * cn:(k + 1) * cn], p[k:k + 1])

    def wire(v, wv, p):
      return [gather(wv[k * cw:(k + 1) * cw]) for k in range(K)]

    def codec(v, wv, p):
      return [a for k in range(K) for a in codec_piece(v, p, k)]

    def both(v, wv, p):
      return wire(v, wv, p) + codec(v, wv, p)

    def pipe(v, wv, p):   # gather k waits for codec piece k only
      out = []
      for k in range(K):
        st, *ys = codec_piece(v, p, k)
        out += [gather(wv[k * cw:(k + 1) * cw] + dep(st)), st, *ys]
      return out

    def serial(v, wv, p):   # every gather waits for every codec piece
      outs = [codec_piece(v, p, k) for k in range(K)]
      d = functools.reduce(lambda a, b: a | b, [dep(o[0]) for o in outs])
      return [gather(wv[k * cw:(k + 1) * cw] + d) for k in range(K)] + [
          a for o in outs for a in o]

    def status_1d(f):   # results varying over dp, stacked along a leading axis
      return lambda *a: [r.reshape((1, -1)) for r in f(*a)]

    out = {}
    for name, f in (("wire", wire), ("codec", codec), ("both", both), ("pipe", pipe),
                    ("serial", serial)):
      out[name] = jax.jit(jax.shard_map(status_1d(f), mesh=mesh, in_specs=(P("dp"),) * 3,
                                        out_specs=P("dp"))).lower(xs, ws, ps).compile()
    return out

  bar = jax.jit(jax.shard_map(lambda v: lax.pmax(v, "dp"), mesh=mesh, in_specs=P("dp"),
                              out_specs=P()))
  one = jax.make_array_from_process_local_data(sh, np.zeros(1, np.int32))
  res = {}
  for kind in cfg["kinds"]:
    fs = progs(kind)
    for f in fs.values():
      jax.block_until_ready(f(xs, ws, ps))
    times = {k: [] for k in fs}
    for r in range(cfg["reps"]):
      order = list(fs)[r % len(fs):] + list(fs)[:r % len(fs)]
      for k in order:
        jax.block_until_ready(bar(one))
        t0 = time.perf_counter()
        jax.block_until_ready(fs[k](xs, ws, ps))
        times[k].append(time.perf_counter() - t0)
    res[kind] = times
  jax.distributed.shutdown()
  return res


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_pair(args, flags: str, net) -> list:
  rundir = Path(tempfile.mkdtemp(prefix="overlap_probe_"))
  cfg = dict(port=_free_port(), wire_mib=args.wire_mib, codec_mib=args.codec_mib,
             reps=args.reps, kinds=args.kinds.split(","), pieces=args.pieces)
  (rundir / "cfg.json").write_text(json.dumps(cfg))
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
             ZIPCCL_NUM_THREADS=str(args.codec_threads))
  env.pop("XLA_FLAGS", None)
  if flags:
    env["XLA_FLAGS"] = flags
  procs = []
  for pid in range(2):
    pin = ["taskset", "-c", str(pid % (os.cpu_count() or 1))] if args.pin else []
    cmd = net.prefix() + pin + [sys.executable, str(Path(__file__).resolve()), "--worker",
                          str(rundir / "cfg.json"), str(pid)]
    procs.append(subprocess.Popen(cmd, env=env, cwd=str(ROOT),
                                  stdout=open(rundir / f"log.{pid}", "w"),
                                  stderr=subprocess.STDOUT))
  deadline = time.monotonic() + args.timeout
  for p in procs:
    try:
      p.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
      p.kill()
  out = []
  for pid in range(2):
    f = rundir / f"result.{pid}.json"
    if not f.exists() or procs[pid].returncode:
      raise RuntimeError(f"worker {pid} failed:\n" + (rundir / f"log.{pid}").read_text()[-3000:])
    out.append(json.loads(f.read_text()))
  return out


def summarize(results: list) -> dict:
  """Per codec kind: medians (ms) over reps of the slower process, and the overlap."""
  out = {}
  for kind in results[0]:
    med = {}
    for k in results[0][kind]:
      per_rep = [max(r[kind][k][i] for r in results) for i in range(len(results[0][kind][k]))]
      med[k] = statistics.median(per_rep) * 1e3
    serial = med["wire"] + med["codec"]
    hide = max(min(med["wire"], med["codec"]), 1e-9)
    med["overlap"] = (serial - med["both"]) / hide
    med["overlap_pipe"] = (serial - med["pipe"]) / hide
    out[kind] = med
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rate", default="1gbit", help="tbf rate of the namespace's loopback")
  ap.add_argument("--wire-mib", type=float, default=8.0, help="uint8 MiB each process gathers")
  ap.add_argument("--codec-mib", type=float, default=32.0, help="bf16 MiB each process codes")
  ap.add_argument("--kinds", default="encode,decode")
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--pieces", type=int, default=4, help="K: wire and codec work in K pieces")
  ap.add_argument("--flags", default=None,
                  help="';'-separated XLA_FLAGS variants (default: none, and the concurrency-"
                       "optimized scheduler)")
  ap.add_argument("--no-pin", dest="pin", action="store_false",
                  help="do not pin process i to core i")
  ap.add_argument("--codec-threads", type=int, default=1, help="ZIPCCL_NUM_THREADS")
  ap.add_argument("--timeout", type=float, default=240)
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    cfg = json.loads(Path(args.worker[0]).read_text())
    pid = int(args.worker[1])
    res = _worker(cfg, pid)
    (Path(args.worker[0]).parent / f"result.{pid}.json").write_text(json.dumps(res))
    return 0
  from benchmarks.netns_bench import Net
  net = Net(True)
  if net.ns is None:
    print(f"overlap_probe: {net.note}", file=sys.stderr)
  flag_sets = DEFAULT_FLAGS if args.flags is None else tuple(args.flags.split(";"))
  rows = []
  try:
    rate = args.rate.removesuffix("gbit")
    net.set_link(rate)
    for flags in flag_sets:
      s = summarize(run_pair(args, flags, net))
      for kind, med in s.items():
        rows.append(dict(flags=flags or "(none)", kind=kind, **med))
        print(f"{flags or '(none)':60s} {kind:7s} wire {med['wire']:7.1f} codec "
              f"{med['codec']:7.1f} both {med['both']:7.1f} pipe {med['pipe']:7.1f} serial "
              f"{med['serial']:7.1f} ms  overlap {med['overlap']:.2f} / pipe "
              f"{med['overlap_pipe']:.2f}", flush=True)
  finally:
    net.close()
  date = datetime.date.today().isoformat()
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  doc = dict(date=date, rate=args.rate, wire_mib=args.wire_mib, codec_mib=args.codec_mib,
             reps=args.reps, netns=net.note or "shaped", rows=rows,
             load=os.getloadavg())
  (out / f"overlap_probe_{date}.json").write_text(json.dumps(doc, indent=1))
  lines = [f"# Overlap probe, {date}", "",
           f"`python benchmarks/overlap_probe.py --rate {args.rate} --wire-mib {args.wire_mib:g} "
           f"--codec-mib {args.codec_mib:g} --reps {args.reps}`; 2 processes pinned to their own "
           f"cores, 1 codec thread, gloo, {net.note or 'tbf-shaped loopback in a netns'}; "
           f"load average at the end {os.getloadavg()[0]:.1f}. Medians of the slower process, ms.",
           "", "| XLA_FLAGS | codec | wire | codec | both | pipe | serial | overlap both | "
           "overlap pipe |", "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['flags']} | {r['kind']} | {r['wire']:.1f} | {r['codec']:.1f} | "
                 f"{r['both']:.1f} | {r['pipe']:.1f} | {r['serial']:.1f} | {r['overlap']:.2f} | "
                 f"{r['overlap_pipe']:.2f} |")
  (out / f"overlap_probe_{date}.md").write_text("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
