"""How fresh memory changes the time of one compressed collective on XLA:CPU.

A compressed call touches more memory than a raw one (the worst-case payload,
the gathered slots, the decoded rows), and every first touch of a 4 KiB page is a
fault in which the kernel zeroes the page. How many of its pages are fresh depends
on what else the process allocates. This benchmark times compressed_all_gather
(codec "zipccl" vs "raw", policy "always") between 2 processes pinned to their own
cores inside a 1 Gbit/s network namespace (examples/launch.py) in five settings:

  alone        each variant in processes of its own, zc.tune_host_allocator()
  interleaved  both variants alternating in the same processes (as
               benchmarks/netns_bench.py runs them), tuned allocator
  default      interleaved, glibc's allocator defaults
  hugetlb      interleaved, glibc defaults + GLIBC_TUNABLES=glibc.malloc.hugetlb=1
               (transparent huge pages for malloc's mappings; read at process
               start, so only a launcher can set it)
  arena1       interleaved, tuned allocator + GLIBC_TUNABLES=glibc.malloc.arena_max=1:
               one malloc arena for all threads. A thread arena's heaps are at
               most 64 MiB, so a larger buffer that XLA's worker threads allocate
               is mmap'd (fresh pages) whatever the mmap threshold; the main
               arena grows with brk and keeps freed memory for reuse

and writes benchmarks/results/fresh_memory_<date>.md (zipccl / raw per repeat:
the settings alternate, so load drifts hit all of them). Every result is checked
against the input (bit-exact gather) by the workers.

    sudo python benchmarks/fresh_memory.py [--mib 64] [--rounds 15] [--repeats 3]

Needs root and iproute2 for the namespace (as examples/launch.py --netns).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

SETTINGS = {
    "alone": dict(mode="alone", tune="1", glibc=""),
    "interleaved": dict(mode="interleaved", tune="1", glibc=""),
    "default": dict(mode="interleaved", tune="0", glibc=""),
    "hugetlb": dict(mode="interleaved", tune="0", glibc="glibc.malloc.hugetlb=1"),
    "arena1": dict(mode="interleaved", tune="1", glibc="glibc.malloc.arena_max=1"),
}


def worker() -> None:
  """One process of a setting: prints {"codec": median seconds} as JSON (process 0)."""
  import launch  # examples/launch.py
  # tuned: zc.tune_host_allocator() before JAX starts its backend (its arena limit
  # only binds threads that have not allocated yet)
  launch.init_jax(malloc="tuned" if os.environ["FM_TUNE"] == "1" else "default")
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P

  import zipccl_jax as zc
  mesh = jax.make_mesh((jax.device_count(),), ("dp",))
  sh = NamedSharding(mesh, P("dp"))
  n = int(float(os.environ["FM_MIB"]) * 2**20) // 2
  me = jax.process_index()
  mine = (np.random.default_rng(me).standard_normal(n) * 0.02).astype(jnp.bfloat16)
  x = jax.make_array_from_process_local_data(sh, mine)
  codecs = os.environ["FM_CODECS"].split(",")
  fns = {c: jax.jit(jax.shard_map(
      lambda v, c=c: zc.compressed_all_gather(v, "dp", tiled=True, to="invarying", codec=c,
                                              policy="always"),
      mesh=mesh, in_specs=P("dp"), out_specs=P())) for c in codecs}
  bar = jax.jit(jax.shard_map(lambda v: lax.psum(v, "dp"), mesh=mesh, in_specs=P("dp"),
                              out_specs=P("dp")))
  one = jax.make_array_from_process_local_data(sh, np.zeros(1, np.int32))
  want = np.concatenate([(np.random.default_rng(p).standard_normal(n) * 0.02).astype(jnp.bfloat16)
                         for p in range(jax.process_count())]).view(np.uint16)
  for f in fns.values():
    y = np.asarray(f(x).addressable_shards[0].data).view(np.uint16)
    if not np.array_equal(y, want):
      raise SystemExit("fresh_memory: a gather differs from the inputs")
  times = {c: [] for c in codecs}
  for _ in range(int(os.environ["FM_ROUNDS"])):
    for c, f in fns.items():
      jax.block_until_ready(bar(one))
      t = time.perf_counter()
      y = f(x)
      jax.block_until_ready(y)
      times[c].append(time.perf_counter() - t)
      del y
  if me == 0:
    print("FM_RESULT " + json.dumps({c: statistics.median(v) for c, v in times.items()}),
          flush=True)


def run_setting(name: str, args) -> float:
  """zipccl / raw of one setting (one or two launches)."""
  import launch  # examples/launch.py
  s = SETTINGS[name]
  groups = [["zipccl"], ["raw"]] if s["mode"] == "alone" else [["zipccl", "raw"]]
  med = {}
  for codecs in groups:
    env = dict(FM_WORKER="1", FM_TUNE=s["tune"], FM_MIB=str(args.mib), FM_ROUNDS=str(args.rounds),
               FM_CODECS=",".join(codecs))
    if s["glibc"]:
      env["GLIBC_TUNABLES"] = s["glibc"]
    logdir = Path(args.logdir) / f"{name}_{'_'.join(codecs)}_{time.monotonic_ns()}"
    launch.launch([sys.executable, str(Path(__file__).resolve())], 2, netns=args.netns,
                  pin=True, env=env, echo=False, logdir=logdir, cwd=str(ROOT))
    line = [ln for ln in (logdir / "worker0.log").read_text().splitlines()
            if ln.startswith("FM_RESULT ")][-1]
    med.update(json.loads(line[len("FM_RESULT "):]))
  return med["zipccl"], med["raw"]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--mib", type=float, default=64.0, help="bf16 MiB per process")
  ap.add_argument("--rounds", type=int, default=15, help="calls per variant per launch")
  ap.add_argument("--repeats", type=int, default=3, help="launches per setting (alternating)")
  ap.add_argument("--netns", default="1gbit", help="examples/launch.py --netns rate")
  ap.add_argument("--logdir", default="/tmp/zipccl_fresh_memory")
  ap.add_argument("--out", default=None)
  ap.add_argument("--settings", default=",".join(SETTINGS),
                  help=f"comma-separated subset of {', '.join(SETTINGS)} (default: all)")
  args = ap.parse_args(argv)
  sys.path.insert(0, str(ROOT))
  from benchmarks import common
  chosen = [x.strip() for x in args.settings.split(",") if x.strip()]
  if not chosen or any(x not in SETTINGS for x in chosen):
    ap.error(f"--settings: choose from {', '.join(SETTINGS)}, got {args.settings!r}")
  rows = {name: [] for name in chosen}
  t0 = time.monotonic()
  for r in range(args.repeats):
    for name in chosen:
      z, raw = run_setting(name, args)
      rows[name].append((z, raw))
      common.log(f"repeat {r + 1}/{args.repeats} {name}: zipccl {1e3 * z:.0f} ms, raw "
                 f"{1e3 * raw:.0f} ms, ratio {z / raw:.3f}")
  out = Path(args.out or ROOT / "benchmarks" / "results" / f"fresh_memory_{common.today()}.md")
  lines = [f"# Fresh memory and one compressed all_gather on XLA:CPU ({common.today()})", "",
           "Machine: {cpu}, {usable_cores} usable cores, 1-min load average {loadavg_1m} at the "
           "end; jax {jax}.".format(jax=common.machine_info()["versions"]["jax"],
                                    **common.machine_info()), "",
           f"2 processes pinned to their own cores, one codec thread each, network namespace "
           f"shaped to {args.netns}; compressed_all_gather of {args.mib:g} MiB of Gaussian bf16 per "
           f"process, codec 'zipccl' vs 'raw' (policy 'always'); per launch the median of "
           f"{args.rounds} calls, each after a barrier; settings alternate within every repeat. "
           f"Results checked bit for bit against the inputs. Wall {time.monotonic() - t0:.0f} s.", "",
           "| setting | what | zipccl / raw per repeat | zipccl ms | raw ms |",
           "|---|---|---|---|---|"]
  what = {"alone": "each variant in its own processes, tune_host_allocator()",
          "interleaved": "both variants in the same processes, tune_host_allocator()",
          "default": "interleaved, glibc defaults",
          "hugetlb": "interleaved, glibc defaults + GLIBC_TUNABLES=glibc.malloc.hugetlb=1",
          "arena1": "interleaved, tune_host_allocator() + GLIBC_TUNABLES=glibc.malloc.arena_max=1"}
  for name, vals in rows.items():
    lines.append(f"| {name} | {what[name]} | " + ", ".join(f"{z / r:.3f}" for z, r in vals) +
                 f" | {', '.join(f'{1e3 * z:.0f}' for z, _ in vals)} | "
                 f"{', '.join(f'{1e3 * r:.0f}' for _, r in vals)} |")
  lines += ["", f"Reproduce: `sudo python benchmarks/fresh_memory.py --mib {args.mib:g} --rounds "
            f"{args.rounds} --repeats {args.repeats} --settings {args.settings}`"]
  common.write_lines(str(out), lines)
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  if os.environ.get("FM_WORKER") == "1":
    worker()
  else:
    sys.exit(main())
