"""Switch structures for the slot ladder, compared by program size (prototypes).

    python benchmarks/ladder_structures.py
    -> benchmarks/results/ladder_structures_<date>.md (+ .json)

The library's transport (zipccl_jax/_src/transport.py) runs one `lax.switch` per
call whose branch k moves payload[:, :slot_k] and decodes it. This benchmark
builds, outside the library, the same encode -> agree -> switch -> decode program
for an all-gather of one 131,072-element bf16 row and an all-to-all of 8 rows of
16,384 elements (8 simulated CPU devices) in three structures, and reports the
kernels XLA:CPU compiles (`ladder.kernel_count`, exact), the compiled HLO size and
one compile time (noisy on a shared machine):

* per-rung: the library's structure, the library's ladder (a decoder per branch);
* decode-once: each branch moves its slot and pads it to the widest slot; one
  decoder (or the raw words) after the switch;
* two-level K1 x K2: a switch over K1 coarse prefixes (padded to the widest
  size), then a switch over K2 fine remainders at a dynamic offset
  (dynamic-slice, collective, dynamic-update-slice), one decoder after them:
  K1 + K2 branches for K1 x K2 sizes, at the price of a second collective.

Every structure decodes what it moved (the programs run once on Gaussian data and
are checked bit-exact against the input) so XLA cannot drop a branch.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

if __package__:
  from benchmarks import common, ladder
else:
  import common  # type: ignore[no-redef]
  import ladder  # type: ignore[no-redef]

N = 8


def build(kind: str, coll: str, k1: int = 0, k2: int = 0):
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import PartitionSpec as P
  import zipccl_jax as zc
  from zipccl_jax._src import transport
  R, m = (N, 16384) if coll == "all_to_all" else (1, 131072)
  mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  if coll == "all_to_all":
    move = lambda a: lax.all_to_all(a, "x", 0, 0, tiled=True)
  else:
    move = lambda a: lax.all_gather(a[0], "x")
  rungs = list(transport.ladder(zc.min_nbytes(jnp.bfloat16, m), 2 * m,
                                all_to_all=coll == "all_to_all"))
  if kind == "two-level":
    step = -(-(rungs[-1] - rungs[0]) // (k1 * k2) // 128) * 128
    coarse = [rungs[0] + i * k2 * step for i in range(k1)]
    fine = [j * step for j in range(k2)]
    sizes = sorted({c + f for c in coarse for f in fine})
  else:
    sizes = rungs
  width = max(sizes)
  words = lambda rows: lax.bitcast_convert_type(rows, jnp.uint16)
  raw = lambda rows: lax.bitcast_convert_type(move(words(rows)), jnp.bfloat16)

  def prog(v):
    rows = v.reshape(R, m)
    p, st = zc.encode_rows(rows)
    used = lax.pmax(jnp.max(st[:, 2]), "x") * 128
    is_raw = used > width
    dec = lambda b: zc.decode_rows(b, m, jnp.bfloat16)[0]
    if kind == "per-rung":
      idx = jnp.sum(used > jnp.asarray(sizes)).astype(jnp.int32)
      br = [lambda p, s=s: dec(move(p[:, :s])) for s in sizes] + [lambda p: raw(rows)]
      return lax.switch(idx, br, p)
    if kind == "decode-once":
      idx = jnp.minimum(jnp.sum(used > jnp.asarray(sizes)), len(sizes) - 1).astype(jnp.int32)
      got = lax.switch(idx, [lambda p, s=s: jnp.pad(move(p[:, :s]), ((0, 0), (0, width - s)))
                             for s in sizes], p)
      return lax.cond(is_raw, lambda g: raw(rows), dec, got)
    i = jnp.clip((used - coarse[0]) // (k2 * step), 0, k1 - 1).astype(jnp.int32)
    c = jnp.asarray(coarse, jnp.int32)[i]
    j = jnp.clip(-(-(used - c) // step), 0, k2 - 1).astype(jnp.int32)
    buf = lax.switch(i, [lambda p, s=s: jnp.pad(move(p[:, :s]), ((0, 0), (0, width - s)))
                         for s in coarse], p)

    def fine_branch(f):
      def b(p, buf):
        if f == 0:
          return buf
        return lax.dynamic_update_slice(buf, move(lax.dynamic_slice(p, (0, c), (R, f))), (0, c))
      return b
    buf = lax.switch(j, [fine_branch(f) for f in fine], p, buf)
    return lax.cond(is_raw, lambda g: raw(rows), dec, buf)

  f = jax.jit(jax.shard_map(prog, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))
  return f, jax.ShapeDtypeStruct((N * R * m,), jnp.bfloat16), len(sizes), len(
      sizes) + 1 if kind != "two-level" else k1 + k2 + 2


def main(argv=None) -> int:
  import jax
  jax.config.update("jax_num_cpu_devices", N)
  import jax.numpy as jnp
  info = common.machine_info()
  cases = [("per-rung", "all_gather"), ("decode-once", "all_gather"),
           ("two-level", "all_gather", 3, 3), ("two-level", "all_gather", 4, 4),
           ("per-rung", "all_to_all"), ("decode-once", "all_to_all"),
           ("two-level", "all_to_all", 3, 4), ("two-level", "all_to_all", 5, 4)]
  rows, ok = [], True
  for case in cases:
    f, shape, n_sizes, n_branches = build(*case)
    lowered = f.lower(shape)
    t0 = time.perf_counter()
    comp = lowered.compile()
    dt = time.perf_counter() - t0
    text = comp.as_text()
    x = (np.random.default_rng(0).standard_normal(shape.shape) * 0.02).astype(np.float32)
    xb = jnp.asarray(x).astype(jnp.bfloat16)
    y = np.asarray(comp(xb)).view(np.uint16)
    if case[1] == "all_gather":   # every device gathered all rows: the input, N times
      want = np.tile(np.asarray(xb).view(np.uint16).reshape(N, -1), (N, 1)).reshape(-1)
    else:                          # the all-to-all of an [N*N, m] split: a transpose of blocks
      want = np.asarray(xb).view(np.uint16).reshape(N, N, -1).transpose(1, 0, 2).reshape(-1)
    exact = bool(np.array_equal(y.reshape(-1), want))
    ok &= exact
    name = case[0] + (f" {case[2]} x {case[3]}" if case[0] == "two-level" else "")
    rows.append(dict(structure=name, collective=case[1], sizes=n_sizes, branches=n_branches,
                     kernels=ladder.kernel_count(text), hlo_chars=len(text), compile_s=dt,
                     exact=exact))
    common.log(f"{case[1]} {name}: {n_sizes} sizes, {rows[-1]['kernels']} kernels, "
               f"{len(text)} HLO chars, {1e3 * dt:.0f} ms, exact {exact}")
  lines = [f"# Slot-ladder switch structures: program size ({common.today()})", "",
           f"Machine: {info['cpu']}, {info['cores']} cores, load average "
           f"{info.get('loadavg_1m', '?')} (shared: the single compile times are noisy; the "
           "kernel counts are exact). 8 simulated CPU devices, bf16; all_gather: one row of "
           "131,072 elements per device; all_to_all: 8 rows of 16,384. *sizes*: slot sizes "
           "the structure can send (raw excluded); *branches*: switch and cond branches "
           "(raw included). See the module docstring of benchmarks/ladder_structures.py.", "",
           "| collective | structure | sizes | branches | kernels | HLO chars | compile ms (one) "
           "| bit-exact |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['collective']} | {r['structure']} | {r['sizes']} | {r['branches']} | "
                 f"{r['kernels']} | {r['hlo_chars']} | {1e3 * r['compile_s']:.0f} | "
                 f"{'yes' if r['exact'] else 'NO'} |")
  lines += ["", "Reproduce: `python benchmarks/ladder_structures.py`", ""]
  path = os.path.join(common.RESULTS, f"ladder_structures_{common.today()}.md")
  common.write_lines(path, lines)
  with open(path[:-3] + ".json", "w") as fh:
    json.dump(dict(machine=info, rows=rows), fh, indent=1)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
