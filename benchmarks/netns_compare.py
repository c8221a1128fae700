"""How repeatable is a netns grid? Compares runs of `benchmarks/netns_bench.py`.

Give it the JSON files of two or more runs of the same grid (same arguments, the
same code: any change between them is then noise of the machine). Per message
size it reports:

  * run-to-run spread of each variant's time: for every cell, the largest over
    the smallest of the runs' medians, minus 1 (0% = identical medians);
  * whether the cell's fastest variant is the same in every run;
  * how many cells admit a static choice within 5% (--tolerance) of the fastest
    in EVERY run. No policy that decides from shapes and a calibration (as
    policy="auto" does) can be within 5% in a cell that admits none, so that
    count is the ceiling of the goal "auto within 5% of the best in every cell"
    on this machine;
  * what "auto" achieved in each run (its own calibration per run).

Usage:
  python benchmarks/netns_compare.py benchmarks/results/netns_<tag1>.json \\
      benchmarks/results/netns_<tag2>.json --tag repeat
writes benchmarks/results/netns_compare_<tag>.md and .json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import common  # noqa: E402

KEY = ("procs", "link", "mib", "collective", "data")


def load(path: Path) -> dict:
  try:
    doc = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise SystemExit(f"netns_compare: cannot read {path}: {e}")
  if not isinstance(doc, dict) or "rows" not in doc or "args" not in doc:
    raise SystemExit(f"netns_compare: {path} is not a netns_bench result (no 'rows'/'args')")
  return doc


def _same_grid(docs: list, paths: list) -> list[str]:
  """Arguments that differ between the runs (warned about: then it is not noise)."""
  keys = ("grid", "links", "rounds", "data", "collectives", "pin", "chunks")
  out = []
  for k in keys:
    vals = {json.dumps(d["args"].get(k), sort_keys=True) for d in docs}
    if len(vals) > 1:
      out.append(f"{k}: " + ", ".join(f"{p.name}={d['args'].get(k)!r}" for p, d in zip(paths, docs)))
  return out


def compare(docs: list, tolerance: float) -> dict:
  """Per size: spreads per variant, cells with a stable fastest variant, cells
  admitting a static choice within `tolerance` in all runs, auto's hits per run."""
  tables = [{tuple(r[k] for k in KEY): r for r in d["rows"]} for d in docs]
  common = sorted(set.intersection(*(set(t) for t in tables)),
                  key=lambda k: (k[0], float(k[1]) if k[1] != "none" else 1e9, k[2], k[3], k[4]))
  variants = [v for v in docs[0]["codecs"] if all(v in d["codecs"] for d in docs)]
  by_size: dict = {}
  for key in common:
    rows = [t[key] for t in tables]
    if not all(all(v in r["times"] for v in variants) for r in rows):
      continue
    s = by_size.setdefault(key[2], dict(cells=0, spread={v: [] for v in variants},
                                        same_fastest=0, admits=0, auto_hits=[0] * len(docs),
                                        auto_cells=[0] * len(docs), examples=[]))
    s["cells"] += 1
    for v in variants:
      ts = [r["times"][v] for r in rows]
      s["spread"][v].append(max(ts) / min(ts) - 1.0)
    fastest = [min(variants, key=lambda v: r["times"][v]) for r in rows]
    s["same_fastest"] += len(set(fastest)) == 1
    ok = [v for v in variants if all(r["times"][v] <= (1 + tolerance) * min(r["times"].values())
                                     for r in rows)]
    s["admits"] += bool(ok)
    if not ok and len(s["examples"]) < 4:
      s["examples"].append(dict(cell=dict(zip(KEY, key)),
                                ms=[{v: round(r["times"][v] * 1e3, 2) for v in variants}
                                    for r in rows]))
    for i, r in enumerate(rows):
      if "auto_over_best" in r:
        s["auto_cells"][i] += 1
        s["auto_hits"][i] += r["auto_over_best"] <= 1 + tolerance
  out = {}
  for mib, s in sorted(by_size.items()):
    out[mib] = dict(
        cells=s["cells"], same_fastest=s["same_fastest"], admits=s["admits"],
        auto_hits=s["auto_hits"], auto_cells=s["auto_cells"], examples=s["examples"],
        spread={v: dict(median=statistics.median(x), max=max(x),
                        beyond=sum(e > tolerance for e in x)) for v, x in s["spread"].items()})
  return dict(variants=variants, sizes=out)


def plot(path: Path, docs: list, tolerance: float) -> bool:
  """Run 1's median vs each later run's, every cell and variant, log-log, one
  colour per message size, with the +-tolerance band around y = x."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("netns_compare: matplotlib not installed: no plot (pip install -e .[bench])",
          file=sys.stderr)
    return False
  first = {tuple(r[k] for k in KEY): r for r in docs[0]["rows"]}
  sizes = sorted({k[2] for k in first})
  fig, ax = plt.subplots(figsize=(5.2, 5))
  lo, hi = float("inf"), 0.0
  for j, d in enumerate(docs[1:], 2):
    for i, mib in enumerate(sizes):
      xs, ys = [], []
      for r in d["rows"]:
        k = tuple(r[kk] for kk in KEY)
        if k in first and k[2] == mib:
          for v, t in r["times"].items():
            if v in first[k]["times"]:
              xs.append(first[k]["times"][v] * 1e3)
              ys.append(t * 1e3)
      if xs:
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.scatter(xs, ys, s=14, color=f"C{i}", alpha=0.8,
                   label=f"{mib:g} MiB/process" + (f" (run {j})" if len(docs) > 2 else ""))
  if hi <= 0:
    plt.close(fig)
    return False
  line = [lo * 0.8, hi * 1.25]
  ax.plot(line, line, color="k", lw=0.8)
  ax.fill_between(line, [v / (1 + tolerance) for v in line], [v * (1 + tolerance) for v in line],
                  color="k", alpha=0.12, label=f"within {tolerance:.0%}")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("run 1: median ms per call")
  ax.set_ylabel("run 2: median ms per call" if len(docs) == 2 else "later runs: median ms per call")
  ax.set_title(f"Same grid, same code, twice ({docs[0]['date'][:10]})", fontsize=10)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return True


def report(paths: list, docs: list, res: dict, tolerance: float, tag: str) -> str:
  pct = f"{tolerance:.0%}"
  m = docs[0].get("machine", {})
  lines = [f"# Repeatability of netns grids ({datetime.date.today().isoformat()})", "",
           f"{len(docs)} runs of the same grid with the same code, compared cell by cell "
           f"(`benchmarks/netns_compare.py`). Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} "
           f"cores, jax {m.get('jax', '?')}. Runs: " +
           ", ".join(f"`{p.name}` ({d['date']}, load {d.get('machine', {}).get('load', 0):.2f})"
                     for p, d in zip(paths, docs)) + ".", "",
           "- *spread*: per cell, the slowest of the runs' medians over the fastest, minus 1; "
           f"median and largest over the cells, and cells beyond {pct};",
           "- *same fastest*: cells whose fastest variant is the same in every run;",
           f"- *admit a static choice*: cells where one variant is within {pct} of the fastest "
           f"in every run: the most cells any static policy (policy=\"auto\" included) can be "
           f"within {pct} in;",
           f"- *auto within {pct}*: what policy=\"auto\" achieved in each run, with that run's "
           f"calibration.", ""]
  variants = res["variants"]
  head = (["procs x MiB/process", "cells"] + [f"spread {v}" for v in variants] +
          ["same fastest", "admit a static choice"] +
          [f"auto within {pct}, run {i + 1}" for i in range(len(docs))])
  lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  procs = sorted({r["procs"] for d in docs for r in d["rows"]})
  for mib, s in res["sizes"].items():
    cells = [f"{'/'.join(map(str, procs))} x {mib:g}", str(s["cells"])]
    for v in variants:
      sp = s["spread"][v]
      cells.append(f"{sp['median']:.0%} (max {sp['max']:.0%}; {sp['beyond']} > {pct})")
    cells += [f"{s['same_fastest']} of {s['cells']}", f"{s['admits']} of {s['cells']}"]
    cells += [f"{h} of {c}" for h, c in zip(s["auto_hits"], s["auto_cells"])]
    lines.append("| " + " | ".join(cells) + " |")
  ex = [(mib, e) for mib, s in res["sizes"].items() for e in s["examples"]]
  if ex:
    lines += ["", "Cells that admit no static choice (ms per run, first few per size):", ""]
    for mib, e in ex[:12]:
      c = e["cell"]
      lines.append(f"- {c['collective']} {c['data']}, {c['mib']:g} MiB, link {c['link']}: " +
                   " / ".join("{" + ", ".join(f"{v} {t}" for v, t in r.items()) + "}"
                              for r in e["ms"]))
  diff = _same_grid(docs, paths)
  if diff:
    lines += ["", "**The runs' arguments differ** (the spread is then not noise alone): " +
              "; ".join(diff)]
  lines += ["", f"Reproduce: `python benchmarks/netns_compare.py {' '.join(p.name for p in paths)} "
            f"--tag {tag}` (in benchmarks/results/)", ""]
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog=__doc__.split("\n\n", 1)[1])
  ap.add_argument("runs", nargs="+", help="JSON files of netns_bench.py runs (>= 2)")
  ap.add_argument("--tolerance", type=float, default=0.05,
                  help="'within' means at most (1 + tolerance) x the fastest (default 0.05)")
  ap.add_argument("--tag", default="", help="appended to the report's name")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  args = ap.parse_args(argv)
  if len(args.runs) < 2:
    ap.error("give at least 2 runs to compare")
  if not 0 <= args.tolerance < 1:
    ap.error(f"--tolerance must be in [0, 1), got {args.tolerance}")
  paths = [Path(p) for p in args.runs]
  for i, p in enumerate(paths):
    if not p.exists() and (Path(args.out) / p).exists():
      paths[i] = Path(args.out) / p
  docs = [load(p) for p in paths]
  res = compare(docs, args.tolerance)
  if not res["sizes"]:
    raise SystemExit("netns_compare: the runs have no cell in common")
  stem = "netns_compare" + (f"_{args.tag}" if args.tag else "")
  common.write_report(args.out, stem, report(paths, docs, res, args.tolerance, args.tag),
                      dict(runs=[str(p.name) for p in paths], tolerance=args.tolerance,
                           result={str(k): v for k, v in res["sizes"].items()},
                           variants=res["variants"]))
  if plot(Path(args.out) / f"{stem}.png", docs, args.tolerance):
    common.log(f"wrote {Path(args.out) / stem}.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
