"""Codec benchmark: ratio and single/multi-thread GB/s of the zipccl FFI op on 64 MiB of
Gaussian bf16, Gaussian fp32 and Laplace bf16, side by side in the same run with ZipNN,
blosc2 (zstd 1 + byte shuffle) and zstd level 1.

    python benchmarks/codec.py [--quick] [--size-mib M] [--threads 1,2]
    -> benchmarks/results/codec.{md,json,png}

Every zipccl thread count runs in a fresh subprocess (this script with the internal
`_worker` command), because the C++ codec reads ZIPCCL_NUM_THREADS once, at its
first use. Progress lines go to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script (python benchmarks/codec.py): its folder is on sys.path
  import common  # type: ignore[no-redef]

BF16, RESULTS, log, machine_info, median_time = (
    common.BF16, common.RESULTS, common.log, common.machine_info, common.median_time)



def make_case(name: str, size_mib: float) -> tuple[np.ndarray, str]:
  """The benchmark inputs, deterministic. Returns (array, description)."""
  rng = np.random.default_rng(20260501)
  if name == "gauss-bf16":
    n = int(size_mib * 2**20) // 2
    return (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(BF16), \
        "Gaussian bf16, sigma 0.02"
  if name == "gauss-fp32":
    n = int(size_mib * 2**20) // 4
    return rng.standard_normal(n, dtype=np.float32) * np.float32(0.02), \
        "Gaussian fp32, sigma 0.02"
  if name == "laplace-bf16":
    n = int(size_mib * 2**20) // 2
    return rng.laplace(0.0, 0.02, n).astype(np.float32).astype(BF16), \
        "Laplace bf16, scale 0.02"
  raise ValueError(name)


CASES = ("gauss-bf16", "gauss-fp32", "laplace-bf16")


def wire_nbytes(dtype, n: int, used: int, fits: bool) -> int:
  """What a compressed all-gather of the tensor as one row moves: the first rung of
  the window codec's ladder at or above its used size, else the raw row."""
  import zipccl_jax as z
  raw = n * np.dtype(dtype).itemsize
  return next((r for r in z.codec_ladder("zipccl", dtype, n) if r >= used), raw) if fits else raw


# ---- codec: the zipccl worker (one per thread count) ----------------------------------


def _usage() -> tuple[int, float]:
  """(minor page faults, kernel CPU seconds) of this process so far."""
  import resource
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_minflt, r.ru_stime


def _zipccl_worker(args) -> None:
  """Times the zipccl FFI op in this process (ZIPCCL_NUM_THREADS already set)."""
  import jax
  import zipccl_jax as z

  out = []
  for case in args.cases.split(","):
    x, desc = make_case(case, args.size_mib)
    n = x.size
    raw_nbytes = x.nbytes
    words = x.view(np.uint16 if x.itemsize == 2 else np.uint32)
    log(f"zipccl threads={args.threads_label} {case}: {n:,} elements")
    xj = jax.device_put(x)
    enc = jax.jit(z.encode)
    dec = jax.jit(lambda e: z.decode(e))
    e = jax.block_until_ready(enc(xj))
    status, esc, used = int(e.status), int(e.escape_count), int(e.used_units) * 128
    y = jax.block_until_ready(dec(e))
    ok = status == 0 and np.array_equal(np.asarray(y).view(words.dtype), words)
    calls = args.runs + 2  # with the warm-up calls
    (f0, s0), w0 = _usage(), time.perf_counter()
    t_enc, enc_all = median_time(lambda: jax.block_until_ready(enc(xj)), args.runs)
    (f1, s1), w1 = _usage(), time.perf_counter()
    log(f"  encode {raw_nbytes / t_enc / 1e9:.2f} GB/s (median of {args.runs}; best "
        f"{raw_nbytes / min(enc_all) / 1e9:.2f}), {(f1 - f0) / calls:.0f} page faults and "
        f"{1e3 * (s1 - s0) / calls:.1f} ms kernel time per call")
    t_dec, dec_all = median_time(lambda: jax.block_until_ready(dec(e)), args.runs)
    (f2, s2), w2 = _usage(), time.perf_counter()
    log(f"  decode {raw_nbytes / t_dec / 1e9:.2f} GB/s (best {raw_nbytes / min(dec_all) / 1e9:.2f}), "
        f"{(f2 - f1) / calls:.0f} page faults and {1e3 * (s2 - s1) / calls:.1f} ms kernel time "
        "per call")
    row = dict(case=case, desc=desc, n=n, raw_nbytes=raw_nbytes,
               escape_count=esc, escape_rate=esc / n, status=status,
               roundtrip_ok=bool(ok),
               wire_nbytes=wire_nbytes(x.dtype, n, used, status == 0),
               actual_nbytes=used if status == 0 else raw_nbytes,
               encode_s=t_enc, decode_s=t_dec, encode_runs=enc_all, decode_runs=dec_all,
               encode_faults=(f1 - f0) / calls, decode_faults=(f2 - f1) / calls,
               encode_sys_s=(s1 - s0) / calls, decode_sys_s=(s2 - s1) / calls,
               encode_wall_s=(w1 - w0) / calls, decode_wall_s=(w2 - w1) / calls)
    # The same row codec on preallocated host buffers, outside XLA: separates the
    # codec's own speed from XLA's per-call output allocation (page faults).
    nat = z.codecs.native()
    if hasattr(nat, "encode_into"):
      code = {BF16: 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3}[x.dtype]
      buf = np.zeros(nat.row_nbytes(code, n, n), np.uint8)   # capacity n: always fits
      xb = x.view(np.uint8).reshape(-1)
      ybuf = np.empty(raw_nbytes, np.uint8)
      nat.encode_into(code, xb, n, n, buf)
      st = nat.decode_into(code, buf, n, ybuf)
      row["host_roundtrip_ok"] = bool(st == 0 and np.array_equal(ybuf, xb))
      row["host_encode_s"], row["host_encode_runs"] = median_time(
          lambda: nat.encode_into(code, xb, n, n, buf), args.runs)
      row["host_decode_s"], row["host_decode_runs"] = median_time(
          lambda: nat.decode_into(code, buf, n, ybuf), args.runs)
      log(f"  host buffers (no XLA): encode {raw_nbytes / row['host_encode_s'] / 1e9:.2f} GB/s, "
          f"decode {raw_nbytes / row['host_decode_s'] / 1e9:.2f} GB/s")
    out.append(row)
  with open(args.json_out, "w") as f:
    json.dump(out, f)


# XLA allocates every call's output afresh, and glibc serves allocations >= 32 MiB
# (its largest dynamic mmap threshold) with a new mmap that is unmapped again on
# free: each call first-touches its whole output, 4 KiB page by page. Two glibc
# tunables (glibc >= 2.35) change that, for the rows that show the effect:
MALLOC_VARIANTS = {
    # huge pages for those mappings: 512x fewer faults, the kernel still zeroes them
    "THP": "glibc.malloc.hugetlb=1",
    # no mmap at all, no trimming: freed buffers are reused from the heap, no faults
    "reuse": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184",
}
_VARIANT_LABEL = {"": "zipccl (XLA FFI, jit)", "THP": "zipccl (XLA FFI, jit, THP malloc)",
                  "reuse": "zipccl (XLA FFI, jit, heap-reuse malloc)"}


def run_zipccl(threads: str, cases, size_mib: float, runs: int, malloc: str = "") -> list[dict]:
  """Runs the zipccl worker in a fresh subprocess with ZIPCCL_NUM_THREADS=threads."""
  import tempfile
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
    path = tf.name
  env = dict(os.environ, ZIPCCL_NUM_THREADS=str(threads), JAX_PLATFORMS="cpu")
  if malloc:
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"),
                                                   MALLOC_VARIANTS[malloc]]))
  label = f"{threads}+{malloc}" if malloc else str(threads)
  cmd = [sys.executable, os.path.abspath(__file__), "_worker", "--cases", ",".join(cases),
         "--size-mib", str(size_mib), "--runs", str(runs), "--json-out", path,
         "--threads-label", label]
  try:
    subprocess.run(cmd, env=env, check=True)
    with open(path) as f:
      return json.load(f)
  finally:
    os.unlink(path)


# ---- codec: the peers (single thread) -------------------------------------------------


def _peer_zipnn(x: np.ndarray):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from zipnn import ZipNN
  # Byte input with the dtype named (bf16 has no numpy dtype ZipNN knows). ZipNN
  # reorders its input buffer in place: every compress gets a fresh copy.
  dt = {BF16: "bfloat16", np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
  z = ZipNN(input_format="byte", bytearray_dtype=dt[x.dtype], threads=1)
  return (lambda buf: z.compress(buf)), (lambda c: z.decompress(c)), True


def _peer_blosc2(x: np.ndarray):
  import blosc2
  blosc2.set_nthreads(1)
  kw = dict(codec=blosc2.Codec.ZSTD, clevel=1, filters=[blosc2.Filter.SHUFFLE],
            typesize=x.itemsize, nthreads=1)
  return (lambda buf: blosc2.compress2(buf, **kw)), \
      (lambda c: blosc2.decompress2(c, nthreads=1)), False


def _peer_zstd(x: np.ndarray):
  import zstandard
  cctx = zstandard.ZstdCompressor(level=1, threads=0)  # threads=0: single thread
  dctx = zstandard.ZstdDecompressor()
  return (lambda buf: cctx.compress(buf)), (lambda c: dctx.decompress(c)), False


class _EntropyRow:
  """An entropy-codec payload: len() is its used bytes (what the ratio counts)."""

  def __init__(self, payload, stats):
    self.payload, self.used = payload, int(stats[0, 2]) * 128

  def __len__(self):
    return self.used


class _Decoded:
  """A decoded jax array; bytes() copies it to the host (the round-trip check only)."""

  def __init__(self, y):
    self.y = y

  def __bytes__(self):
    return np.asarray(self.y).tobytes()


def _peer_entropy(x: np.ndarray):
  """The entropy codec through jax.jit on host arrays (bf16/fp16 only), at the thread
  count ZIPCCL_NUM_THREADS gives this process (1 for the peers' comparison)."""
  import jax
  import jax.numpy as jnp
  import zipccl_jax as zc
  entropy = zc.codecs.get("entropy")
  if x.dtype not in (BF16, np.dtype(np.float16)):
    raise ImportError(f"the entropy codec does not take {x.dtype.name}")
  xj = jnp.asarray(x.reshape(1, -1))
  enc = jax.jit(entropy.encode_rows)
  dec = jax.jit(entropy.decode_rows, static_argnums=(1, 2))

  def comp(_buf):
    p, s = enc(xj)
    p.block_until_ready()
    return _EntropyRow(p, np.asarray(s))

  def decomp(c):
    y, _ = dec(c.payload, x.size, x.dtype)
    return _Decoded(y.block_until_ready())

  return comp, decomp, False


PEERS = {
    "entropy": ("zipccl entropy codec (XLA FFI, jit)", _peer_entropy),
    "zipnn": ("ZipNN (Huffman, 1 thread)", _peer_zipnn),
    "blosc2": ("blosc2 zstd-1 + shuffle (1 thread)", _peer_blosc2),
    "zstd": ("zstd level 1 (1 thread)", _peer_zstd),
}


def run_peer(peer: str, case: str, x: np.ndarray, runs: int) -> dict:
  label, make = PEERS[peer]
  raw = x.tobytes()
  try:
    comp, decomp, mutates = make(x)
  except ImportError as e:
    log(f"{peer}: not installed ({e}); skipped")
    return dict(peer=peer, label=label, case=case, error=f"not installed: {e}")
  setup = (lambda: bytearray(raw)) if mutates else (lambda: raw)
  c = comp(setup())
  d = decomp(c)
  ok = bytes(d) == raw
  t_enc, enc_runs = median_time(comp, runs, setup=setup)
  t_dec, dec_runs = median_time(lambda: decomp(c), runs)
  log(f"{peer} {case}: ratio {len(raw) / len(c):.3f}, encode {len(raw) / t_enc / 1e9:.2f} GB/s, "
      f"decode {len(raw) / t_dec / 1e9:.2f} GB/s, round trip {'ok' if ok else 'FAILED'}")
  return dict(peer=peer, label=label, case=case, raw_nbytes=len(raw), comp_nbytes=len(c),
              ratio=len(raw) / len(c), encode_s=t_enc, decode_s=t_dec, encode_runs=enc_runs,
              decode_runs=dec_runs, roundtrip_ok=ok)


# ---- codec: report --------------------------------------------------------------------


def _gbps(nbytes, s):
  return nbytes / s / 1e9


def _mb(r: dict, what: str) -> str:
  """'median / best' GB/s of r[what + '_s'] and r[what + '_runs']."""
  med = f"{_gbps(r['raw_nbytes'], r[what + '_s']):.2f}"
  runs = r.get(what + "_runs")
  return f"{med} / {_gbps(r['raw_nbytes'], min(runs)):.2f}" if runs else med


def _variant(key: str) -> tuple[str, str]:
  """Worker key ("1", "2+THP", "1+reuse") -> (threads, codec label)."""
  th, _, malloc = key.partition("+")
  return th, _VARIANT_LABEL[malloc]


def codec_table(z_rows: dict, peers: list[dict]) -> str:
  lines = ["| case | codec | threads | escapes | wire ratio | actual ratio | "
           "encode GB/s median / best | decode GB/s median / best | "
           "page faults/call enc, dec | round trip |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
  for case in CASES:
    for key, rows in z_rows.items():
      th, label = _variant(key)
      for r in rows:
        if r["case"] != case:
          continue
        lines.append(
            f"| {r['desc']} | {label} | {th} | "
            f"{100 * r['escape_rate']:.2f}% | {r['raw_nbytes'] / r['wire_nbytes']:.4f} | "
            f"{r['raw_nbytes'] / r['actual_nbytes']:.4f} | "
            f"{_mb(r, 'encode')} | {_mb(r, 'decode')} | "
            f"{r.get('encode_faults', 0):,.0f}, {r.get('decode_faults', 0):,.0f} | "
            f"{'ok' if r['roundtrip_ok'] else 'FAIL'} |")
    for key, rows in z_rows.items():
      if "+" in key:
        continue
      for r in rows:
        if r["case"] == case and "host_encode_s" in r:
          lines.append(
              f"| {r['desc']} | zipccl row codec, preallocated host buffers (no XLA) | {key} | "
              f"same | | | | {_mb(r, 'host_encode')} | {_mb(r, 'host_decode')} | | "
              f"{'ok' if r.get('host_roundtrip_ok') else 'FAIL'} |")
    for p in peers:
      if p["case"] != case:
        continue
      if "error" in p:
        lines.append(f"| | {p['label']} | 1 | | | {p['error']} | | | | | |")
        continue
      lines.append(f"| | {p['label']} | 1 | | | {p['ratio']:.4f} | {p['ratio']:.4f} | "
                   f"{_mb(p, 'encode')} | {_mb(p, 'decode')} | | "
                   f"{'ok' if p['roundtrip_ok'] else 'FAIL'} |")
  return "\n".join(lines)


def codec_plot(path: str, z_rows: dict, peers: list[dict]) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    log("matplotlib not installed: no plot")
    return False
  fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=False)
  markers = {"gauss-bf16": "o", "gauss-fp32": "s", "laplace-bf16": "^"}
  colors = {"zipccl-1": "C0", "zipccl-2": "C1", "zipnn": "C2", "blosc2": "C3", "zstd": "C4",
            "zipccl-1+THP": "C5", "zipccl-2+THP": "C6", "zipccl-1+reuse": "C8",
            "zipccl-2+reuse": "C9"}
  for ax, key, title in ((axes[0], "encode_s", "encode"), (axes[1], "decode_s", "decode")):
    seen = set()
    for th, rows in z_rows.items():
      for r in rows:
        nth, _, malloc = str(th).partition("+")
        lab = f"zipccl {nth} thread{'s' if nth != '1' else ''}" + (f", {malloc}" if malloc else "")
        ax.scatter(_gbps(r["raw_nbytes"], r[key]), r["raw_nbytes"] / r["wire_nbytes"],
                   marker=markers[r["case"]], color=colors.get(f"zipccl-{th}", "C7"), s=60,
                   label=lab if lab not in seen else None)
        seen.add(lab)
    for p in peers:
      if "error" in p:
        continue
      ax.scatter(_gbps(p["raw_nbytes"], p[key]), p["ratio"], marker=markers[p["case"]],
                 color=colors[p["peer"]], s=60, label=p["peer"] if p["peer"] not in seen else None)
      seen.add(p["peer"])
    ax.set_xscale("log")
    from matplotlib.ticker import FormatStrFormatter
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel(f"{title} throughput (GB/s of input, log scale)")
    ax.set_ylabel("compression ratio (zipccl: wire size)")
    ax.set_title(f"{title}: ratio vs throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.axhline(1.41, color="gray", ls=":", lw=1)
  h, l = axes[0].get_legend_handles_labels()
  from matplotlib.lines import Line2D
  h += [Line2D([], [], marker=m, ls="", color="k") for m in markers.values()]
  l += list(markers)
  axes[1].legend(h, l, fontsize=8, loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def cmd_codec(args) -> int:
  if args.from_json:  # re-render the report of a finished run
    with open(args.from_json) as f:
      doc = json.load(f)
    out = os.path.dirname(os.path.abspath(args.from_json))
    base = os.path.join(out, os.path.splitext(os.path.basename(args.from_json))[0])
    return write_codec_report(base, doc["machine"], doc["size_mib"], doc["runs"],
                              doc["zipccl"], doc["peers"], doc.get("threads", ["1", "2"]))
  size = 8.0 if args.quick and args.size_mib is None else (args.size_mib or 64.0)
  runs = args.runs or (5 if args.quick else 9)
  threads = [t.strip() for t in args.threads.split(",") if t.strip()]
  info = machine_info()
  log(f"codec benchmark: {size:g} MiB per case, median of {runs} runs, zipccl threads "
      f"{threads}, on {info['cpu']} ({info['cores']} cores)")
  snap0, wall0 = common.cpu_snapshot(), time.perf_counter()
  z_rows = {}
  for th in threads:
    z_rows[th] = run_zipccl(th, CASES, size, runs)
  if not args.no_malloc_variants:
    for malloc in MALLOC_VARIANTS:
      for th in threads:
        z_rows[f"{th}+{malloc}"] = run_zipccl(th, CASES, size, runs, malloc=malloc)
  peers = []
  peer_names = [p for p in PEERS if p not in (args.skip_peers or "").split(",")]
  for case in CASES:
    x, _ = make_case(case, size)
    for p in peer_names:
      log(f"{p} {case} ...")
      peers.append(run_peer(p, case, x, runs))
  info["other_load_cores"] = common.other_load(snap0, common.cpu_snapshot(), time.perf_counter() - wall0)
  if info["other_load_cores"] is not None:
    log(f"other processes kept {info['other_load_cores']:.2f} cores busy on average during the run")
  os.makedirs(args.out, exist_ok=True)
  base = os.path.join(args.out, "codec_quick" if args.quick else "codec")
  return write_codec_report(base, info, size, runs, z_rows, peers, threads)


def write_codec_report(base: str, info: dict, size: float, runs: int, z_rows: dict,
                       peers: list[dict], threads: list[str]) -> int:
  """Writes base.md, base.json and base.png; prints the markdown. Returns the exit status."""
  table = codec_table(z_rows, peers)
  g = next((r for r in z_rows.get("1", []) if r["case"] == "gauss-bf16"), None)
  zn = next((p for p in peers if p["peer"] == "zipnn" and p["case"] == "gauss-bf16" and
             "error" not in p), None)
  goals = []
  if g:
    sr = g["raw_nbytes"] / g["wire_nbytes"]
    ge, gd = _gbps(g["raw_nbytes"], g["encode_s"]), _gbps(g["raw_nbytes"], g["decode_s"])
    goals.append(f"- wire ratio, Gaussian bf16: **{sr:.4f}** "
                 f"(goal >= 1.41: {'met' if sr >= 1.41 else 'MISSED'}); actual bytes "
                 f"{g['raw_nbytes'] / g['actual_nbytes']:.4f}")
    goals.append(f"- single-thread jit encode: **{ge:.2f} GB/s** (goal >= 2: "
                 f"{'met' if ge >= 2 else 'MISSED'}); decode: **{gd:.2f} GB/s** (goal >= 3: "
                 f"{'met' if gd >= 3 else 'MISSED'}); "
                 f"{g.get('encode_faults', 0):,.0f} and {g.get('decode_faults', 0):,.0f} page "
                 f"faults per call, {1e3 * g.get('encode_sys_s', 0):.0f} and "
                 f"{1e3 * g.get('decode_sys_s', 0):.0f} ms of kernel time per call (of "
                 f"{1e3 * g.get('encode_wall_s', 0):.0f} and {1e3 * g.get('decode_wall_s', 0):.0f}"
                 " ms wall)")
    for malloc, what in (("THP", "XLA's output buffers backed by huge pages"),
                         ("reuse", "freed buffers reused from the heap, never unmapped")):
      gt = next((r for r in z_rows.get(f"1+{malloc}", []) if r["case"] == "gauss-bf16"), None)
      if gt:
        goals.append(f"- the same with `GLIBC_TUNABLES={MALLOC_VARIANTS[malloc]}` ({what}): "
                     f"encode **{_gbps(gt['raw_nbytes'], gt['encode_s']):.2f} GB/s**, decode "
                     f"**{_gbps(gt['raw_nbytes'], gt['decode_s']):.2f} GB/s**, "
                     f"{gt.get('encode_faults', 0):,.0f} and {gt.get('decode_faults', 0):,.0f} "
                     "page faults per call")
    if "host_encode_s" in g:
      goals.append(f"- the row codec alone on preallocated buffers, 1 thread: encode "
                   f"{_gbps(g['raw_nbytes'], g['host_encode_s']):.2f} GB/s, decode "
                   f"{_gbps(g['raw_nbytes'], g['host_decode_s']):.2f} GB/s")
    if zn:
      zne, znd = _gbps(zn["raw_nbytes"], zn["encode_s"]), _gbps(zn["raw_nbytes"], zn["decode_s"])
      line = (f"- vs ZipNN (1 thread) in this run: jit encode {ge / zne:.1f}x, decode "
              f"{gd / znd:.1f}x")
      gr = next((r for r in z_rows.get("1+reuse", []) if r["case"] == "gauss-bf16"), None)
      if gr:
        line += (f"; with heap-reuse malloc {_gbps(gr['raw_nbytes'], gr['encode_s']) / zne:.1f}x "
                 f"and {_gbps(gr['raw_nbytes'], gr['decode_s']) / znd:.1f}x")
      goals.append(line + " (goal about 4x and 2x)")
  md = [f"# Codec benchmark ({info['date']})", "",
        f"Machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"1-min load average at start {info.get('loadavg_1m', '?')}, other processes kept "
        f"{info.get('other_load_cores') or 0:.2f} cores busy on average during the run, "
        f"{info['machine']}, SIMD: {info['simd'] or 'none'}; Python {info['python']}; "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".", "",
        f"Input: {size:g} MiB per case (deterministic seed). Times: median (and best) of {runs} "
        "runs after 2 warm-up runs; GB/s = input bytes / time (1 GB = 1e9 B). zipccl: `jax.jit(encode)` / "
        "`jax.jit(decode)` on host (CPU) arrays with `block_until_ready`, one fresh process per "
        "thread count (`ZIPCCL_NUM_THREADS`); every output is checked bit-exact. The "
        "\"host buffers\" rows run the same C++ row codec through `encode_into`/`decode_into` "
        "on preallocated numpy buffers: the difference to the jit rows is XLA's per-call "
        "output allocation and dispatch. Peers run single-threaded on a copy of the same bytes "
        "(ZipNN modifies its input in place) and are checked to round-trip exactly.", "",
        "wire ratio = input bytes / the slot a compressed all-gather of the tensor moves (the "
        "first rung of the window codec's ladder at or above its used size); actual ratio = "
        "input / used bytes of the encoded row.", "",
        "page faults/call: minor page faults per jitted call (getrusage; averaged over all "
        "calls, the 2 warm-ups included). XLA allocates each "
        "call's output afresh; glibc serves allocations this large with a new mmap, so every "
        "call first-touches its whole output (the 64 MiB decode output is 16,384 faults of "
        "4 KiB). The codec's FFI handlers therefore madvise(MADV_HUGEPAGE) outputs of 8 MiB or "
        "more, so the kernel faults them in 2 MiB pages (ZIPCCL_NO_HUGEPAGES=1 turns that off; "
        "without them a thread decodes ~25% slower). The \"THP malloc\" rows rerun the same processes with "
        f"`GLIBC_TUNABLES={MALLOC_VARIANTS['THP']}` (malloc backs them with 2 MiB pages; the "
        "kernel still zeroes them), the \"heap-reuse malloc\" rows with "
        f"`GLIBC_TUNABLES={MALLOC_VARIANTS['reuse']}` (no mmap, no trim: the previous call's "
        "freed buffer is reused, no fault at all).", "",
        table, "", "## Goals", ""] + goals + [
        "", f"Plot: `{os.path.basename(base)}.png`.", "",
        "Reproduce: `python benchmarks/codec.py --size-mib "
        f"{size:g} --threads {','.join(threads)}`", ""]
  with open(base + ".md", "w") as f:
    f.write("\n".join(md))
  with open(base + ".json", "w") as f:
    json.dump({"machine": info, "size_mib": size, "runs": runs, "threads": threads,
               "zipccl": z_rows, "peers": peers}, f, indent=1)
  codec_plot(base + ".png", z_rows, peers)
  print("\n".join(md))
  log(f"wrote {base}.md, .json, .png")
  bad = [r for rows in z_rows.values() for r in rows if not r["roundtrip_ok"]] + \
        [p for p in peers if p.get("roundtrip_ok") is False]
  return 1 if bad else 0



# ---- main -----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python benchmarks/codec.py", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size-mib", type=float, default=None, help="MiB per case (default 64; "
                 "8 with --quick)")
  p.add_argument("--threads", default="1,2", help="zipccl thread counts, comma separated")
  p.add_argument("--runs", type=int, default=None, help="timed runs (median; default 9, 5 quick)")
  p.add_argument("--quick", action="store_true", help="small and fast (results get a _quick "
                 "suffix)")
  p.add_argument("--skip-peers", default="", help="comma separated: zipnn,blosc2,zstd")
  p.add_argument("--no-malloc-variants", action="store_true", help="skip the zipccl runs "
                 "with GLIBC_TUNABLES set for huge pages / heap reuse")
  p.add_argument("--out", default=RESULTS)
  p.add_argument("--from-json", default=None, metavar="FILE",
                 help="only re-render the report (.md, .png) of a finished run's .json")
  return p


def _worker_parser() -> argparse.ArgumentParser:
  """Internal: one thread count, in a fresh process (see run_zipccl)."""
  wk = argparse.ArgumentParser(prog="python benchmarks/codec.py _worker")
  wk.add_argument("--cases", required=True)
  wk.add_argument("--size-mib", type=float, required=True)
  wk.add_argument("--runs", type=int, required=True)
  wk.add_argument("--json-out", required=True)
  wk.add_argument("--threads-label", default="?")
  return wk


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["_worker"]:
    _zipccl_worker(_worker_parser().parse_args(argv[1:]))
    return 0
  return cmd_codec(_parser().parse_args(argv))


if __name__ == "__main__":
  sys.exit(main())
