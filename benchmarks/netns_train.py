#!/usr/bin/env python
"""Training step time, zipccl vs raw vs lax, across processes on a rate-limited link.

Runs the three training examples (examples/train_dp.py, train_moe.py,
train_fsdp.py) under examples/launch.py with 2 and 4 processes (one CPU device
each, gloo collectives) inside a fresh network namespace whose loopback is shaped
by tc tbf (default 1 Gbit/s, shared by all processes), and collects what each
example reports: step-time medians over the steps after warm-up (the slowest
process per step; the variants train in lockstep, interleaved), bytes per step
from the compiled HLO, and the bit-identity checks. Writes
benchmarks/results/train_<date>.md (tables) and .json, and .png (a plot) when
matplotlib is installed (`pip install -e .[bench]`). Needs root and iproute2.

    sudo .venv/bin/python benchmarks/netns_train.py                 # the measurement
    sudo .venv/bin/python benchmarks/netns_train.py --quick --procs 2 --out /tmp/x   # smoke

Timings are only as good as the machine is quiet: other jobs on the same cores
show up in every variant (interleaving spreads them evenly, medians damp them).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import launch  # noqa: E402

EXAMPLES = {"dp": "train_dp.py", "moe": "train_moe.py", "fsdp": "train_fsdp.py"}
# Step counts of the default run: enough steps after the 3 warm-up ones for a
# median, few enough for the whole grid to fit in ~8 minutes on 2 cores.
DEFAULT_STEPS = {"dp": 25, "moe": 25, "fsdp": 25}


def _cpu_name() -> str:
  try:
    for line in open("/proc/cpuinfo"):
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def run_grid(args) -> list:
  rows = []
  tmp = Path(tempfile.mkdtemp(prefix="netns_train"))
  for nproc in args.procs:
    for ex in args.examples:
      out = tmp / f"{ex}_{nproc}.json"
      cmd = [sys.executable, str(ROOT / "examples" / EXAMPLES[ex]), "--json", str(out),
             "--log-every", "0", "--warmup-steps", str(args.warmup)]
      cmd += ["--quick"] if args.quick else []
      if args.codecs:
        cmd += ["--codecs", args.codecs.replace("auto", "") if ex == "fsdp" else args.codecs]
      steps = args.steps or (None if args.quick else DEFAULT_STEPS[ex])
      cmd += ["--steps", str(steps)] if steps else []
      cmd += args.extra.get(ex, [])
      print(f"== {ex}, {nproc} processes, {args.rate}: {' '.join(cmd[1:])}", flush=True)
      t0 = time.monotonic()
      try:
        launch.launch(cmd, nproc, netns=None if args.rate == "host" else args.rate, pin=args.pin, deadline_s=args.deadline,
                      logdir=tmp / f"{ex}_{nproc}", echo=args.verbose, cwd=str(ROOT))
        res = json.loads(out.read_text())
        res.update(procs=nproc, wall_s=time.monotonic() - t0, error=None)
      except launch.LaunchError as e:
        res = dict(example=f"train_{ex}", procs=nproc, wall_s=time.monotonic() - t0,
                   error=str(e)[-2000:], ok=False, variants={})
        print(f"   FAILED: {str(e)[-1500:]}", flush=True)
      rows.append(res)
      if res["variants"]:
        print("   " + ", ".join(f"{k} {v['median_ms']:.1f} ms" for k, v in
                                  res["variants"].items())
              + f"; bit-identical: {'yes' if res['ok'] else 'NO'}; {res['wall_s']:.0f} s",
              flush=True)
  return rows


def _ratio(res, a, b, key="median_ms"):
  va, vb = res["variants"].get(a), res["variants"].get(b)
  if not va or not vb or not vb[key]:
    return "-"
  return f"{va[key] / vb[key]:.3f}"


def report(rows, args, stem: str) -> str:
  date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
  lines = [f"# Training step time over a {args.rate} link, zipccl vs raw vs lax", "",
           f"{date}; {_cpu_name()}, {os.cpu_count()} cores, {platform.system()}; "
           f"jax.distributed on CPU (gloo), one device per process, all processes inside one "
           f"network namespace whose loopback is shaped by tc tbf rate {args.rate} (the rate "
           f"is shared by all processes' traffic){'; processes pinned to cores' if args.pin else ''}. "
           f"The variants train in lockstep from the same state, interleaved step by step; "
           f"step time = median over the steps after {args.warmup} warm-up steps of the slowest "
           "process's time for that step (p25-p75 in brackets). 'sent' = bytes one device's "
           "collectives send per step (zipccl_jax.hlo_wire_bytes on the compiled step, no "
           "fallback). Bit-identical = zipccl and raw losses and final parameters equal bit for "
           "bit in every process, and every process saw the same losses.", ""]
  extra = [c for c in ("auto",) if any(c in r["variants"] for r in rows)]
  for nproc in args.procs:
    lines += [f"## {nproc} processes", "",
              "| example | zipccl ms | raw ms | lax ms | " + "".join(f"{c} ms | " for c in extra)
              + "zipccl / raw | lax / raw | " + "".join(f"{c} / raw | " for c in extra)
              + "sent MiB/dev zipccl | raw | bytes zipccl / raw | zipccl fallbacks | "
              "bit-identical |",
              "|---|" + "---:|" * (9 + 2 * len(extra)) + "---|"]
    for r in (r for r in rows if r["procs"] == nproc):
      name = r.get("example", "?")
      if r.get("error"):
        lines.append(f"| {name} | failed: see the JSON |" + " |" * (9 + 2 * len(extra)))
        continue
      v = r["variants"]

      def ms(label):
        if label not in v:
          return "-"
        x = v[label]
        return f"{x['median_ms']:.1f} ({x['p25_ms']:.0f}-{x['p75_ms']:.0f})"

      def mib(label):
        return f"{v[label]['sent_bytes'] / 2**20:.2f}" if label in v else "-"

      fb = v.get("zipccl", {}).get("fallback_steps", "-")
      lines.append(
          f"| {name} | {ms('zipccl')} | {ms('raw')} | {ms('lax')} | "
          + "".join(f"{ms(c)} | " for c in extra)
          + f"**{_ratio(r, 'zipccl', 'raw')}** | {_ratio(r, 'lax', 'raw')} | "
          + "".join(f"{_ratio(r, c, 'raw')} | " for c in extra) + f"{mib('zipccl')} | "
          f"{mib('raw')} | {_ratio(r, 'zipccl', 'raw', 'sent_bytes')} | {fb}/{r['steps']} | "
          f"{'yes' if r['ok'] else 'NO'} |")
    lines.append("")
  lines += ["Configs (per example): " + "; ".join(
      f"{r.get('example')}: " + ", ".join(f"{k}={v}" for k, v in r.get("config", {}).items()
                                         if k in ("steps", "seq_len", "d_model", "layers",
                                                  "heads", "batch_per_device", "d_ff",
                                                  "experts_per_device"))
      for r in rows if r["procs"] == args.procs[0] and not r.get("error")), ""]
  lines += [f"Reproduce: `sudo .venv/bin/python benchmarks/netns_train.py --rate {args.rate} "
            f"--procs {','.join(map(str, args.procs))}"
            f"{' --quick' if args.quick else ''}{' --pin' if args.pin else ''}"
            f"{' --codecs ' + args.codecs if args.codecs else ''}`"
            f" (whole grid: {sum(r['wall_s'] for r in rows):.0f} s)", ""]
  return "\n".join(lines)


def plot(rows, args, path: Path) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib is not installed: no plot (pip install -e .[bench])", file=sys.stderr)
    return False
  colors = {"zipccl": "#1f77b4", "raw": "#7f7f7f", "lax": "#ff7f0e", "auto": "#2ca02c"}
  fig, axes = plt.subplots(1, len(args.procs), figsize=(5.5 * len(args.procs), 4), squeeze=False)
  for ax, nproc in zip(axes[0], args.procs):
    sel = [r for r in rows if r["procs"] == nproc and r["variants"]]
    labels = [r["example"].removeprefix("train_") for r in sel]
    shown = [c for c in ("zipccl", "raw", "lax", "auto") if any(c in r["variants"] for r in sel)]
    width = 0.8 / max(len(shown), 1)
    for j, codec in enumerate(shown):
      xs = [i + (j - (len(shown) - 1) / 2) * width for i in range(len(sel))]
      med = [r["variants"].get(codec, {}).get("median_ms", 0) for r in sel]
      lo = [m - r["variants"].get(codec, {}).get("p25_ms", m) for m, r in zip(med, sel)]
      hi = [r["variants"].get(codec, {}).get("p75_ms", m) - m for m, r in zip(med, sel)]
      ax.bar(xs, med, width, yerr=[lo, hi], color=colors[codec], label=codec, capsize=2)
    for i, r in enumerate(sel):
      top = max(v["p75_ms"] for v in r["variants"].values())
      ax.annotate(f"{_ratio(r, 'zipccl', 'raw')}x", (i, top), ha="center", va="bottom",
                  fontsize=9)
    ax.set_xticks(range(len(sel)), labels)
    ax.set_ylabel("step time, ms (median, p25-p75)")
    ax.set_title(f"{nproc} processes, {args.rate} (label: zipccl / raw)")
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return True


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
  ap.add_argument("--codecs", help="variants, e.g. zipccl,raw,lax,auto (default: the "
                  "examples' zipccl,raw,lax; train_fsdp.py has no auto)")
  ap.add_argument("--deadline", type=float, default=300, help="seconds per launch (default 300)")
  ap.add_argument("--out", help="directory for the results (default benchmarks/results)")
  ap.add_argument("--verbose", action="store_true", help="echo process 0's output")
  for ex in EXAMPLES:
    ap.add_argument(f"--{ex}-args", default="", metavar="ARGS",
                    help=f"extra arguments for train_{ex}.py (one string)")
  args = ap.parse_args(argv)
  args.procs = [int(p) for p in args.procs.split(",")]
  args.examples = [e.strip() for e in args.examples.split(",")]
  if any(e not in EXAMPLES for e in args.examples) or min(args.procs) < 1:
    ap.error(f"--examples must name some of {list(EXAMPLES)}; --procs must be positive")
  args.extra = {ex: getattr(args, f"{ex}_args").split() for ex in EXAMPLES}
  if os.geteuid() != 0 and args.rate != "host":
    print("netns_train: needs root (ip netns, tc); or pass --rate host", file=sys.stderr)
    return 2
  rows = run_grid(args)
  out = Path(args.out) if args.out else ROOT / "benchmarks" / "results"
  out.mkdir(parents=True, exist_ok=True)
  stem = f"train_{datetime.date.today()}"
  text = report(rows, args, stem)
  (out / f"{stem}.md").write_text(text)
  (out / f"{stem}.json").write_text(json.dumps(dict(rate=args.rate, procs=args.procs, pin=args.pin,
                                                    rows=rows), indent=1))
  wrote = [f"{stem}.md", f"{stem}.json"]
  if plot(rows, args, out / f"{stem}.png"):
    wrote.append(f"{stem}.png")
  print("\n" + text)
  print(f"wrote {', '.join(str(out / w) for w in wrote)}")
  return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
