"""Slot-ladder transport benchmark: wire ratios of the rung actually taken, and compile time.

    python benchmarks/ladder.py [--elements N] [--example-steps S] [--compile-runs R]
    -> benchmarks/results/ladder.md (+ .json)

1. Wire ratios. all_gather, psum_scatter and psum over 8 simulated CPU devices with
   the library defaults (codec="zipccl", policy="auto") on bf16 data: Gaussian,
   Laplace, Student-t(3), zero-heavy, gradient-like (mixed scales inside blocks) and
   weight-like (Gaussian, per-tensor scales). The bytes of a call are those of the
   rung its stats report, checked against the compiled HLO (`hlo_wire_bytes(...)
   .taken(rungs)`); the ratio is raw (codec="raw": the same collectives on uint16
   words) over that.
2. Compile time (median) and program size of one collective: the compressed
   ladder transport, codec="raw" and the plain lax collective, compiled interleaved
   in the same run.
3. The FSDP example on the ladder (examples/train_fsdp.py --quick --codec zipccl
   --ladder): bytes per step on its smallest and raw rungs, vs raw, and whether the
   two runs are bit-identical.

CPU timings on a shared machine are noisy: medians, and the load average is printed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script (python benchmarks/ladder.py): its folder is on sys.path
  import common  # type: ignore[no-redef]

N = 8
HERE = os.path.dirname(os.path.abspath(__file__))


def datasets(n: int, seed: int = 0) -> dict:
  """name -> float32[N, n] (one block per device); converted to bf16 by the caller."""
  rng = np.random.default_rng(seed)
  out = {
      "gaussian": rng.standard_normal((N, n)) * 0.02,
      "laplace": rng.laplace(0, 0.02, (N, n)),
      "student_t3": rng.standard_t(3, (N, n)) * 0.02,
  }
  z = rng.standard_normal((N, n)) * 0.02
  z[rng.random((N, n)) < 0.7] = 0
  out["zero_heavy"] = z
  # gradients: Student-t values whose scale changes every 256 elements over 3 decades
  # (fused projections mix scales inside a codec block)
  seg = 256
  scales = 10.0 ** rng.uniform(-6, -3, (N, n // seg + 1))
  out["gradient_like"] = rng.standard_t(3, (N, n)) * np.repeat(scales, seg, axis=1)[:, :n]
  # weights: Gaussian with a per-device (per-tensor) scale
  out["weight_like"] = rng.standard_normal((N, n)) * 10.0 ** rng.uniform(-2.5, -1, (N, 1))
  return {k: v.astype(np.float32) for k, v in out.items()}


def _programs(jax, zc, mesh, P, codec_name="zipccl"):
  def ag(codec):
    return lambda v: zc.compressed_all_gather(v, "x", tiled=True, to="invarying", codec=codec,
                                              stats=True)

  def rs(codec):
    return lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec=codec, stats=True)

  def ps(codec):
    return lambda v: zc.compressed_psum(v, "x", codec=codec, stats=True)

  specs = {"all_gather": (ag, P()), "psum_scatter": (rs, P("x")), "psum": (ps, P())}
  return {name: {codec: jax.jit(jax.shard_map(make(codec), mesh=mesh, in_specs=P("x"),
                                              out_specs=(out, P())))
                 for codec in (codec_name, "raw")}
          for name, (make, out) in specs.items()}


def wire_ratios(n: int, codec: str = "zipccl") -> list:
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  import zipccl_jax as zc
  mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  progs = _programs(jax, zc, mesh, P, codec)
  rows = []
  data = datasets(n)
  for name, by_codec in progs.items():
    compiled = {c: f.lower(jax.ShapeDtypeStruct((N * n,), jnp.bfloat16)).compile()
                for c, f in by_codec.items()}
    hlo = {c: zc.hlo_wire_bytes(comp.as_text()) for c, comp in compiled.items()}
    for kind, x in data.items():
      xb = jnp.asarray(x.reshape(-1)).astype(jnp.bfloat16)
      y, s = compiled[codec](xb)
      y_raw, _ = compiled["raw"](xb)
      same = np.array_equal(np.asarray(y).view(np.uint16), np.asarray(y_raw).view(np.uint16))
      rung = [int(r) for r in np.asarray(s.rung).reshape(-1)]
      # which HLO switch is which transport: psum has the all-to-all one first (on
      # CPU its rungs are collective permutes: row_ops.a2a_slot)
      order = {("all-to-all",): 0, ("collective-permute",): 0, ("all-gather",): len(rung) - 1}
      choice = [rung[order[c.opcodes]] for c in hlo[codec].conditionals]
      wire_hlo = hlo[codec].taken(choice) if s.compressed else hlo[codec].common
      wire = int(s.wire_bytes)
      # the raw rung of the same transports (on CPU an all-to-all transport's rungs
      # hand over N - 1 rows, codec="raw"'s lax all-to-all N)
      raw = sum(int(t[-1]) for t in s.slots) if s.compressed else hlo["raw"].common
      rows.append(dict(codec=codec, collective=name, data=kind, n=n, compressed=bool(s.compressed), rung=rung,
                       rungs=[len(t) for t in s.slots], raw_rung=bool(np.any(s.raw_rung)),
                       used=[int(u) for u in np.asarray(s.used_bytes).reshape(-1)],
                       slot=[int(v) for v in np.asarray(s.slot_bytes).reshape(-1)],
                       wire=wire, wire_hlo=int(wire_hlo), raw=int(raw), ratio=raw / wire,
                       escape_rate=float(s.escape_rate), identical_to_raw=bool(same)))
      common.log(f"{codec} {name} {kind}: rung {rung} ratio {raw / wire:.3f} (HLO {wire_hlo} B, stats "
                 f"{wire} B, raw {raw} B) escapes {100 * float(s.escape_rate):.1f}%")
  return rows


# Ops of a compiled XLA:CPU module that are no kernel of their own (views, control
# flow, collectives, FFI calls); every other op outside a fusion body is one
# LLVM-compiled kernel, which is what a compile spends its time on.
_NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "conditional",
                "all-gather", "all-gather-start", "all-gather-done", "all-to-all", "all-reduce",
                "all-reduce-start", "all-reduce-done", "collective-permute",
                "collective-permute-start", "collective-permute-done", "custom-call", "while",
                "call", "after-all", "partition-id", "replica-id", "opt-barrier"}


def kernel_count(text: str) -> int:
  """Kernels XLA:CPU compiles for a module: ops outside fusion bodies that are not
  views, control flow, collectives or custom calls (a proxy for compile work; XLA
  compiles identical kernels once, this counts them all)."""
  import re
  fused = set(re.findall(r"calls=%([\w.\-]+)", text))
  count, comp = 0, None
  for line in text.splitlines():
    m = re.match(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$", line)
    if m:
      comp = m.group(1)
      continue
    if comp is None or comp in fused:
      continue
    m = re.match(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(?:\(.*?\)|\S+)\s+([\w\-]+)\(", line)
    if m and m.group(1) not in _NOT_KERNELS:
      count += 1
  return count


def compile_times(runs: int) -> dict:
  """Compile time and program size of one collective, three programs per collective
  compiled in the same run, interleaved (the load of a shared machine changes by the
  minute): the compressed ladder transport ("zipccl"), the same algorithm uncompressed
  (codec="raw") and the plain lax collective (codec=None)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  import zipccl_jax as zc
  mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  ring = [(i, (i + 1) % N) for i in range(N)]

  def calls(codec):
    kw = dict(codec=codec, policy="always")
    return {
        "all_gather": (lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw), P("x")),
        "psum_scatter": (lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, **kw), P("x")),
        "psum": (lambda v: zc.compressed_psum(v, "x", **kw), P()),
        "all_to_all": (lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, **kw), P("x")),
        "ppermute": (lambda v: zc.compressed_ppermute(v, "x", ring, **kw), P("x")),
    }

  variants = {"zipccl": "zipccl", "raw": "raw", "lax": None}
  x = jax.ShapeDtypeStruct((N * 128, 1024), jnp.bfloat16)
  out = {}
  for name in calls("raw"):
    times = {v: [] for v in variants}
    texts = {}
    for r in range(runs + 1):
      for v, codec in variants.items():
        f, spec = calls(codec)[name]   # a fresh closure: no cache hit
        lowered = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=spec)).lower(x)
        t0 = time.perf_counter()
        comp = lowered.compile()
        if r:
          times[v].append(time.perf_counter() - t0)
        texts[v] = comp.as_text()
    for v in variants:
      text = texts[v]
      out[f"{v}/{name}"] = dict(compile_s=statistics.median(times[v]), runs=times[v],
                                hlo_chars=len(text), hlo_lines=text.count("\n"),
                                kernels=kernel_count(text),
                                rungs="+".join(str(len(c.branch_bytes) - 1)
                                               for c in zc.hlo_wire_bytes(text).conditionals))
    common.log(f"compile {name}: " + ", ".join(
        f"{v} {1e3 * out[f'{v}/{name}']['compile_s']:.0f} ms ({out[f'{v}/{name}']['kernels']} kernels)"
        for v in variants))
  return out


def run_example(steps: int, full: bool = False) -> dict | None:
  path = os.path.join(tempfile.mkdtemp(prefix="ladder_example_"), "fsdp.json")
  cmd = [sys.executable, os.path.join(HERE, "..", "examples", "train_fsdp.py")] + (
      [] if full else ["--quick"]) + [
         "--steps", str(steps), "--codec", "zipccl", "--ladder", "--no-progress", "--no-analyze",
         "--json", path]
  common.log("example: " + " ".join(cmd[1:]))
  res = subprocess.run(cmd, capture_output=True, text=True)
  if res.returncode not in (0, 1) or not os.path.exists(path):
    common.log(f"example failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return None
  with open(path) as f:
    return json.load(f)


def report(args, info, rows, comp, example) -> list:
  lines = [f"# Slot-ladder transport: wire ratios and compile time ({datetime.date.today().isoformat()})", "",
           f"Machine: {info['cpu']}, {info['cores']} cores, load average "
           f"{info.get('loadavg_1m', '?')} at the start (shared: timings are noisy, medians). "
           f"{N} simulated CPU devices, bf16, library defaults (codec=\"zipccl\", "
           f"policy=\"auto\", no capacity argument).", "",
           "## Wire ratios (raw bytes / bytes of the rung taken)", "",
           f"{args.elements:,} bf16 elements per device. *wire* = operand bytes this device "
           "hands to XLA on the rungs its stats report, agreement included, equal to the "
           "compiled HLO's switch branches (`hlo_wire_bytes(text).taken(rungs)`); *raw* = the "
           "raw rungs of the same transports (uint16 words; on CPU an all-to-all transport's "
           "rungs hand N - 1 rows to XLA, the own row stays). *used* = the largest used row size of the "
           "participants, *slot* = the rung's row size.", "",
           "| codec | collective | data | escapes | rung / rungs | used B | slot B | wire B | raw B | "
           "ratio | HLO = stats | bit-identical to raw |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r.get('codec', 'zipccl')} | {r['collective']} | {r['data']} | {100 * r['escape_rate']:.1f}% | "
        f"{','.join(map(str, r['rung']))} / {','.join(map(str, r['rungs']))} | "
        f"{','.join(map(str, r['used']))} | {','.join(map(str, r['slot']))} | {r['wire']:,} | "
        f"{r['raw']:,} | **{r['ratio']:.3f}** | {'yes' if r['wire'] == r['wire_hlo'] else 'NO'} | "
        f"{'yes' if r['identical_to_raw'] else 'NO'} |")
  grad = [r for r in rows if r["collective"] in ("psum_scatter", "psum")]
  worst = max(r["wire"] / r["raw"] for r in rows)
  lines += ["", "- gradient-like data through psum_scatter / psum: "
            + ", ".join(f"{r.get('codec', 'zipccl')} {r['collective']} {r['ratio']:.3f}"
                        for r in grad if r["data"] == "gradient_like") + " (goal >= 1.25)",
            "- weight-like data through all_gather: "
            + ", ".join(f"{r.get('codec', 'zipccl')} {r['ratio']:.3f}" for r in rows
                        if r["collective"] == "all_gather" and r["data"] == "weight_like")
            + " (goal >= 1.39)",
            f"- the most any call moved relative to raw: {worst:.4f}x (goal <= 1.01)", ""]
  if comp:
    lines += ["## Compile time and program size of one collective", "",
              "8 devices, bf16 [1024, 1024] per device, policy=\"always\"; median of "
              f"{args.compile_runs} compiles (`lowered.compile()`) per program, the three "
              "programs of a collective compiled interleaved in the same run. *ladder*: the "
              "compressed transport; *raw*: codec=\"raw\"; *lax*: the plain lax collective "
              "(codec=None). *kernels*: ops of the compiled module that XLA:CPU compiles to a "
              "kernel (outside fusion bodies; not views, collectives, custom calls); *HLO*: "
              "compiled HLO text, chars.", "",
              "| collective | ladder ms | raw ms | lax ms | ladder/lax | kernels ladder / raw / "
              "lax | rungs | HLO chars ladder / raw / lax |",
              "|---|---|---|---|---|---|---|---|"]
    for name in ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute"):
      z, r, x = (comp.get(f"{v}/{name}") for v in ("zipccl", "raw", "lax"))
      if not z:
        continue
      lines.append(
          f"| {name} | {1e3 * z['compile_s']:.0f} | {1e3 * r['compile_s']:.0f} | "
          f"{1e3 * x['compile_s']:.0f} | **{z['compile_s'] / x['compile_s']:.2f}** | "
          f"{z['kernels']} / {r['kernels']} / {x['kernels']} | {z['rungs']} | "
          f"{z['hlo_chars']} / {r['hlo_chars']} / {x['hlo_chars']} |")
    lines.append("")
  if example:
    z, r = example["runs"]["zipccl"], example["runs"]["raw"]
    lines += ["", "## FSDP example (examples/train_fsdp.py --codec zipccl --ladder"
              f"{'' if args.example_full else ' --quick'}, {len(z['losses'])} steps)", "",
              "Bytes one step sends, all devices (the compiled step's collectives): the "
              "ladder's smallest and raw rungs bound what a step takes.", "",
              "| path | zipccl | raw | ratio |", "|---|---|---|---|"]
    for name, key in (("smallest rungs", "sent"), ("raw rungs", "sent_fallback")):
      lines.append(f"| {name} | {z[key]:,.0f} | {r[key]:,.0f} | **{r[key] / z[key]:.3f}** |")
    lines += ["", f"Bit-identical to the raw run: {'yes' if example['identical'] else 'NO'}."]

  lines += ["", f"Reproduce: `python benchmarks/ladder.py --elements {args.elements} "
            f"--example-steps {args.example_steps} --compile-runs {args.compile_runs}"
            + (" --example-full" if args.example_full else "")
            + (f" --codecs {args.codecs}" if args.codecs != "zipccl" else "")
            + (" --skip-compile" if args.skip_compile else "") + "`", ""]
  return lines


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python benchmarks/ladder.py", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--elements", type=int, default=1 << 19,
                  help="bf16 elements per device (default 2^19: 128 KiB rows for psum_scatter, "
                       "above the 64 KiB of policy='auto')")
  ap.add_argument("--example-steps", type=int, default=20, help="FSDP example steps (0: skip)")
  ap.add_argument("--example-full", action="store_true",
                  help="run the example's full configuration (make demo's) instead of --quick")
  ap.add_argument("--compile-runs", type=int, default=3)
  ap.add_argument("--skip-compile", action="store_true")
  ap.add_argument("--codecs", default="zipccl",
                  help="comma-separated codecs for the wire-ratio table (e.g. zipccl,entropy); "
                       "other than the default, the report is ladder_codecs.md")
  ap.add_argument("--out", default=common.RESULTS)
  args = ap.parse_args(argv)
  import jax
  jax.config.update("jax_num_cpu_devices", N)
  info = common.machine_info()
  codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
  rows = [r for c in codecs for r in wire_ratios(args.elements, c)]
  comp = {} if args.skip_compile else compile_times(args.compile_runs)
  example = run_example(args.example_steps, args.example_full) if args.example_steps else None
  lines = report(args, info, rows, comp, example)
  stem = "ladder" if codecs == ["zipccl"] else "ladder_codecs"
  path = os.path.join(args.out, f"{stem}.md")
  common.write_lines(path, lines)
  with open(path[:-3] + ".json", "w") as f:
    json.dump(dict(machine=info, rows=rows, compile=comp, example=example), f,
              indent=1, default=str)
  bad = [r for r in rows if not r["identical_to_raw"] or r["wire"] != r["wire_hlo"]]
  return 1 if bad or (example and not example["identical"]) else 0


if __name__ == "__main__":
  sys.exit(main())
