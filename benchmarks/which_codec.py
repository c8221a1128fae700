"""Which codec should `codec="auto"` take without a calibration? The measurement behind
`zipccl_jax.AUTO_CODEC`.

The rule (issue 11): the codec with the lower modelled time of a collective on a
10-100 Gb/s link, given measured codec speeds. The model is the library's own
(`zipccl_jax.costmodel.model_time`: per algorithm alpha + wire bytes / bandwidth,
encode and decode in series); what this script adds is the inputs, measured now:

  CPU   `zipccl_jax.calibrate(None)` (codecs only, one device, inside jit as the
        collectives run them) repeated --repeats times; the median speed per codec
        and dtype. Its speeds are those of the ratio's data (half Gaussian, half
        heavy-tailed; `CodecFit.encode_mix_factor`).
  GPU   the newest benchmarks/results/gpu_check_*.json (an NVIDIA H200 run of
        benchmarks/gpu_check.py): both CUDA codecs at 64 MiB of Gaussian data, the
        window codec at its default group count (1). No GPU is needed here.

Ratios: each codec's ratio on several kinds of data (`costmodel.sample_ratio`, one
row of --elements bf16/fp16 values per kind): Gaussian weights, heavy-tailed
gradient-like values with mixed scales (benchmarks/ladder.py's), GELU activations,
and the calibration's own mix. Links 1, 10, 25, 100 Gb/s, the library's default
latencies per platform (`costmodel.default_calibration`), 8 peers, rows of --row-mib
MiB. Each cell reports modelled time / raw time per codec and the winner.

    python benchmarks/which_codec.py [--repeats 3] [--gpu-json PATH]
        -> results/which_codec_<date>.md and .json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402

CODECS = ("zipccl", "entropy")
DTYPES = ("bfloat16", "float16")
LINKS = (1, 10, 25, 100)            # Gbit/s
COLLECTIVES = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
PEERS = 8


def data_kinds(n: int, seed: int = 0) -> dict:
  """name -> float32[n]: the kinds of data the ratios are measured on."""
  rng = np.random.default_rng(seed)
  gauss = rng.standard_normal(n) * 0.02
  seg = 256        # gradient-like: Student-t whose scale changes every 256 elements
  scales = 10.0 ** rng.uniform(-6, -3, n // seg + 1)
  grads = rng.standard_t(3, n) * np.repeat(scales, seg)[:n]
  pre = rng.standard_normal(n)
  gelu = 0.5 * pre * (1 + np.tanh(0.7978845608 * (pre + 0.044715 * pre ** 3)))
  return {"gaussian": gauss.astype(np.float32), "gradient-like": grads.astype(np.float32),
          "GELU activations": gelu.astype(np.float32)}


def cpu_fits(repeats: int) -> tuple[dict, list]:
  """{codec: {dtype: CodecFit}} of the median speeds over `repeats` calibrations."""
  import dataclasses
  import zipccl_jax as zc
  runs = []
  for i in range(repeats):
    common.log(f"calibrating the codecs ({i + 1}/{repeats})")
    runs.append(zc.calibrate(None, dtypes=DTYPES, codecs=CODECS, save=False, activate=False,
                             residuals=False))
  fits, per_run = {}, []
  for c in CODECS:
    fits[c] = {}
    for d in DTYPES:
      fs = [r.codecs[c][d] for r in runs]
      per_run.append({"codec": c, "dtype": d,
                      "encode_GBps": [f.encode_GBps for f in fs],
                      "decode_GBps": [f.decode_GBps for f in fs]})
      med = lambda name: statistics.median(getattr(f, name) for f in fs)  # noqa: E731
      fits[c][d] = dataclasses.replace(
          fs[0], **{k: med(k) for k in ("encode_latency_s", "encode_s_per_byte",
                                        "decode_latency_s", "decode_s_per_byte")})
  return fits, per_run


def gpu_speeds(path: str | None) -> tuple[dict, str | None]:
  """{codec: {dtype: (encode B/s, decode B/s)}} from a gpu_check JSON (64 MiB, Gaussian)."""
  if path is None:
    found = sorted(glob.glob(os.path.join(common.RESULTS, "gpu_check_*.json")))
    path = found[-1] if found else None
  if path is None:
    return {}, None
  with open(path) as f:
    doc = json.load(f)
  out = {c: {} for c in CODECS}
  for r in doc.get("timing", {}).get("rows", []):     # the window codec
    if r.get("size") == "64 MiB" and r.get("groups") == 1 and r["dtype"] in DTYPES:
      out["zipccl"].setdefault(r["dtype"], {})[r["op"]] = r["gbps_input"] * 1e9
  for r in doc.get("entropy", {}).get("rows", []):   # (it also times 1 GiB rows: skipped)
    if r.get("data") == "gauss" and r.get("input_bytes") == 64 << 20 and r["dtype"] in DTYPES:
      out["entropy"].setdefault(r["dtype"], {})[r["op"]] = r["gbps_input"] * 1e9
  speeds = {c: {d: (v["encode"], v["decode"]) for d, v in per.items()
                if "encode" in v and "decode" in v} for c, per in out.items()}
  return speeds, os.path.relpath(path, os.path.dirname(common.RESULTS))


def ratios(n: int, cpu: dict) -> dict:
  """{kind: {codec: {dtype: ratio}}}, the calibration's mix included."""
  import ml_dtypes
  from zipccl_jax import costmodel as cm
  out = {"calibration mix": {c: {d: cpu[c][d].ratio for d in DTYPES} for c in CODECS}}
  np_dt = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
  for kind, x in data_kinds(n).items():
    out[kind] = {c: {d: cm.sample_ratio(c, [x.astype(np_dt[d])]) for d in DTYPES} for c in CODECS}
  return out


def model(platform: str, fits: dict, ratio: dict, link: float, dtype: str, m: int) -> dict:
  """{collective: {"raw": s, codec: s}} of one link, dtype and data kind."""
  import dataclasses
  from zipccl_jax import costmodel as cm
  base = cm.default_calibration(platform, codecs=CODECS)
  codecs = {c: {dtype: dataclasses.replace(fits[c][dtype], ratio=ratio[c][dtype])}
            for c in CODECS if dtype in fits.get(c, {})}
  cal = cm.projected_calibration(dataclasses.replace(base, codecs=codecs), link_gbit=link)
  out = {}
  for coll in COLLECTIVES:
    t = {"raw": cm.model_time(coll, dtype, m, PEERS, cal, None)}
    for c in codecs:
      t[c] = cm.model_time(coll, dtype, m, PEERS, cal, c)
    out[coll] = t
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--repeats", type=int, default=3, help="CPU calibrations (median speeds)")
  ap.add_argument("--elements", type=int, default=1 << 21, help="elements per data kind")
  ap.add_argument("--row-mib", type=float, default=8.0, help="raw MiB of one peer's row")
  ap.add_argument("--gpu-json", help="a gpu_check JSON (default: the newest in results/)")
  ap.add_argument("--out", default=common.RESULTS)
  args = ap.parse_args(argv)
  from zipccl_jax import costmodel as cm
  info = common.machine_info()
  cpu, per_run = cpu_fits(args.repeats)
  common.log("measuring ratios")
  rat = ratios(args.elements, cpu)
  gpu, gpu_src = gpu_speeds(args.gpu_json)
  platforms = {"cpu": cpu}
  if gpu:
    platforms["gpu"] = {c: {d: cm.CodecFit(10e-6, 1 / e, 10e-6, 1 / dd, 1.0)
                            for d, (e, dd) in per.items()} for c, per in gpu.items()}
  cells, wins = [], {}
  for plat, fits in platforms.items():
    for dt in DTYPES:
      m = int(args.row_mib * 2**20) // 2
      for kind, r in rat.items():
        for link in LINKS:
          for coll, t in model(plat, fits, r, link, dt, m).items():
            best = min((c for c in CODECS if c in t), key=lambda c: t[c])
            cells.append(dict(platform=plat, dtype=dt, data=kind, link_gbit=link,
                              collective=coll, raw_s=t["raw"],
                              **{f"{c}_over_raw": t[c] / t["raw"] for c in CODECS if c in t},
                              faster=best))
            if 10 <= link <= 100:
              wins.setdefault(plat, {}).setdefault(best, 0)
              wins[plat][best] += 1
  lines = [f"# Which codec has the lower modelled time ({common.today()})", "",
           f"Machine: {info['cpu']}, {info['cores']} cores, load {info.get('loadavg_1m')}, "
           f"jax {info['versions'].get('jax')}. GPU speeds: "
           f"{gpu_src or 'none found (no gpu_check JSON)'}.", "",
           "Model: `zipccl_jax.costmodel.model_time` with the library's default latencies per "
           f"platform, {PEERS} peers, rows of {args.row_mib:g} MiB raw per peer; time / raw "
           "time per codec (< 1: compressing is faster than raw); **bold** = the faster codec.", "",
           "## Codec speeds (GB/s of raw data, one CPU core / one GPU)", "",
           "| platform | codec | dtype | encode | decode | CPU runs (encode; decode) |",
           "|---|---|---|---:|---:|---|"]
  for plat, fits in platforms.items():
    for c in CODECS:
      for d in DTYPES:
        if d not in fits.get(c, {}):
          continue
        f = fits[c][d]
        runs = next((r for r in per_run if r["codec"] == c and r["dtype"] == d), None) \
            if plat == "cpu" else None
        runs_s = ("; ".join(", ".join(f"{v:.2f}" for v in runs[k]) for k in
                           ("encode_GBps", "decode_GBps")) if runs else "")
        lines.append(f"| {plat} | {c} | {d} | {f.encode_GBps:.2f} | {f.decode_GBps:.2f} | "
                     f"{runs_s} |")
  lines += ["", "## Ratios per kind of data", "", "| data | " + " | ".join(
      f"{c} {d}" for c in CODECS for d in DTYPES) + " |", "|---|" + "---:|" * 4]
  for kind, r in rat.items():
    vals = " | ".join(f"{r[c][d]:.3f}" for c in CODECS for d in DTYPES)
    lines.append(f"| {kind} | {vals} |")
  lines += ["", "## Winner counts, 10-100 Gb/s (all dtypes, data kinds and collectives)", ""]
  for plat, w in wins.items():
    lines.append(f"- {plat}: " + ", ".join(f"{c} {k}" for c, k in sorted(w.items())))
  for plat in platforms:
    for dt in DTYPES:
      lines += ["", f"## {plat}, {dt}: time / raw time (window codec / entropy codec)", "",
                "| data | link | " + " | ".join(COLLECTIVES) + " |",
                "|---|---:|" + "---|" * len(COLLECTIVES)]
      for kind in rat:
        for link in LINKS:
          row = [c for c in cells if c["platform"] == plat and c["dtype"] == dt
                 and c["data"] == kind and c["link_gbit"] == link]
          vals = []
          for c in row:
            z, e = c.get("zipccl_over_raw"), c.get("entropy_over_raw")
            zs = f"**{z:.3f}**" if c["faster"] == "zipccl" else f"{z:.3f}"
            es = f"**{e:.3f}**" if c["faster"] == "entropy" else f"{e:.3f}"
            vals.append(f"{zs} / {es}")
          lines.append(f"| {kind} | {link} Gb/s | " + " | ".join(vals) + " |")
  lines += ["", f"Reproduce: `python benchmarks/which_codec.py --repeats {args.repeats}`"]
  stem = os.path.join(args.out, f"which_codec_{common.today()}")
  common.write_lines(stem + ".md", lines)
  with open(stem + ".json", "w") as f:
    json.dump(dict(machine=info, gpu_source=gpu_src, cpu_runs=per_run, ratios=rat,
                   cells=cells, wins=wins), f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
