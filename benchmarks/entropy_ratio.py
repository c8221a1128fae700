"""Entropy codec benchmark: codec ratio on synthetic data kinds next to the order-0
bound, the window codec and ZipNN, plus single-thread encode/decode GB/s through
jax.jit on 64 MiB of Gaussian bf16 or fp16 (with ZipNN and the window codec timed
in the same run).

    python benchmarks/entropy_ratio.py [--ratio-mib 16 (0: speed only)] [--speed-mib 64]
        [--runs 7] [--tuned] [--speed-dtype bf16|fp16]
    -> benchmarks/results/entropy_ratio.md

--speed-mib 0 skips the speed section (ratios only).

Codec ratio = raw bytes / used_nbytes (the bytes a prefix-decodable row needs). The
order-0 bound is 16 / H(16-bit word) over the whole array. The window codec's
ratio is `analyze(x).ratio` (its row with the escape capacity set to the escapes
found). The codec threads are fixed to 1 (ZIPCCL_NUM_THREADS=1 unless already set).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("ZIPCCL_NUM_THREADS", "1")  # read once, at the codec's first use

import numpy as np  # noqa: E402

if __package__:
  from benchmarks import common  # noqa: E402
else:
  import common  # type: ignore[no-redef]  # noqa: E402

BF16, log = common.BF16, common.log
F16 = np.dtype(np.float16)


def gelu(v):
  return 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v**3)))


def make(kind: str, n: int, seed: int = 0) -> np.ndarray:
  """float64 data of one kind (scaled like training tensors)."""
  rng = np.random.default_rng(seed)
  if kind == "gaussian":
    return rng.standard_normal(n) * 0.02
  if kind == "laplace":
    return rng.laplace(size=n) * 0.02
  if kind == "student_t3":
    return rng.standard_t(3, size=n) * 0.01
  if kind == "gelu":
    return gelu(rng.standard_normal(n))
  if kind == "softmax":
    z = rng.standard_normal((-(-n // 1024), 1024)) * 2.0
    p = np.exp(z - z.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).reshape(-1)[:n]
  if kind == "mixed_scales":
    # fused gradients: every 1024 elements a tensor of its own scale (2^-24 .. 2^-4)
    m = -(-n // 1024)
    return (rng.standard_normal((m, 1024)) * np.exp2(rng.uniform(-24, -4, (m, 1)))).reshape(-1)[:n]
  if kind == "relu":
    return np.maximum(rng.standard_normal(n), 0.0)
  raise ValueError(kind)


KINDS = ["gaussian", "laplace", "student_t3", "gelu", "softmax", "mixed_scales", "relu"]
GROUP = {"gelu": "activations", "softmax": "activations", "relu": "activations"}


def order0_ratio(words: np.ndarray) -> float:
  c = np.bincount(words, minlength=1 << 16)
  p = c[c > 0] / words.size
  return 16.0 / float(-(p * np.log2(p)).sum())


def entropy_used(x: np.ndarray):
  import jax
  import jax.numpy as jnp
  import zipccl_jax as zc
  entropy = zc.codecs.get("entropy")
  p, s = jax.jit(entropy.encode_rows)(jnp.asarray(x.reshape(1, -1)))
  y, st = jax.jit(entropy.decode_rows, static_argnums=(1, 2))(p, x.size, x.dtype)
  ok = int(st[0]) == 0 and np.array_equal(np.asarray(y).reshape(-1).view(np.uint16),
                                          x.view(np.uint16))
  return int(s[0, 2]) * 128, int(s[0, 1]), ok


def window_ratio(x: np.ndarray) -> float | None:
  try:
    import zipccl_jax as zc
    return float(zc.analyze(x).ratio)
  except Exception as e:  # the window codec's API moves with its format version
    log(f"window codec ratio unavailable: {e}")
    return None


def zipnn_codec(dtype):
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      from zipnn import ZipNN
  except ImportError:
    return None
  name = {BF16: "bfloat16", F16: "float16"}[np.dtype(dtype)]
  return ZipNN(input_format="byte", bytearray_dtype=name, threads=1)


def ratio_rows(n: int) -> list[dict]:
  rows = []
  for dtype in (BF16, F16):
    for k, kind in enumerate(KINDS):  # both dtypes: every kind, the same seeds
      x = make(kind, n, seed=k).astype(dtype)
      used, raws, ok = entropy_used(x)
      z = zipnn_codec(dtype)
      zr = None
      if z is not None:
        comp = z.compress(bytearray(x.tobytes()))
        zr = x.nbytes / len(comp)
      row = dict(dtype="bf16" if dtype == BF16 else "fp16", kind=kind, n=n,
                 ratio=x.nbytes / used, raw_blocks=raws, roundtrip_ok=ok,
                 order0=order0_ratio(x.view(np.uint16)), window=window_ratio(x), zipnn=zr)
      log(f"{row['dtype']} {kind}: entropy {row['ratio']:.4f}  order0 {row['order0']:.4f}  "
          f"window {row['window']}  zipnn {zr}")
      rows.append(row)
  return rows


def _median_gbps(fn, nbytes, runs):
  t, _ = common.median_time(fn, runs)
  return nbytes / t / 1e9


def _cpu_gbps(fn, nbytes, runs, clock=time.thread_time):
  """Input bytes / median CPU time of fn() (after one warm-up call) by `clock`:
  thread CPU time by default, time.process_time for all threads of the process."""
  fn()
  times = []
  for _ in range(runs):
    t0 = clock()
    fn()
    times.append(clock() - t0)
  return nbytes / statistics.median(times) / 1e9


def speed_rows(n: int, runs: int, dtype=BF16) -> dict:
  import jax
  import jax.numpy as jnp
  import zipccl_jax as zc
  entropy = zc.codecs.get("entropy")
  x = make("gaussian", n).astype(dtype)
  dcode = 1 if np.dtype(dtype) == BF16 else 2  # the native entry points' dtype code
  xj = jnp.asarray(x.reshape(1, -1))
  enc = jax.jit(entropy.encode_rows)
  dec = jax.jit(entropy.decode_rows, static_argnums=(1, 2))
  p, s = enc(xj)
  out = {"entropy_encode": _median_gbps(lambda: enc(xj)[0].block_until_ready(), x.nbytes, runs),
         "entropy_decode": _median_gbps(lambda: dec(p, n, dtype)[0].block_until_ready(), x.nbytes,
                                        runs)}
  # The same calls in process CPU time (all threads, user + system: the work and
  # its page faults, not the time spent waiting for a core on a loaded machine).
  proc = time.process_time
  out["cpu_entropy_encode"] = _cpu_gbps(lambda: enc(xj)[0].block_until_ready(), x.nbytes, runs, proc)
  out["cpu_entropy_decode"] = _cpu_gbps(lambda: dec(p, n, dtype)[0].block_until_ready(), x.nbytes,
                                        runs, proc)
  y, st = dec(p, n, dtype)
  out["entropy_roundtrip_ok"] = bool(int(st[0]) == 0 and np.array_equal(
      np.asarray(y).reshape(-1).view(np.uint16), x.view(np.uint16)))
  try:  # the window codec, same data, its default options
    import zipccl_jax as zc
    xw = jnp.asarray(x)
    wenc = jax.jit(zc.encode)
    wdec = jax.jit(zc.decode)
    e = wenc(xw)
    out["window_encode"] = _median_gbps(lambda: jax.block_until_ready(wenc(xw)), x.nbytes, runs)
    out["window_decode"] = _median_gbps(lambda: wdec(e).block_until_ready(), x.nbytes, runs)
  except Exception as err:
    log(f"window codec timing skipped: {err}")
  # The row codecs on preallocated host buffers, timed in thread CPU time: no XLA
  # allocation, and waiting for a core under load does not count (sharing it does).
  import zipccl_jax as zc
  nat = zc.codecs.native()
  w8 = x.view(np.uint16).view(np.uint8)
  buf = np.zeros(entropy.max_nbytes(dtype, n), np.uint8)
  y8 = np.zeros(2 * n, np.uint8)
  used = nat.entropy_encode_into(dcode, w8, n, buf)[2]
  out["entropy_host_encode"] = _cpu_gbps(lambda: nat.entropy_encode_into(dcode, w8, n, buf), x.nbytes, runs)
  out["entropy_host_decode"] = _cpu_gbps(lambda: nat.entropy_decode_into(dcode, buf[:used], n, y8),
                                         x.nbytes, runs)
  try:
    import zipccl_jax as zc
    cap = n    # an escape area every row fits
    wbuf = np.zeros(nat.row_nbytes(dcode, n, cap), np.uint8)
    nat.encode_into(dcode, w8, n, cap, wbuf)
    # format v2: decode_into(dtype_code, payload, n, out) reads the row's used length
    enc = _cpu_gbps(lambda: nat.encode_into(dcode, w8, n, cap, wbuf), x.nbytes, runs)
    dec = _cpu_gbps(lambda: nat.decode_into(dcode, wbuf, n, y8), x.nbytes, runs)
    out["window_host_encode"], out["window_host_decode"] = enc, dec
  except Exception as err:  # the window codec's host entry points move with its format
    log(f"window codec host-buffer timing skipped: {err}")
  z = zipnn_codec(dtype)
  if z is not None:
    raw = x.tobytes()
    c = z.compress(bytearray(raw))
    t, _ = common.median_time(lambda b: z.compress(b), runs, setup=lambda: bytearray(raw))
    out["zipnn_encode"] = x.nbytes / t / 1e9
    out["zipnn_decode"] = _median_gbps(lambda: z.decompress(c), x.nbytes, runs)
    out["cpu_zipnn_encode"] = _cpu_gbps(lambda: z.compress(bytearray(raw)), x.nbytes, runs,
                                        time.process_time)
    out["cpu_zipnn_decode"] = _cpu_gbps(lambda: z.decompress(c), x.nbytes, runs, time.process_time)
  return out


def _fmt(v, spec=".4f"):
  return "n/a" if v is None else format(v, spec)


def report(rows, speed, info, args, wall, load) -> list[str]:
  lines = [f"# Entropy codec: ratios and single-thread speed ({info['date']})", "",
           f"Machine: {info['cpu']}, {info['usable_cores']} usable cores, SIMD: {info['simd']}; "
           f"1-min load average at start {info.get('loadavg_1m')}, other processes kept "
           f"{_fmt(load, '.2f')} cores busy on average during the run (timings under such load "
           f"are noisy: medians of {args.runs} runs); versions: "
           + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".", "",
           f"Command: `python benchmarks/entropy_ratio.py --ratio-mib {args.ratio_mib} "
           f"--speed-mib {args.speed_mib} --runs {args.runs}{' --tuned' if args.tuned else ''}"
           f"{'' if args.speed_dtype == 'bf16' else ' --speed-dtype ' + args.speed_dtype}` "
           f"(ZIPCCL_NUM_THREADS={os.environ['ZIPCCL_NUM_THREADS']}); wall {wall:.0f} s. "
           + ("Allocator: `zc.tune_host_allocator()` before JAX started (XLA's output buffers "
              "reused from the heap; ZipNN allocates its outputs as it always does)."
              if args.tuned else "Allocator: glibc defaults (every large jit output is a fresh "
              "mapping, faulted in page by page)."), ""]
  if rows:
    lines += [f"## Codec ratio ({args.ratio_mib} MiB per case)", "",
              "codec ratio = raw bytes / used_nbytes; order-0 = 16 / H(16-bit word); window = "
              "the window codec (`analyze(x).ratio`); ZipNN 1 thread, same bytes. "
              "`vs ZipNN` = entropy / ZipNN (goals: >= 99% on weights/gradients-like data, "
              ">= 97% on activations).", "",
              "| dtype | data | entropy codec | raw blocks | order-0 bound | % of bound | window codec "
              "| ZipNN | vs ZipNN | round trip |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
      vs = f"{100 * r['ratio'] / r['zipnn']:.1f}%" if r["zipnn"] else "n/a"
      lines.append(f"| {r['dtype']} | {r['kind']} | {r['ratio']:.4f} | {r['raw_blocks']} | "
                   f"{r['order0']:.4f} | {100 * r['ratio'] / r['order0']:.1f}% | "
                   f"{_fmt(r['window'])} | {_fmt(r['zipnn'])} | {vs} | "
                   f"{'ok' if r['roundtrip_ok'] else 'FAILED'} |")
  else:
    lines += ["(ratios not measured: --ratio-mib 0)"]
  if speed is None:
    return lines
  lines += ["", f"## Speed, 1 thread, {args.speed_mib} MiB Gaussian {args.speed_dtype} (GB/s = input bytes / "
            "median time, 1 GB = 1e9 B)", "",
            "| codec | encode GB/s | decode GB/s |", "|---|---:|---:|"]
  for name, key in (("entropy codec (XLA FFI, jax.jit)", "entropy"),
                    ("window codec (XLA FFI, jax.jit)", "window"), ("ZipNN (1 thread)", "zipnn"),
                    ("entropy row codec, host buffers, thread CPU time", "entropy_host"),
                    ("window row codec, host buffers, thread CPU time", "window_host")):
    if f"{key}_encode" in speed:
      lines.append(f"| {name} | {speed[key + '_encode']:.2f} | {speed[key + '_decode']:.2f} |")
  lines += ["", "The window codec's row is a load gauge: compare it with its numbers in the "
            "codec.md reports measured on a quieter machine (the same CPU and dtype)."]
  if "zipnn_encode" in speed:
    lines += ["", f"Entropy codec vs ZipNN in this run: encode "
              f"{speed['entropy_encode'] / speed['zipnn_encode']:.1f}x, decode "
              f"{speed['entropy_decode'] / speed['zipnn_decode']:.1f}x (goal: >= 3x / >= 2x)."]
  if "cpu_zipnn_encode" in speed:
    lines += ["", f"The same calls in process CPU time (median of {args.runs}; all threads, user + "
              "system: the work and its page faults, not the time spent waiting for a core on a "
              "loaded machine; ZipNN's compress includes copying its input into a fresh "
              "bytearray):", "", "| codec | encode GB/s | decode GB/s |", "|---|---:|---:|",
              f"| entropy codec (XLA FFI, jax.jit) | {speed['cpu_entropy_encode']:.2f} | "
              f"{speed['cpu_entropy_decode']:.2f} |",
              f"| ZipNN (1 thread) | {speed['cpu_zipnn_encode']:.2f} | {speed['cpu_zipnn_decode']:.2f} |",
              "", f"In process CPU time: encode {speed['cpu_entropy_encode'] / speed['cpu_zipnn_encode']:.1f}x, "
              f"decode {speed['cpu_entropy_decode'] / speed['cpu_zipnn_decode']:.1f}x ZipNN."]
  lines += ["", f"Round trip of the speed case: {'ok' if speed['entropy_roundtrip_ok'] else 'FAILED'}."]
  return lines


def machine_info() -> dict:
  """common.machine_info() with ZipNN's version (zipnn has no __version__)."""
  info = common.machine_info()
  try:
    from importlib import metadata
    info["versions"].setdefault("zipnn", metadata.version("zipnn"))
  except Exception:  # noqa: BLE001  (not installed: no row for it either)
    pass
  return info


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ratio-mib", type=float, default=16)
  ap.add_argument("--speed-mib", type=float, default=64)
  ap.add_argument("--runs", type=int, default=7)
  ap.add_argument("--speed-dtype", choices=("bf16", "fp16"), default="bf16",
                  help="dtype of the speed case (Gaussian data)")
  ap.add_argument("--out", default=None, help="report path (default results/entropy_ratio.md)")
  ap.add_argument("--tuned", action="store_true",
                  help="zipccl_jax.tune_host_allocator() before JAX starts (XLA's output buffers "
                       "reused from the heap, as the README recommends on CPU backends)")
  args = ap.parse_args(argv)
  if args.tuned:
    import zipccl_jax as zc
    if not zc.tune_host_allocator():
      ap.error("--tuned: glibc did not accept the allocator settings")
  info = machine_info()
  t0, snap0 = time.perf_counter(), common.cpu_snapshot()
  rows = ratio_rows(int(args.ratio_mib * 2**20) // 2) if args.ratio_mib > 0 else []
  speed = speed_rows(int(args.speed_mib * 2**20) // 2, args.runs,
                     BF16 if args.speed_dtype == "bf16" else F16) if args.speed_mib > 0 else None
  wall = time.perf_counter() - t0
  load = common.other_load(snap0, common.cpu_snapshot(), wall)
  path = args.out or os.path.join(common.RESULTS, "entropy_ratio.md")
  common.write_lines(path, report(rows, speed, info, args, wall, load))
  return 0 if all(r["roundtrip_ok"] for r in rows) and (speed is None or speed["entropy_roundtrip_ok"]) else 1


if __name__ == "__main__":
  sys.exit(main())
