"""`benchmarks/netns_bench.py`'s report: medians over rounds, ratios and the
calibrated policy's picks (`summarize`), the markdown and JSON (`write_report`), and
the plot of time against size per link (`plot`, `replot`).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from pathlib import Path

if __package__:
  from benchmarks.netns_bench_worker import COLLECTIVES, log, codec_variant
else:  # run as a script: its folder is on sys.path
  from netns_bench_worker import COLLECTIVES, log, codec_variant  # type: ignore[no-redef]


# ---- report ------------------------------------------------------------------------------


def summarize(args, results, codecs, net_note, elapsed, failures) -> dict:
  """Medians over rounds of the slowest process per call; ratios; auto's picks."""
  from zipccl_jax import costmodel as cm
  cells = {}
  for r in results:
    for s in r["samples"]:
      key = (r["procs"], s["link"], s["mib"], s["collective"], s["data"], s["codec"])
      cells.setdefault(key, {}).setdefault(s["round"], []).append(s["t"])
  med = {k: statistics.median(max(ts) for ts in v.values()) for k, v in cells.items()}
  nrounds = {k: len(v) for k, v in cells.items()}
  byts = {}
  taken = {}
  cals = {}
  pinned = {}
  for r in results:
    pinned[r["procs"]] = r.get("pinned", False)
    if r["pid"] == 0:
      for b in r["bytes"]:
        byts[(r["procs"], b["mib"], b["collective"], b["codec"])] = b["sent"]
      for b in r.get("taken", []):
        taken[(r["procs"], b["mib"], b["collective"], b["codec"], b["data"])] = (b["wire"],
                                                                                 b["raw"])
      for link, c in r["calibrations"].items():
        cals[(r["procs"], link)] = c
  events = [e for r in results for e in r["events"]]
  wrong = [e for e in events if e["kind"] == "wrong_result"]
  comp = [str(c) for c in codecs if c not in (None, "raw")]
  rows = []
  for (procs, link, mib, coll, data, codec), t in sorted(med.items(), key=lambda kv: (
      kv[0][0], _link_order(kv[0][1]), kv[0][2], COLLECTIVES.index(kv[0][3]), kv[0][4])):
    if codec != "raw":
      continue
    row = dict(procs=procs, link=link, mib=mib, collective=coll, data=data,
               rounds=nrounds[(procs, link, mib, coll, data, codec)], times={})
    for c in codecs:
      k = (procs, link, mib, coll, data, str(c))
      if k in med:
        row["times"][str(c)] = med[k]
    raw_b = byts.get((procs, mib, coll, "raw"))
    row["byte_ratio"] = {c: byts[(procs, mib, coll, c)] / raw_b for c in [str(x) for x in codecs]
                         if raw_b and (procs, mib, coll, c) in byts}
    # the rung the data took, where measured: over the same call's raw rung (its
    # stats' raw_bytes). Not over codec="raw"'s own call: on CPU an all-to-all
    # transport's rungs hand N - 1 rows to XLA (permutes; the own row stays) where
    # the plain uncompressed path hands N (lax.all_to_all), so the two stats count
    # different rows (docs/design.md, "Transport: the slot ladder").
    for c in [str(x) for x in codecs]:
      k = (procs, mib, coll, c, data)
      if k in taken and taken[k][1]:
        row["byte_ratio"][c] = taken[k][0] / taken[k][1]
    row["time_ratio"] = {c: tt / t for c, tt in row["times"].items()}
    # What policy="auto" with this link's calibration would do (bf16 rows).
    cal_d = cals.get((procs, link))
    if cal_d is not None and comp:
      cal = cm.Calibration.from_dict(cal_d)
      n = int(mib * 2**20) // 2
      m = n if coll in ("all_gather", "ppermute") else n // procs
      yes, which = cm.decide(coll, "bfloat16", m, procs, cal, codecs=comp)
      pick = which if yes else "raw"
      row["auto"] = pick
      model = {"raw": cm.model_time(coll, "bfloat16", m, procs, cal, None)}
      for c in comp:
        name, ch = codec_variant(c)
        if name in cal.codecs:
          k = cm.best_chunks(coll, "bfloat16", m, procs, cal, name) if ch == "auto" else ch
          model[c] = cm.model_time(coll, "bfloat16", m, procs, cal, name, chunks=k)
      row["model"] = model
      cand = {c: row["times"][c] for c in ["raw"] + comp if c in row["times"]}
      if pick in cand:
        row["auto_over_best"] = cand[pick] / min(cand.values())
    rows.append(row)
  return dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
              machine=_machine(), net=net_note or "network namespace, tc tbf on its loopback",
              args=dict(grid=args.grid, links=list(args.links), rounds=args.rounds,
                        chunks=list(getattr(args, "chunks", ("1",))),
                        data=list(args.data), collectives=list(args.collectives),
                        budget=args.budget, smoke=args.smoke, pin=args.pin),
              pinned={str(k): v for k, v in pinned.items()}, codecs=[str(c) for c in codecs],
              elapsed_s=round(elapsed, 1), rows=rows, events=events, wrong_results=len(wrong),
              failures=failures,
              calibrations={f"{p}@{l}": c for (p, l), c in cals.items()})


def _link_order(link: str) -> float:
  return 1e9 if link == "none" else float(link)


def _machine() -> dict:
  cpu = platform.processor() or platform.machine()
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  import jax
  return dict(cpu=cpu, cores=os.cpu_count(), host=platform.node(), python=platform.python_version(),
              jax=jax.__version__, load=os.getloadavg()[0])


def _link_name(link: str) -> str:
  return "unshaped" if link == "none" else f"{link} Gbit/s"


def write_report(args, doc) -> None:
  m = doc["machine"]
  codecs = doc["codecs"]
  comp = [c for c in codecs if c not in ("None", "raw")]
  lines = [f"# Compressed collectives over emulated links ({doc['date'][:10]})", "",
           f"Machine: {m['cpu']}, {m['cores']} cores, host {m['host']}, jax {m['jax']}, "
           f"load average at the end {m['load']:.2f}. Network: {doc['net']}. "
           f"jax.distributed on CPU with gloo, one device per process; processes pinned to "
           f"their own core with ZIPCCL_NUM_THREADS=1: {doc['pinned']}. "
           f"Run time {doc['elapsed_s']:.0f}s" + (" (--smoke: timings are not meaningful)"
                                                  if doc["args"]["smoke"] else "") + ".", "",
           "Each time is the median over rounds of the slowest process's wall time of one call "
           "(variants interleaved within each round, a barrier before every call). "
           "'x raw' columns: time / time of codec='raw' (< 1 is faster); 'bytes': bytes one "
           "process sends on the rung its data takes (`CollectiveStats.wire_bytes` of an untimed call "
           "with stats=True) / raw's; the compiled HLO's smallest rung where not measured. "
           "'auto': what `decide` (policy='auto') picks with the calibration measured on that "
           "link by `zipccl_jax.calibrate` in the same processes; 'auto/best': the measured "
           "time of that pick over the faster of raw and the compressed codecs.", ""]
  if doc["failures"]:
    lines += ["## Failures", ""] + [f"- `{f.splitlines()[0]}`" for f in doc["failures"]] + [""]
  wrong = [e for e in doc["events"] if e["kind"] == "wrong_result"]
  lines += ["## Result checks", ""]
  total_checked = sum(r["rounds"] * len(r["times"]) for r in doc["rows"])
  if wrong:
    lines.append(f"**{len(wrong)} wrong results** (of ~{total_checked} checked calls x "
                 "processes), not retried:")
    lines.append("")
    lines.append("| procs | link | MiB | collective | data | codec | round | process | "
                 "wrong elements | max abs error |")
    lines.append("|---|---|---:|---|---|---|---:|---:|---:|---:|")
    for e in wrong:
      lines.append(f"| {e['procs']} | {_link_name(e['link'])} | {e['mib']:g} | "
                   f"{e['collective']} | {e['data']} | {e['codec']} | {e['round']} | {e['pid']} | "
                   f"{e['wrong_elements']} of {e['elements']} | {e['max_abs_error']:.3g} |")
  else:
    lines.append(f"Every result of every call on every process matched its numpy reference "
                 f"({total_checked} calls).")
  budget = [e for e in doc["events"] if e["kind"] == "budget"]
  if budget:
    lines += ["", f"{len(budget)} cells stopped early to stay within the time budget "
              "(their 'rounds' column shows how many ran)."]
  lines.append("")
  # Headline: gaussian, zipccl/raw time (bytes) per collective.
  for c in comp:
    lines += [f"## {c} / raw, Gaussian bf16: time ratio (byte ratio)", "",
              "| procs | link | MiB/process | " + " | ".join(COLLECTIVES) + " |",
              "|---|---|---:|" + "---:|" * len(COLLECTIVES)]
    keyed = {(r["procs"], r["link"], r["mib"], r["collective"]): r for r in doc["rows"]
             if r["data"] == "gaussian"}
    for (p, l, mib) in sorted({k[:3] for k in keyed}, key=lambda k: (k[0], _link_order(k[1]),
                                                                      k[2])):
      cellv = []
      for coll in COLLECTIVES:
        r = keyed.get((p, l, mib, coll))
        if r is None or c not in r["time_ratio"]:
          cellv.append("")
          continue
        cellv.append(f"{r['time_ratio'][c]:.2f} ({r['byte_ratio'].get(c, float('nan')):.2f})")
      lines.append(f"| {p} | {_link_name(l)} | {mib:g} | " + " | ".join(cellv) + " |")
    lines.append("")
  # Auto.
  autos = [r for r in doc["rows"] if "auto_over_best" in r]
  if autos:
    worst = max(autos, key=lambda r: r["auto_over_best"])
    missed = [r for r in autos if r["auto"] == "raw" and any(
        r["time_ratio"].get(c, 9) < 0.9 for c in comp)]
    lines += ["## policy='auto' with calibration", "",
              f"{len(autos)} cells: auto within 5% of the best in "
              f"{sum(r['auto_over_best'] <= 1.05 for r in autos)}; "
              f"worst {worst['auto_over_best']:.2f}x "
              f"({worst['collective']} {worst['mib']:g} MiB {worst['data']}, "
              f"{_link_name(worst['link'])}, P={worst['procs']}); cells where compression wins "
              f"by > 10% but auto keeps raw: {len(missed)}.", ""]
    for c in ["raw"] + comp:
      errs = [r["model"][c] / r["times"][c] - 1 for r in autos if c in r["times"]
              and c in r.get("model", {})]
      if errs:
        within = sum(abs(e) <= 0.15 for e in errs)
        lines.append(f"- model vs measured time, {c}: median error "
                     f"{statistics.median(errs) * 100:+.0f}%, median |error| "
                     f"{statistics.median(abs(e) for e in errs) * 100:.0f}%, largest |error| "
                     f"{max(abs(e) for e in errs) * 100:.0f}%, within 15% in "
                     f"{within} of {len(errs)} cells (per cell: 'model err' columns below)")
    lines += ["", "| procs | link | fitted bandwidth (all_gather) | alpha all_gather | "
              "encode GB/s | decode GB/s | ratio assumed |", "|---|---|---:|---:|---:|---:|---:|"]
    for key, c in sorted(doc["calibrations"].items()):
      p, l = key.split("@")
      ag = c["links"]["all_gather"]
      fit = next(iter(c["codecs"].values()), {}).get("bfloat16") if c["codecs"] else None
      bw = 8e-9 / ag["beta_s_per_byte"] if ag["beta_s_per_byte"] > 0 else float("inf")
      enc = f"{1e-9 / fit['encode_s_per_byte']:.2f}" if fit else ""
      dec = f"{1e-9 / fit['decode_s_per_byte']:.2f}" if fit else ""
      lines.append(f"| {p} | {_link_name(l)} | {bw:.2f} Gbit/s | {ag['alpha_s'] * 1e3:.3f} ms | "
                   f"{enc} | {dec} | {fit['ratio']:.3f} |" if fit else "")
    lines.append("")
  # Full table.
  hdr = ["procs", "link", "MiB", "collective", "data", "rounds"] + [f"{c} ms" for c in codecs]
  hdr += [f"{c} x raw" for c in codecs if c != "raw"] + [f"{c} bytes" for c in comp]
  hdr += [f"model {c} x raw" for c in comp] + ["auto", "auto/best"]
  hdr += [f"model err {c}" for c in ["raw"] + comp]
  lines += ["## All cells", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
  for r in doc["rows"]:
    v = [str(r["procs"]), _link_name(r["link"]), f"{r['mib']:g}", r["collective"], r["data"],
         str(r["rounds"])]
    v += [f"{r['times'][c] * 1e3:.2f}" if c in r["times"] else "" for c in codecs]
    v += [f"{r['time_ratio'][c]:.2f}" if c in r["time_ratio"] else "" for c in codecs
          if c != "raw"]
    v += [f"{r['byte_ratio'][c]:.3f}" if c in r["byte_ratio"] else "" for c in comp]
    mod = r.get("model", {})
    v += [f"{mod[c] / mod['raw']:.2f}" if c in mod and mod.get("raw") else "" for c in comp]
    v += [r.get("auto", ""), f"{r['auto_over_best']:.2f}" if "auto_over_best" in r else ""]
    # (model time / measured time - 1) of each variant: the calibrated model's error
    v += [f"{(mod[c] / r['times'][c] - 1) * 100:+.0f}%" if c in mod and r["times"].get(c)
          else "" for c in ["raw"] + comp]
    lines.append("| " + " | ".join(v) + " |")
  cmd = "sudo python benchmarks/netns_bench.py" + (" --smoke" if doc["args"]["smoke"] else "")
  lines += ["", f"Reproduce: `{cmd}` (arguments: {json.dumps(doc['args'])})", ""]
  text = "\n".join(lines)
  res = Path(args.out)
  res.mkdir(parents=True, exist_ok=True)
  tag = getattr(args, "tag", "")
  stem = ("netns" + (f"_{tag}" if tag else "") +
          ("_smoke" if doc["args"]["smoke"] else ""))
  (res / f"{stem}.md").write_text(text)
  (res / f"{stem}.json").write_text(json.dumps(doc, indent=1))
  png = plot(res / f"{stem}.png", doc)
  log(f"netns_bench: wrote {res / stem}.md, .json" + (", .png" if png else " (no plot)"))
  print(text[:4000])


def plot(path: Path, doc) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter
  except ImportError:
    log("matplotlib not installed: no plot (pip install matplotlib)")
    return False
  rows = [r for r in doc["rows"] if r["data"] == "gaussian"]
  if not rows:
    return False
  settings = sorted({(r["procs"], r["link"]) for r in rows},
                    key=lambda k: (k[0], _link_order(k[1])))
  colls = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
  fig, axes = plt.subplots(len(colls), len(settings), figsize=(3.2 * len(settings),
                                                                2.6 * len(colls)),
                           squeeze=False, sharex=True)
  colors = {"None": "C7", "raw": "C0", "zipccl": "C3", "entropy": "C2"}
  for j, (p, l) in enumerate(settings):
    for i, coll in enumerate(colls):
      ax = axes[i][j]
      sel = sorted((r for r in rows if r["procs"] == p and r["link"] == l and
                    r["collective"] == coll), key=lambda r: r["mib"])
      for c in doc["codecs"]:
        pts = [(r["mib"], r["times"][c] * 1e3) for r in sel if c in r["times"]]
        if pts:
          ax.plot(*zip(*pts), marker=".", color=colors.get(c, "C4"),
                  label="lax" if c == "None" else c)
      auto = [(r["mib"], r["times"][r["auto"]] * 1e3) for r in sel
              if r.get("auto") in r["times"]]
      if auto:
        ax.scatter(*zip(*auto), s=90, facecolors="none", edgecolors="k", zorder=5,
                   label="auto's pick")
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
      ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
      ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
      ax.grid(True, which="both", alpha=0.3)
      if i == 0:
        ax.set_title(f"P={p}, {_link_name(l)}", fontsize=9)
      if j == 0:
        ax.set_ylabel(f"{coll}\nms per call", fontsize=8)
      if i == len(colls) - 1:
        ax.set_xlabel("MiB per process", fontsize=8)
      ax.tick_params(labelsize=7)
  axes[0][0].legend(fontsize=7)
  fig.suptitle(f"zipccl_jax collectives, Gaussian bf16, {doc['date'][:10]}, "
               f"{doc['machine']['cores']} cores", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return True


def replot(paths, tag: str, out: Path) -> int:
  """--replot: one plot from the rows of earlier results (their codecs must agree)."""
  docs = []
  for p in paths:
    try:
      docs.append(json.loads(Path(p).read_text()))
    except (OSError, ValueError) as e:
      raise SystemExit(f"netns_bench --replot: cannot read {p}: {e}")
    if "rows" not in docs[-1] or "codecs" not in docs[-1]:
      raise SystemExit(f"netns_bench --replot: {p} is not a netns_bench result")
  if any(d["codecs"] != docs[0]["codecs"] for d in docs):
    raise SystemExit("netns_bench --replot: the results compare different codecs: "
                     + ", ".join(f"{p}: {d['codecs']}" for p, d in zip(paths, docs)))
  doc = dict(docs[0], rows=[r for d in docs for r in d["rows"]])
  out.mkdir(parents=True, exist_ok=True)
  path = out / ("netns" + (f"_{tag}" if tag else "") + ".png")
  if not plot(path, doc):
    return 1
  log(f"netns_bench: wrote {path}")
  return 0


