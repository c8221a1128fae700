#!/usr/bin/env python
"""Training step time, zipccl vs raw vs lax, across processes on a rate-limited link.

Runs the three training examples (examples/train_dp.py, train_moe.py,
train_fsdp.py) under examples/launch.py with 2 and 4 processes (one CPU device
each, gloo collectives) inside a fresh network namespace whose loopback is shaped
by tc tbf (default 1 Gbit/s, shared by all processes), and collects what each
example reports: step-time medians over the steps after warm-up (the slowest
process per step; the variants train in lockstep, interleaved), bytes per step
from the compiled HLO, and the bit-identity checks. Writes
benchmarks/results/train.md (tables) and .json, and .png (a plot) when
matplotlib is installed (`pip install -e .[bench]`). Needs root and iproute2.

    sudo .venv/bin/python benchmarks/netns_train.py                 # the measurement
    sudo .venv/bin/python benchmarks/netns_train.py --quick --procs 2 --out /tmp/x   # smoke

By default FSDP and DP train a model large enough that a step moves ~50 MiB per
device (DEFAULT_ARGS: the wire, not the compute, dominates at 1 Gbit/s); the
table names every config. `--breakdown` also runs each example on an unshaped
link and times the codec on one core, and reports where the step time goes:
C (the raw step without the shaped wire) + wire (bytes / rate) + codec (bytes /
codec speed), the zipccl / raw ratio that predicts, and the best ratio possible
when C -> 0.

Timings are only as good as the machine is quiet: other jobs on the same cores
show up in every variant (interleaving spreads them evenly, medians damp them).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "examples" / "launch.py"   # run as a command: its CLI is the interface

EXAMPLES = {"dp": "train_dp.py", "moe": "train_moe.py", "fsdp": "train_fsdp.py"}
# Step counts of the default run: enough steps after the 3 warm-up ones for a
# median, few enough for the whole grid to fit in ~8 minutes on 2 cores.
DEFAULT_STEPS = {"dp": 12, "moe": 25, "fsdp": 12}
# The models measured by default (replaced by --<example>-args). FSDP and DP: the
# byte-level transformer at width 1024, 2 blocks (25.5 M parameters, 51 MB of bf16
# weights or gradients per step and direction) on 1 x 32 tokens per device, so
# that a step moves ~50 MiB per device and the wire, not the compute, dominates
# at 1 Gbit/s, as in FSDP / DP training of a large model over a slow link. MoE:
# the example's own config (its all-to-alls carry activations, ~10 bytes per
# token and width per layer; see the breakdown for why it stays compute-bound).
DEFAULT_ARGS = {
    "fsdp": "--d-model 1024 --layers 2 --heads 8 --seq-len 32 --batch-per-device 1",
    "dp": "--d-model 1024 --layers 2 --heads 8 --seq-len 32 --batch-per-device 1",
    "moe": "",
}


def _cpu_name() -> str:
  try:
    for line in open("/proc/cpuinfo"):
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def parse_rate(rate: str) -> float | None:
  """A tc rate ("1gbit", "500mbit", "125mbps") in bytes per second; None for none/host."""
  m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(bit|bps)\s*", rate.lower())
  if not m:
    return None
  scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
  return float(m.group(1)) * scale / (8 if m.group(3) == "bit" else 1)


def measure_codec_speed(core: int | None, malloc: str = "tuned") -> dict:
  """Encode / decode throughput of the window codec on one core (raw bytes per second).

  A child process (taskset to `core`, ZIPCCL_NUM_THREADS=1, like a pinned
  worker) times `encode_rows` / `decode_rows` of one Gaussian bf16 row of 8 Mi
  elements (16 MiB, the size of the examples' large rows); medians of 5 calls;
  malloc as the examples' --malloc (tuned: zipccl_jax.tune_host_allocator()).
  """
  code = textwrap.dedent("""
      import json, statistics, time
      import jax, jax.numpy as jnp, numpy as np
      jax.config.update("jax_platforms", "cpu")
      import zipccl_jax
      if TUNED:
        zipccl_jax.tune_host_allocator()
      n = 8 << 20
      x = jnp.asarray((np.random.default_rng(0).standard_normal((1, n)) * 0.02)
                      .astype(jnp.bfloat16))
      enc = jax.jit(lambda v: zipccl_jax.encode_rows(v, codec="zipccl"))
      dec = jax.jit(lambda p: zipccl_jax.decode_rows(p, n, jnp.bfloat16, codec="zipccl"))
      def med(f, a):
        jax.block_until_ready(f(a))
        ts = []
        for _ in range(5):
          t = time.perf_counter(); jax.block_until_ready(f(a)); ts.append(time.perf_counter() - t)
        return statistics.median(ts)
      p, _ = enc(x)
      print(json.dumps(dict(encode_Bps=2 * n / med(enc, x), decode_Bps=2 * n / med(dec, p))))
  """)
  code = code.replace("TUNED", repr(malloc == "tuned"))
  cmd = [sys.executable, "-c", code]
  if core is not None:
    cmd = ["taskset", "-c", str(core)] + cmd
  env = dict(os.environ, ZIPCCL_NUM_THREADS="1", JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300)
  if r.returncode:
    raise RuntimeError(f"codec speed measurement failed: {r.stderr[-2000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def run_grid(args) -> list:
  rows = []
  tmp = Path(tempfile.mkdtemp(prefix="netns_train"))
  for nproc in args.procs:
    for ex in args.examples:
      res = run_one(args, tmp, ex, nproc, args.rate, args.codecs, args.steps)
      if args.breakdown and res["variants"]:
        # The same model, data and pinning on an unshaped link: the step without
        # (most of) the wire time, raw and zipccl.
        steps = args.steps or (None if args.quick else DEFAULT_STEPS[ex])
        steps = None if steps is None else max(args.warmup + 5, steps // 2)
        res["unshaped"] = run_one(args, tmp, ex, nproc, "none", "zipccl,raw", steps,
                                  tag="_none")
      rows.append(res)
  return rows


def run_one(args, tmp: Path, ex: str, nproc: int, rate: str, codecs, steps, tag="") -> dict:
  out = tmp / f"{ex}_{nproc}{tag}.json"
  cmd = [sys.executable, str(ROOT / "examples" / EXAMPLES[ex]), "--json", str(out),
         "--log-every", "0", "--warmup-steps", str(args.warmup), "--malloc", args.malloc]
  cmd += ["--quick"] if args.quick else []
  if args.calibrate and ex != "fsdp" and not tag:
    cmd += ["--calibrate"]
  if codecs:
    cmd += ["--codecs", ",".join(c for c in codecs.split(",")
                                 if "auto" not in c or ex != "fsdp")]
  if steps is None and not tag:
    steps = None if args.quick else DEFAULT_STEPS[ex]
  cmd += ["--steps", str(steps)] if steps else []
  cmd += args.extra.get(ex, [])
  print(f"== {ex}, {nproc} processes, {rate}: {' '.join(cmd[1:])}", flush=True)
  t0 = time.monotonic()
  # default: 300 s plus 3 s per step and variant (the DP example's lax variant takes 1.8 s a step)
  n_variants = len(codecs.split(",")) if codecs else 3
  deadline = args.deadline or 300 + 3 * (steps or DEFAULT_STEPS[ex]) * n_variants
  launcher = [sys.executable, str(LAUNCH), "-n", str(nproc), "--deadline", str(deadline),
              "--logdir", str(tmp / f"{ex}_{nproc}{tag}")]
  launcher += (["--netns", rate] if rate != "host" else []) + (["--pin"] if args.pin else [])
  launcher += [] if args.verbose else ["--quiet"]
  proc = subprocess.run(launcher + cmd[1:], cwd=str(ROOT), stdout=None if args.verbose else
                        subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  if proc.returncode == 0 and out.exists():
    res = json.loads(out.read_text())
    res.update(procs=nproc, wall_s=time.monotonic() - t0, error=None)
  else:
    err = proc.stderr[-2000:]
    res = dict(example=f"train_{ex}", procs=nproc, wall_s=time.monotonic() - t0,
               error=err, ok=False, variants={})
    print(f"   FAILED: {err[-1500:]}", flush=True)
  if res["variants"]:
    print("   " + ", ".join(f"{k} {v['median_ms']:.1f} ms" for k, v in
                              res["variants"].items())
          + f"; bit-identical: {'yes' if res['ok'] else 'NO'}; {res['wall_s']:.0f} s",
          flush=True)
  return res


# The variants under jax.jit whose calls take a rung of the ladder per call, in the
# order the report's 'ladder taken / raw' column looks for them.
LADDER_VARIANTS = ("zipccl", "entropy", "auto")


def _taken(v: dict) -> str:
  """wire / raw bytes of one variant's calls with stats, both from the same stats:
  on CPU an all-to-all transport hands N - 1 rows to XLA on every rung, where the
  uncompressed path (codec="raw": lax.all_to_all) hands N, so another variant's
  wire bytes are not the denominator."""
  w, r = v.get("wire_bytes_mean"), v.get("wire_raw_bytes_mean")
  return f"{w / r:.3f}" if w and r else "-"


def _ladder_cells(variants: dict, steps: int) -> tuple[str, str]:
  """The report's 'ladder taken / raw' and 'ladder fallbacks' cells: those of the
  first of LADDER_VARIANTS the run has, named in the first ("-" when none is)."""
  ladder = next((c for c in LADDER_VARIANTS if c in variants), None)
  if ladder is None:
    return "-", "-"
  taken = _taken(variants[ladder])
  return (taken if taken == "-" else f"{taken} ({ladder})",
          f"{variants[ladder].get('fallback_steps', '-')}/{steps}")


def _comparisons(rows: list) -> list:
  """Lines naming each zipccl_jax.jit variant's timed comparisons of its plan with raw
  words (step, ms per planned / raw step, what it chose), if any ran."""
  out = []
  for r in rows:
    for label, x in r["variants"].items():
      for step, planned_s, raw_s, diff_s, chosen in x.get("comparisons", ()):
        out.append(f"- {r.get('example')} {label}: at step {step}, {planned_s * 1e3:.1f} ms a "
                   f"planned step vs {raw_s * 1e3:.1f} ms raw, paired difference "
                   f"{diff_s * 1e3:+.2f} ms -> {chosen}")
  if not out:
    return []
  return ["zipccl_jax.jit's comparisons of its plan with raw words (medians over paired, "
          "waited steps and of their differences, which decide; the chosen program runs "
          "until the next comparison):", ""] + out + [""]


def _timing(rows: list) -> list:
  """Per example, the steps its medians cover (its own warm-up: an example's args may
  set --steps and --warmup-steps) and those a variant's median left out: steps during
  which another variant's program compiled ahead (examples/harness.py,
  `train_lockstep`)."""
  out = []
  for r in rows:
    timed = r["steps"] - r["warmup"]
    parts = [f"{c} {timed - x['timed_steps']}" + (" (all: the median keeps them)"
                                                   if x["timed_steps"] == 0 else "")
             for c, x in r["variants"].items()
             if x.get("timed_steps", timed) < timed]
    out.append(f"- {r.get('example')}: median over steps {r['warmup'] + 1}-{r['steps']}"
               + (f"; left out (another variant compiling ahead on the same cores): "
                  f"{', '.join(parts)}" if parts else ""))
  return out + [""] if out else []


def _ratio(res, a, b, key="median_ms"):
  va, vb = res["variants"].get(a), res["variants"].get(b)
  if not va or not vb or not vb[key]:
    return "-"
  return f"{va[key] / vb[key]:.3f}"


def _ratio_cell(res, a, b="raw") -> str:
  """`a`'s step time over `b`'s (raw, or a planned variant's ladder twin), bold, with
  its 95% interval (harness.ratio_interval)."""
  key = "vs_raw_interval" if b == "raw" else "vs_ladder_interval"
  ci = res["variants"].get(a, {}).get(key)
  return f"**{_ratio(res, a, b)}**" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")


def report(rows, args, stem: str) -> str:
  date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
  lines = [f"# Training step time over a {args.rate} link: compressed vs raw vs lax", "",
           f"{date}; {_cpu_name()}, {os.cpu_count()} cores, {platform.system()}; "
           f"jax.distributed on CPU (gloo), one device per process, all processes inside one "
           f"network namespace whose loopback is shaped by tc tbf rate {args.rate} (the rate "
           f"is shared by all processes' traffic){'; processes pinned to cores' if args.pin else ''}"
           f"; malloc {'tuned (zipccl_jax.tune_host_allocator)' if args.malloc == 'tuned' else 'glibc defaults'}. "
           f"The variants train in lockstep from the same state, interleaved step by step; "
           f"step time = median over the steps after the warm-up (listed under the table) of the slowest "
           "process's time for that step (p25-p75 in brackets), without the steps during which "
           "another variant's program compiled ahead (listed under the table: such a build "
           "shares the cores with every variant; a variant's own builds count); step i runs "
           "the variants in the order of row i of a Williams design, so each "
           "follows each other equally often (examples/harness.py, lockstep_order). "
           "'x / raw' and 'planned-x / x' (a planned variant over its ladder twin) = ratio of "
           "the medians, in brackets its 95% interval (a bootstrap over "
           "blocks of 25 consecutive steps of the two, paired, or of a quarter of the "
           "timed steps if fewer; harness.ratio_interval). "
           "'sent' = bytes one device's "
           "collectives send per step (zipccl_jax.hlo_wire_bytes on the compiled step): a planned "
           "variant (zipccl_jax.jit), its planned slots, what it moves; a ladder variant "
           "(jax.jit), every call on its smallest rung, a lower bound that is not what it moved "
           "(its calls with stats: 'ladder taken / raw', for the first of "
           + ", ".join(LADDER_VARIANTS) + " in the run, named in the cell: the operand bytes the calls with stats moved on the path "
           "they took over those of their own raw path (CollectiveStats.wire_bytes / raw_bytes, "
           "means over steps; train_fsdp: the "
           "weight gathers only, its gradient reduce-scatters run inside the gathers' VJP "
           "and have no stats); 'ladder fallbacks' = steps where such a call fell back. "
           "Bit-identical = every variant's and raw's losses and final parameters equal bit for "
           "bit in every process, and every process saw the same losses.", ""]
  order = ("zipccl", "entropy", "planned", "planned-entropy", "auto", "planned-auto", "planned-raw", "raw", "lax")
  labels = [c for c in order if any(c in r["variants"] for r in rows)]
  others = [c for c in labels if c != "raw"]
  # (planned variant, its ladder twin) pairs present in some row (harness.LADDER_TWIN)
  twins = sorted({(c, x["ladder_twin"]) for r in rows for c, x in r.get("variants", {}).items()
                  if x.get("ladder_twin")}, key=lambda t: labels.index(t[0]))
  for nproc in args.procs:
    lines += [f"## {nproc} processes", "",
              "| example | " + "".join(f"{c} ms | " for c in labels)
              + "".join(f"{c} / raw | " for c in others)
              + "".join(f"{a} / {b} | " for a, b in twins)
              + "".join(f"sent MiB/dev {c} | " for c in labels)
              + "ladder taken / raw | ladder fallbacks | bit-identical |",
              "|---|" + "---:|" * (3 * len(labels) - 1 + len(twins) + 2) + "---|"]
    for r in (r for r in rows if r["procs"] == nproc):
      name = r.get("example", "?")
      if r.get("error"):
        lines.append(f"| {name} | failed: see the JSON |" + " |" * (3 * len(labels) + len(twins) + 1))
        continue
      v = r["variants"]

      def ms(label):
        if label not in v:
          return "-"
        x = v[label]
        return f"{x['median_ms']:.1f} ({x['p25_ms']:.0f}-{x['p75_ms']:.0f})"

      def mib(label):
        return f"{v[label]['sent_bytes'] / 2**20:.2f}" if label in v else "-"

      taken, fb = _ladder_cells(v, r["steps"])
      lines.append(
          f"| {name} | " + "".join(f"{ms(c)} | " for c in labels)
          + "".join(f"{_ratio_cell(r, c)} | " for c in others)
          + "".join(f"{_ratio_cell(r, a, b)} | " for a, b in twins)
          + "".join(f"{mib(c)} | " for c in labels)
          + f"{taken} | {fb} | "
          f"{'yes' if r['ok'] else 'NO'} |")
    lines.append("")
    lines += _timing([r for r in rows if r["procs"] == nproc and not r.get("error")])
    lines += _comparisons([r for r in rows if r["procs"] == nproc and not r.get("error")])
  if any(r.get("unshaped") for r in rows):
    lines += breakdown(rows, args)
  lines += ["Configs (per example): " + "; ".join(
      f"{r.get('example')}: " + ", ".join(f"{k}={v}" for k, v in r.get("config", {}).items()
                                         if k in ("steps", "seq_len", "d_model", "layers",
                                                  "heads", "batch_per_device", "d_ff",
                                                  "experts_per_device"))
      for r in rows if r["procs"] == args.procs[0] and not r.get("error")), ""]
  model_args = "".join(f" --{ex}-args '{' '.join(args.extra[ex])}'" for ex in args.examples
                       if args.extra.get(ex) and " ".join(args.extra[ex]) != DEFAULT_ARGS[ex])
  lines += [f"Reproduce: `sudo .venv/bin/python benchmarks/netns_train.py --rate {args.rate} "
            f"--procs {','.join(map(str, args.procs))} --examples {','.join(args.examples)}"
            f"{' --steps ' + str(args.steps) if args.steps else ''} --warmup {args.warmup}"
            f"{model_args}"
            f"{' --quick' if args.quick else ''}{' --pin' if args.pin else ''}"
            f"{' --codecs ' + args.codecs if args.codecs else ''}"
            f"{' --calibrate' if args.calibrate else ''}"
            f"{' --breakdown' if args.breakdown else ''}"
            f"{' --malloc default' if args.malloc == 'default' else ''}"
            f"{' --name ' + args.name if args.name else ''}`"
            f" (whole grid: {sum(r['wall_s'] + (r.get('unshaped') or {}).get('wall_s', 0) for r in rows):.0f} s)", ""]
  return "\n".join(lines)


def breakdown_row(r: dict, rate_Bps: float, speed: dict) -> dict | None:
  """The simple model of one example's step: compute + wire + codec (seconds).

  C = the raw step on the unshaped link; wire = bytes every process sends per
  step (the tbf rate is shared by all of them) / the rate; codec = this
  process's encoded / decoded bytes per step over the measured codec speeds.
  """
  u = r.get("unshaped") or {}
  v, uv = r.get("variants", {}), u.get("variants", {})
  if not all(k in v for k in ("zipccl", "raw")) or not all(k in uv for k in ("zipccl", "raw")):
    return None
  nproc = r["procs"]
  c_raw, c_zip = uv["raw"]["median_ms"] / 1e3, uv["zipccl"]["median_ms"] / 1e3
  w_raw = nproc * v["raw"]["sent_bytes"] / rate_Bps
  w_zip = nproc * v["zipccl"]["sent_bytes"] / rate_Bps
  cb = v["zipccl"].get("codec_bytes") or {}
  codec = cb.get("encoded", 0) / speed["encode_Bps"] + cb.get("decoded", 0) / speed["decode_Bps"]
  pred_raw, pred_zip = c_raw + w_raw, c_raw + w_zip + codec
  return dict(c_raw=c_raw, c_zip=c_zip, w_raw=w_raw, w_zip=w_zip, codec=codec,
              enc_bytes=cb.get("encoded", 0), dec_bytes=cb.get("decoded", 0),
              pred_raw=pred_raw, pred_zip=pred_zip, pred_ratio=pred_zip / pred_raw,
              meas_ratio=v["zipccl"]["median_ms"] / v["raw"]["median_ms"],
              bound=(w_zip + codec) / w_raw, unshaped_extra=c_zip - c_raw)


def breakdown(rows, args) -> list:
  """Markdown lines: where each example's step time goes, and the speed-up to expect."""
  rate = parse_rate(args.rate)
  speed = args.codec_speed
  if rate is None or not speed:
    return ["(no breakdown: the link rate or the codec speed is unknown)", ""]
  lines = ["## Where the step time goes", "",
           f"C = the step with codec='raw' on an unshaped link (same processes, pinning, model "
           "and data): compute, optimizer, copies and the fast loopback transfer. wire = bytes "
           f"all processes send per step / {args.rate} (the tbf rate is shared by all "
           "processes; compiled HLO, smallest rung for zipccl). codec = raw bytes one process "
           "encodes / encode speed + bytes it decodes / decode speed (the zipccl FFI calls of "
           f"the compiled step; speed of one pinned core measured just before: encode "
           f"{speed['encode_Bps'] / 1e9:.2f} GB/s, decode {speed['decode_Bps'] / 1e9:.2f} GB/s). "
           "predicted raw = C + wire raw; predicted zipccl = C + wire zipccl + codec; bound = "
           "(wire zipccl + codec) / wire raw, the best zipccl / raw can be when C -> 0. "
           "'unshaped zipccl - raw' = the measured cost of compressing on the fast link "
           "(codec, its extra copies, the size agreement). Speed-up = raw / zipccl.", "",
           "| example | procs | C ms | wire raw ms | wire zipccl ms | codec MiB enc/dec | codec ms "
           "| unshaped zipccl - raw ms | predicted raw ms | predicted zipccl ms | predicted "
           "zipccl / raw | measured zipccl / raw | bound | predicted speed-up | measured "
           "speed-up |", "|---|---:|" + "---:|" * 13]
  for r in rows:
    b = breakdown_row(r, rate, speed)
    if b is None:
      continue
    r["breakdown"] = b
    lines.append(
        f"| {r.get('example')} | {r['procs']} | {1e3 * b['c_raw']:.0f} | {1e3 * b['w_raw']:.0f} "
        f"| {1e3 * b['w_zip']:.0f} | {b['enc_bytes'] / 2**20:.1f}/{b['dec_bytes'] / 2**20:.1f} "
        f"| {1e3 * b['codec']:.0f} | {1e3 * b['unshaped_extra']:.0f} | "
        f"{1e3 * b['pred_raw']:.0f} | {1e3 * b['pred_zip']:.0f} | {b['pred_ratio']:.3f} | "
        f"{b['meas_ratio']:.3f} | {b['bound']:.3f} | {1 / b['pred_ratio']:.2f}x | "
        f"{1 / b['meas_ratio']:.2f}x |")
  return lines + [""]


def plot(rows, args, path: Path) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib is not installed: no plot (pip install -e .[bench])", file=sys.stderr)
    return False
  # a planned variant (zipccl_jax.jit) in the light shade of its ladder twin's colour
  colors = {"zipccl": "#1f77b4", "planned": "#aec7e8", "entropy": "#9467bd",
            "planned-entropy": "#c5b0d5", "auto": "#2ca02c", "planned-auto": "#98df8a",
            "planned-raw": "#c7c7c7", "raw": "#7f7f7f", "lax": "#ff7f0e"}
  fig, axes = plt.subplots(1, len(args.procs), figsize=(6.5 * len(args.procs), 4.6), squeeze=False)
  for ax, nproc in zip(axes[0], args.procs):
    # step time / raw's: the examples' steps differ by 30x
    sel = [r for r in rows if r["procs"] == nproc and r["variants"].get("raw")]
    labels = [r["example"].removeprefix("train_") for r in sel]
    shown = [c for c in colors if any(c in r["variants"] for r in sel)]
    width = 0.85 / max(len(shown), 1)
    for j, codec in enumerate(shown):
      xs = [i + (j - (len(shown) - 1) / 2) * width for i in range(len(sel))]
      # an example without this variant gets no bar (NaN)
      v = [r["variants"].get(codec, {}) for r in sel]
      base = [r["variants"]["raw"]["median_ms"] for r in sel]
      med = [x.get("median_ms", float("nan")) / b for x, b in zip(v, base)]
      lo = [m - x.get("p25_ms", m * b) / b if x else 0 for m, x, b in zip(med, v, base)]
      hi = [x.get("p75_ms", m * b) / b - m if x else 0 for m, x, b in zip(med, v, base)]
      ax.bar(xs, med, width, yerr=[lo, hi], color=colors[codec], label=codec, capsize=2)
    ax.axhline(1.0, color="#7f7f7f", lw=0.8, ls="--")
    for i, r in enumerate(sel):
      top = max(v["p75_ms"] for v in r["variants"].values()) / r["variants"]["raw"]["median_ms"]
      comp = [c for c in colors if c not in ("raw", "lax", "planned-raw") and r["variants"].get(c)]
      if comp:
        best = min(comp, key=lambda c: r["variants"][c]["median_ms"])
        ax.annotate(f"{best} {_ratio(r, best, 'raw')}x", (i, top), ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(range(len(sel)), labels)
    ax.set_ylabel("step time / raw's (median, p25-p75)")
    ax.set_title(f"{nproc} processes, {args.rate} (label: fastest compressed / raw)",
                 fontsize=10)
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.08))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return True


def replot(paths) -> int:
  """--replot: the plot of earlier results, each written next to its JSON."""
  status = 0
  for p in map(Path, paths):
    try:
      doc = json.loads(p.read_text())
      rows, procs, rate = doc["rows"], doc["procs"], doc["rate"]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise SystemExit(f"netns_train --replot: {p} is not a netns_train result ({e})")
    present = sorted({r["procs"] for r in rows if r.get("variants")})
    ns = argparse.Namespace(procs=[n for n in procs if n in present] or present, rate=rate)
    if plot(rows, ns, p.with_suffix(".png")):
      print(f"wrote {p.with_suffix('.png')}")
    else:
      status = 1
  return status


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rate", default="1gbit",
                  help="tc tbf rate of the namespace's loopback; 'none': an unshaped namespace; "
                       "'host': no namespace (no root needed)")
  ap.add_argument("--procs", default="2,4", help="process counts (default 2,4)")
  ap.add_argument("--examples", default="dp,moe,fsdp", help="subset of dp,moe,fsdp")
  ap.add_argument("--steps", type=int, help="steps per example (default: 25; --quick: the "
                  "examples' --quick steps)")
  ap.add_argument("--warmup", type=int, default=3, help="warm-up steps left out (default 3)")
  ap.add_argument("--quick", action="store_true", help="the examples' tiny configs (a smoke)")
  ap.add_argument("--pin", action="store_true", help="taskset each process to its own core")
  ap.add_argument("--calibrate", action="store_true",
                  help="train_dp/train_moe calibrate on the shaped link first (for 'auto')")
  ap.add_argument("--codecs", help="variants, e.g. zipccl,raw,lax,auto (default: the "
                  "examples' zipccl,raw,lax; train_fsdp.py has no auto)")
  ap.add_argument("--breakdown", action="store_true",
                  help="also run every example on an unshaped link (zipccl, raw; half the "
                       "steps) and measure the codec's speed on one core, and report where "
                       "the step time goes (compute, wire, codec) and the speed-up to expect")
  ap.add_argument("--deadline", type=float, default=None,
                  help="seconds per launch (default 300 + 3 per step and variant)")
  ap.add_argument("--out", help="directory for the results (default benchmarks/results)")
  ap.add_argument("--name", default="", metavar="SUFFIX",
                  help="appended to the results' file stem train (e.g. _p4), so that "
                       "two runs of one day keep both tables")
  ap.add_argument("--verbose", action="store_true", help="echo process 0's output")
  ap.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                  help="the examples' --malloc (and the codec speed measurement's): tuned = "
                       "zipccl_jax.tune_host_allocator() in every process; default: glibc's")
  ap.add_argument("--replot", nargs="+", metavar="JSON",
                  help="no training: write the plot of each of these results next to it "
                       "(train<name>.png)")
  for ex in EXAMPLES:
    ap.add_argument(f"--{ex}-args", default=DEFAULT_ARGS[ex], metavar="ARGS",
                    help=f"model arguments for train_{ex}.py (one string; default "
                         f"{DEFAULT_ARGS[ex]!r}; --quick ignores the default)")
  args = ap.parse_args(argv)
  if args.replot:
    return replot(args.replot)
  args.procs = [int(p) for p in args.procs.split(",")]
  args.examples = [e.strip() for e in args.examples.split(",")]
  if any(e not in EXAMPLES for e in args.examples) or min(args.procs) < 1:
    ap.error(f"--examples must name some of {list(EXAMPLES)}; --procs must be positive")
  args.extra = {ex: getattr(args, f"{ex}_args").split() for ex in EXAMPLES}
  if args.quick:   # the examples' tiny configs, unless given explicitly
    args.extra = {ex: [] if getattr(args, f"{ex}_args") == DEFAULT_ARGS[ex] else v
                  for ex, v in args.extra.items()}
  if os.geteuid() != 0 and args.rate != "host":
    print("netns_train: needs root (ip netns, tc); or pass --rate host", file=sys.stderr)
    return 2
  args.codec_speed = None
  if args.breakdown:
    args.codec_speed = measure_codec_speed(min(os.sched_getaffinity(0)) if args.pin else None,
                                           args.malloc)
    print(f"codec speed, one core: encode {args.codec_speed['encode_Bps'] / 1e9:.2f} GB/s, "
          f"decode {args.codec_speed['decode_Bps'] / 1e9:.2f} GB/s", flush=True)
  rows = run_grid(args)
  out = Path(args.out) if args.out else ROOT / "benchmarks" / "results"
  out.mkdir(parents=True, exist_ok=True)
  stem = f"train{args.name}"
  text = report(rows, args, stem)
  (out / f"{stem}.md").write_text(text)
  (out / f"{stem}.json").write_text(json.dumps(dict(rate=args.rate, procs=args.procs, pin=args.pin,
                                                    codec_speed=args.codec_speed, rows=rows),
                                               indent=1))
  wrote = [f"{stem}.md", f"{stem}.json"]
  if plot(rows, args, out / f"{stem}.png"):
    wrote.append(f"{stem}.png")
  print("\n" + text)
  print(f"wrote {', '.join(str(out / w) for w in wrote)}")
  return 0 if rows and all(r["ok"] and (r.get("unshaped") or {}).get("ok", True)
                          for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
