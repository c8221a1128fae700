"""All-to-all rungs on XLA:CPU: N - 1 collective permutes vs lax.all_to_all (run time).

Since 2026-12-01 a compressed all-to-all transport (psum_scatter, all_to_all,
psum's reduce-scatter) moves every rung on CPU as N - 1 collective permutes of
slot-sized rows cut and placed by the "zipccl_row_split" / "zipccl_row_join"
custom calls (zipccl_jax/_src/transport.py, `a2a_slot`), which compile to no
kernel, where an XLA all-to-all compiles N per-peer slices and a concatenate per
rung (the compile side: benchmarks/ladder.py, "before" column). This measures the
run-time side: the same compressed call, compiled both ways in one process
(`transport._A2A_PERMUTES`), both programs with the library's ladder, called
interleaved on the same device-resident input, medians over --reps calls, over
2, 4 and 8 simulated CPU devices (in-process collectives: each permute is a
rendezvous of the device threads and a memcpy). Results are checked bit-equal.

    python benchmarks/a2a_permutes.py [--reps 30] [--rows 256]

Writes benchmarks/results/a2a_permutes_<date>.md and .json. Timings on a shared
2-core machine are noisy: medians, and the load average is in the machine info.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script: its folder is on sys.path
  import common  # type: ignore[no-redef]

MAX_DEVICES = 8


def measure(devices: int, rows: int, reps: int) -> list:
  """[{collective, devices, rows, lax_ms, permutes_ms, ratio}] for one mesh size."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  import zipccl_jax as zc
  from zipccl_jax._src import transport
  mesh = jax.make_mesh((devices,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:devices])
  x = (np.random.default_rng(0).standard_normal((devices * rows, 1024)) * 0.02).astype(jnp.bfloat16)
  x = jax.device_put(x, NamedSharding(mesh, P("x")))
  calls = {"psum_scatter": lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, policy="always"),
           "all_to_all": lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, policy="always")}
  out = []
  for name, fn in calls.items():
    progs = {}
    try:
      for permutes in (False, True):
        transport._A2A_PERMUTES = permutes   # pylint: disable=protected-access
        progs[permutes] = jax.jit(jax.shard_map(lambda v, fn=fn: fn(v), mesh=mesh, in_specs=P("x"),
                                                out_specs=P("x"))).lower(x).compile()
    finally:
      transport._A2A_PERMUTES = True   # pylint: disable=protected-access
    a, b = (np.asarray(progs[p](x)).view(np.uint16) for p in (False, True))
    if not np.array_equal(a, b):
      raise AssertionError(f"{name} over {devices} devices: permutes and lax.all_to_all differ")
    times = {False: [], True: []}
    for r in range(reps + 2):
      for p in ((False, True) if r % 2 else (True, False)):
        t0 = time.perf_counter()
        jax.block_until_ready(progs[p](x))
        if r >= 2:
          times[p].append(time.perf_counter() - t0)
    lax_s, perm_s = statistics.median(times[False]), statistics.median(times[True])
    out.append(dict(collective=name, devices=devices, rows=rows, lax_ms=1e3 * lax_s,
                    permutes_ms=1e3 * perm_s, ratio=perm_s / lax_s))
    common.log(f"{name} over {devices} devices: lax.all_to_all {1e3 * lax_s:.2f} ms, permutes "
               f"{1e3 * perm_s:.2f} ms ({perm_s / lax_s:.3f}x)")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=30, help="timed calls per program (median)")
  ap.add_argument("--rows", type=int, default=256, help="bf16 rows of 1024 per device")
  ap.add_argument("--out", default=common.RESULTS)
  args = ap.parse_args(argv)
  import jax
  jax.config.update("jax_num_cpu_devices", MAX_DEVICES)
  info = common.machine_info()
  rows = [r for d in (2, 4, 8) for r in measure(d, args.rows, args.reps)]
  lines = [f"# All-to-all rungs on XLA:CPU: N - 1 permutes vs lax.all_to_all ({common.today()})", "",
           f"Compressed calls (codec zipccl, policy=\"always\") on bf16 [{args.rows}, 1024] per "
           "device (Gaussian, scale 0.02), both programs with the library's ladder, compiled in "
           f"one process and called interleaved; median of {args.reps} calls each. *ratio* = "
           "permutes / lax.all_to_all (> 1: the permutes are slower). Results bit-equal.", "",
           "| collective | devices | lax.all_to_all ms | permutes ms | ratio |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['collective']} | {r['devices']} | {r['lax_ms']:.2f} | {r['permutes_ms']:.2f} | "
                 f"**{r['ratio']:.3f}** |")
  lines += ["", f"Machine: {info['cpu']}, {info['cores']} cores, load average "
            f"{info.get('loadavg_1m', '?')} (1 min) at the start, jax "
            f"{info['versions'].get('jax', '?')}, {info['date']}.", "",
            f"Reproduce: `python benchmarks/a2a_permutes.py --reps {args.reps} --rows {args.rows}`"]
  path = os.path.join(args.out, f"a2a_permutes_{common.today()}.md")
  common.write_lines(path, lines)
  with open(path[:-3] + ".json", "w") as f:
    json.dump(dict(machine=info, rows=rows), f, indent=1, default=str)
  return 0


if __name__ == "__main__":
  sys.exit(main())
