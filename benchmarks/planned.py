"""Planned transport (`zipccl_jax.jit`) vs the slot ladder vs plain lax, side by side.

    python benchmarks/planned.py [--layers 2,8,32] [--leaves 200] [--rounds 3] [--steps 20]
                                 [--state-mib 288]
    -> benchmarks/results/planned.md (+ .json)

On 8 simulated CPU devices, interleaved in the same run, `rounds` times (medians
reported; a shared 2-core machine is noisy). Compiles are timed in a fresh process
per variant (`compile_round`), the other measurements in this one:
1. Compile time of an FSDP step of an L-block transformer (width 512; each block
   all-gathers its flat bf16 unit, 3.1 M elements, and the gradient goes back by the
   all-gather's VJP, a reduce-scatter; 2 transports a block): lax (codec=None), the ladder (jax.jit, policy="always") and
   planned (zipccl_jax.jit): the planned program's compile, and the first call
   (measuring program: compile + run + plan) against lax's first call (compile + run).
2. Compile time of a data-parallel psum of `leaves` bf16 leaves, bucketed (the
   default) and with bucket_bytes=0 (every leaf its own transport).
3. Wire bytes of the planned slots against the rung the ladder takes, on gradient-like
   and weight-like bf16 data (all_gather and psum_scatter).
4. Step time of the 8-layer FSDP step (shared memory: the codec's cost, no link).
5. What a planned step's kept arguments cost: an Adam update of `--state-mib` MiB of
   f32 state (parameters and two moments) on one device, donated (as jax.jit, the
   ladder and steps of raw words run it) against kept (a planned step with a
   compressed site keeps its inputs for the re-run an overflow needs, so XLA writes
   the new state to fresh buffers instead of in place). In two fresh processes: with
   glibc's default malloc, and with `zipccl_jax.tune_host_allocator()` as the
   examples run (fresh buffers above glibc's mmap threshold are new pages, each
   faulted in on its first write, unless the threshold is raised).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402

if __package__:
  from benchmarks import common
else:  # run as a script: its folder is on sys.path
  import common  # type: ignore[no-redef]

N = 8
D = 512          # model width


def _mesh():
  return jax.make_mesh((N,), ("x",), axis_types=(AxisType.Auto,))


def _block(h, flat):
  """A pre-norm transformer block (single-head attention and a 4x MLP) whose four
  weight matrices are cut from one gathered flat unit."""
  sizes = [(D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)]
  mats, off = [], 0
  for a, b in sizes:
    mats.append(flat[off:off + a * b].reshape(a, b).astype(jnp.float32))
    off += a * b
  qkv, out, up, down = mats
  x = h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6)
  q, k, v = jnp.split(x @ qkv, 3, axis=-1)
  causal = -1e9 * jnp.triu(jnp.ones((SEQ, SEQ)), 1)
  att = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / np.sqrt(D) + causal, axis=-1)
  h = h + (att @ v) @ out
  x = h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6)
  return h + jax.nn.gelu(x @ up) @ down


UNIT = D * 3 * D + D * D + D * 4 * D + 4 * D * D   # elements of one layer's unit
SEQ = 64


def fsdp_step(mesh, layers: int, codec):
  """loss and gradients of an L-block transformer whose blocks are FSDP units: each
  block all-gathers its flat bf16 unit (one transport), and the all-gather's VJP
  reduce-scatters its gradient (one transport)."""
  kw = dict(codec=codec, policy="always")

  def loss(ws, x):
    h = x
    for w in ws:
      full = zc.compressed_all_gather(w, "x", tiled=True, **kw) if codec is not None else \
          jax.lax.all_gather(w, "x", tiled=True)
      h = _block(h, full)
    return jnp.mean(h * h)

  def body(ws, x):
    val, g = jax.value_and_grad(loss)(ws, x)
    return jax.lax.psum(val, "x"), g

  spec = [P("x")] * layers
  return lambda ws, x: jax.shard_map(body, mesh=mesh, in_specs=(spec, P("x")),
                                     out_specs=(P(), spec))(ws, x)


def fsdp_args(mesh, layers: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  ws = [jax.device_put((rng.standard_normal(UNIT) / np.sqrt(D)).astype(common.BF16),
                       NamedSharding(mesh, P("x"))) for _ in range(layers)]
  x = jax.device_put(rng.standard_normal((N * 2, SEQ, D)).astype(np.float32),
                     NamedSharding(mesh, P("x")))
  return ws, x


def dp_psum(mesh, leaves: int, codec, bucket_bytes=0):
  kw = dict(codec=codec, policy="always", bucket_bytes=bucket_bytes)

  def body(g):
    return zc.compressed_psum(g, "x", **kw) if codec is not None else jax.lax.psum(g, "x")

  return lambda g: jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P())(g)


def dp_args(mesh, leaves: int, seed: int = 1):
  rng = np.random.default_rng(seed)
  sizes = [4096 * (1 + i % 7) for i in range(leaves)]
  return [jax.device_put((rng.standard_normal(N * s) * 1e-3).astype(common.BF16),
                         NamedSharding(mesh, P("x"))) for s in sizes]


def _timed(fn):
  # garbage of earlier measurements (compiled programs, traces) is collected first,
  # so that no measurement pays for another's (it made the planned compile's time
  # grow from round to round)
  gc.collect()
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out)
  return time.perf_counter() - t0


def until_planned(planned, *args):
  """Runs `planned` (a zipccl_jax.jit function) through its measuring steps, so that
  its next call runs a plan, and waits for the builds it queued ahead (the raw-words
  program of its first comparison): a compile timed meanwhile would share the cores
  with them."""
  while not planned.is_planned(*args):
    jax.block_until_ready(planned(*args))
  while planned.building():
    time.sleep(0.05)


def _warm() -> None:
  """Pays a process's one-time costs (lazy imports, the first lowering and compile)
  on a tiny program, so that the first measurement of a fresh process does not."""
  mesh = _mesh()
  f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                            out_specs=P()))
  jax.block_until_ready(f(jnp.ones((N,), jnp.float32)))


def measure(case: str, variant: str) -> dict:
  """One variant's compile (and first-call) seconds of one case, in this process
  (`compile_round` gives each its own); or, case "donation:<MiB>:<steps>", the
  donated and kept Adam update's with the allocator `variant` ("default", "tuned")."""
  if case.startswith("donation:"):
    mib, steps = map(int, case.split(":")[1:])
    if variant == "tuned":
      zc.tune_host_allocator()   # before JAX's backend starts (it warns otherwise)
    return donation_times(mib, steps)
  _warm()
  make, args = case_for(_mesh(), case)
  if variant == "ladder":
    return {"ladder_compile": _timed(lambda: jax.jit(make("zipccl")).lower(*args).compile())}
  if variant == "lax":
    out = {"lax_compile": _timed(lambda: jax.jit(make(None)).lower(*args).compile())}
    jax.clear_caches()
    return {**out, "lax_first_call": _timed(lambda: jax.jit(make(None))(*args))}
  planned = zc.jit(make("zipccl"))
  out = {"planned_first_call": _timed(lambda: planned(*args))}   # measure: compile + run + plan
  until_planned(planned, *args)
  return {**out, "planned_compile": _timed(lambda: planned.lower(*args).compile())}


def compile_round(case: str) -> dict:
  """One round: compile (and first-call) seconds of lax, the ladder and planned, each
  variant in a fresh process, as a job compiles its step. In one process the earlier
  measurements (the ladder's 14 s compile, the garbage of earlier rounds) skewed the
  later ones: the 32-layer planned compile's ratio to lax's ranged 1.17-1.65x over
  three rounds."""
  out = {}
  for variant in ("lax", "ladder", "planned"):
    out.update(_fresh(case, variant))
  return out


def _fresh(case: str, variant: str) -> dict:
  """`measure(case, variant)` in a fresh process."""
  cmd = [sys.executable, os.path.abspath(__file__), "--measure", case, variant]
  res = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if res.returncode:
    raise RuntimeError(f"{case} {variant}: {res.stderr[-3000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


def case_for(mesh, case: str):
  """(make(codec) -> step function, its arguments) of a case: "fsdp:<layers>" or
  "dp:<leaves>:<bucket bytes, or 'default'>"."""
  kind, *p = case.split(":")
  if kind == "fsdp":
    layers = int(p[0])
    return (lambda c: fsdp_step(mesh, layers, c)), fsdp_args(mesh, layers)
  leaves, bb = int(p[0]), (None if p[1] == "default" else int(p[1]))
  return (lambda c: dp_psum(mesh, leaves, c, bb)), (dp_args(mesh, leaves),)


def wire_bytes(mesh, n: int) -> list:
  """Bytes per device of the ladder's rung vs the planned slot, per dataset and collective."""
  rng = np.random.default_rng(3)
  seg = 256
  data = {"gradient_like": rng.standard_t(3, (N, n)) * np.repeat(
              10.0 ** rng.uniform(-6, -3, (N, n // seg + 1)), seg, axis=1)[:, :n],
          "weight_gauss": rng.standard_normal((N, n)) * 0.02,
          "weight_scaled": rng.standard_normal((N, n)) * np.exp(rng.normal(-4, 1, (N, 1)))}
  rows = []
  for name, x in data.items():
    xb = jax.device_put(x.astype(common.BF16).reshape(-1), NamedSharding(mesh, P("x")))
    for coll in ("all_gather", "psum_scatter"):
      def call(v, stats, coll=coll):
        f = zc.compressed_all_gather if coll == "all_gather" else zc.compressed_psum_scatter
        kw = dict(tiled=True, policy="always", stats=stats)
        return f(v, "x", **kw) if coll == "all_gather" else f(v, "x", scatter_dimension=0, **kw)
      ladder = jax.jit(jax.shard_map(lambda v: call(v, True), mesh=mesh, in_specs=P("x"),
                                     out_specs=(P("x"), P())))
      _, st = ladder(xb)
      ladder_b = int(st.wire_bytes) - st.agree_bytes
      planned = zc.jit(jax.shard_map(lambda v: call(v, False), mesh=mesh, in_specs=P("x"),
                                     out_specs=P("x")))
      until_planned(planned, xb)
      planned(xb)
      (site,) = planned.site_stats()
      peers = N - 1 if coll == "psum_scatter" else 1   # rows handed to XLA per device (CPU)
      planned_b = (site.slot_bytes or site.raw_bytes) * peers
      rows.append(dict(data=name, collective=coll, ladder=ladder_b, planned=planned_b,
                       ratio=planned_b / ladder_b))
  return rows


def step_times(mesh, layers: int, steps: int) -> dict:
  ws, x = fsdp_args(mesh, layers)
  fns = {"lax": jax.jit(fsdp_step(mesh, layers, None)),
         "ladder": jax.jit(fsdp_step(mesh, layers, "zipccl")),
         "planned": zc.jit(fsdp_step(mesh, layers, "zipccl"))}
  until_planned(fns["planned"], ws, x)
  for f in fns.values():   # compile (the planned program too)
    jax.block_until_ready(f(ws, x))
    jax.block_until_ready(f(ws, x))
  times = {k: [] for k in fns}
  for _ in range(steps):
    for k, f in fns.items():
      times[k].append(_timed(lambda f=f: f(ws, x)))
  return {k: statistics.median(v) for k, v in times.items()}


def adam_state(mib: int, leaves: int = 8) -> tuple:
  """(params, first moments, second moments): `leaves` f32 leaves, `mib` MiB in all."""
  n = (mib << 20) // (3 * 4 * leaves)
  ps = [jnp.full((n,), 0.01 * (i + 1), jnp.float32) for i in range(leaves)]
  return ps, [jnp.zeros_like(p) for p in ps], [jnp.zeros_like(p) for p in ps]


def adam_update(state):
  """One Adam step on a synthetic gradient (read from the parameters in-program)."""
  ps, ms, vs = state
  gs = [1e-3 * p for p in ps]
  ms = [0.9 * m + 0.1 * g for m, g in zip(ms, gs)]
  vs = [0.999 * v + 0.001 * g * g for v, g in zip(vs, gs)]
  return [p - 1e-3 * m / (jnp.sqrt(v) + 1e-8) for p, m, v in zip(ps, ms, vs)], ms, vs


def donation_times(mib: int, steps: int) -> dict:
  """Median seconds of `adam_update` donated vs kept, interleaved step by step."""
  fns = {"donated": jax.jit(adam_update, donate_argnums=0), "kept": jax.jit(adam_update)}
  states = {k: jax.tree.map(jnp.copy, adam_state(mib)) for k in fns}
  times = {k: [] for k in fns}
  for i in range(steps + 2):   # the first two: compile and first touch
    for k, f in fns.items():
      t0 = time.perf_counter()
      states[k] = jax.block_until_ready(f(states[k]))
      if i >= 2:
        times[k].append(time.perf_counter() - t0)
  same = all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
             for x, y in zip(jax.tree.leaves(states["donated"]), jax.tree.leaves(states["kept"])))
  return {**{k: statistics.median(v) for k, v in times.items()}, "same_bits": same}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", default="2,8,32")
  ap.add_argument("--leaves", type=int, default=200)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--state-mib", type=int, default=288,
                  help="optimizer state of the donation measurement (default 288 MiB: a "
                       "25 M-parameter model's f32 parameters and Adam moments)")
  ap.add_argument("--out", default=common.RESULTS)
  ap.add_argument("--measure", nargs=2, metavar=("CASE", "VARIANT"),
                  help="internal: one variant's compile times of one case, as JSON")
  args = ap.parse_args(argv)
  if args.measure:
    print(json.dumps(measure(*args.measure)))
    return 0
  mesh = _mesh()
  info = common.machine_info()
  doc = {"machine": info, "compile": {}, "wire": [], "step_s": {}}
  cases = [(f"fsdp {L} layers", f"fsdp:{L}") for L in map(int, args.layers.split(","))]
  for bb, label in (("default", "buckets (default)"), (0, "bucket_bytes=0")):
    cases.append((f"dp psum {args.leaves} leaves, {label}", f"dp:{args.leaves}:{bb}"))
  for name, case in cases:
    runs = []
    for r in range(args.rounds):
      runs.append(compile_round(case))
      common.log(f"{name} round {r}: " + ", ".join(f"{k} {v:.2f} s" for k, v in runs[-1].items()))
    doc["compile"][name] = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
  doc["wire"] = wire_bytes(mesh, 1 << 16)
  doc["step_s"] = step_times(mesh, 8, args.steps)
  doc["donation_s"] = {malloc: _fresh(f"donation:{args.state_mib}:{args.steps}", malloc)
                       for malloc in ("default", "tuned")}

  lines = [f"# Planned transport vs ladder vs lax ({info['date']})", "",
           f"8 simulated CPU devices, one process; {info['cpu']}, {info['usable_cores']} cores, "
           f"load {info.get('loadavg_1m')}; jax {info['versions'].get('jax')}. Medians of "
           f"{args.rounds} interleaved rounds; each compile in a fresh process (after a "
           "tiny program's compile), the rest in one.", "",
           "## Compile time (s) and first call", "",
           "| program | lax | ladder | planned | ladder / lax | planned / lax | first call: lax | "
           "planned (measure) | planned / lax |", "|---|---|---|---|---|---|---|---|---|"]
  for name, c in doc["compile"].items():
    lines.append(f"| {name} | {c['lax_compile']:.2f} | {c['ladder_compile']:.2f} | "
                 f"{c['planned_compile']:.2f} | {c['ladder_compile'] / c['lax_compile']:.2f}x | "
                 f"{c['planned_compile'] / c['lax_compile']:.2f}x | {c['lax_first_call']:.2f} | "
                 f"{c['planned_first_call']:.2f} | {c['planned_first_call'] / c['lax_first_call']:.2f}x |")
  lines += ["", "## Wire bytes per device: planned slot vs the ladder's rung", "",
            "| data | collective | ladder (B) | planned (B) | planned / ladder |", "|---|---|---|---|---|"]
  for w in doc["wire"]:
    lines.append(f"| {w['data']} | {w['collective']} | {w['ladder']} | {w['planned']} | {w['ratio']:.3f} |")
  s = doc["step_s"]
  lines += ["", "## FSDP step, 8 layers, shared memory (median s)", "",
            "| lax | ladder | planned | ladder / lax | planned / lax |", "|---|---|---|---|---|",
            f"| {s['lax']:.4f} | {s['ladder']:.4f} | {s['planned']:.4f} | "
            f"{s['ladder'] / s['lax']:.2f}x | {s['planned'] / s['lax']:.2f}x |"]
  lines += ["", f"## Kept vs donated state: an Adam update of {args.state_mib} MiB of f32 state "
            "(median ms)", "",
            "| malloc | donated (jax.jit, ladder, raw words) | kept (planned step) | "
            "kept / donated | same bits |", "|---|---|---|---|---|"]
  for malloc, d in doc["donation_s"].items():
    name = ("glibc's default" if malloc == "default"
            else "tuned (zipccl_jax.tune_host_allocator, as the examples run)")
    lines.append(f"| {name} | {d['donated'] * 1e3:.1f} | {d['kept'] * 1e3:.1f} | "
                 f"{d['kept'] / d['donated']:.2f}x | {'yes' if d['same_bits'] else 'NO'} |")
  lines.append("")
  common.write_report(args.out, "planned", "\n".join(lines), doc)
  return 0


if __name__ == "__main__":
  sys.exit(main())
