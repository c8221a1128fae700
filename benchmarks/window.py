"""Window-rule calibration: escape rate of the codec's block window vs the coverage-optimal
window per block vs the paper's RMS formula, over Gaussians of sigma 1e-8..1e3 and
heavy-tailed, sparse and outlier data.

    python benchmarks/window.py [--quick]  -> benchmarks/results/window_calibration.md
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script (python benchmarks/window.py): its folder is on sys.path
  import common  # type: ignore[no-redef]

BF16, RESULTS, log, machine_info = common.BF16, common.RESULTS, common.log, common.machine_info

BLOCK = 2048


def _blocks_e(x: np.ndarray) -> np.ndarray:
  """bf16 exponent fields as int16[nb, 2048] (x.size a multiple of 2048)."""
  w = x.view(np.uint16).reshape(-1, BLOCK)
  return ((w >> 7) & 0xFF).astype(np.int16)


def _hist(e: np.ndarray) -> np.ndarray:
  nb = e.shape[0]
  idx = (np.arange(nb, dtype=np.int64)[:, None] * 256 + e).reshape(-1)
  return np.bincount(idx, minlength=nb * 256).reshape(nb, 256)


def optimal_escapes(e: np.ndarray) -> tuple[int, int]:
  """Escapes of the coverage-optimal windows, per block, summed.

  Returns (plain 7-exponent window, best of that and the codec's zero mode: e = 0
  plus a 6-exponent window).
  """
  h = _hist(e)
  cs = np.concatenate([np.zeros((h.shape[0], 1), np.int64), np.cumsum(h, axis=1)], axis=1)
  win7 = cs[:, 7:256] - cs[:, 0:249]          # window [b, b+6], b = 0..248 (<= 255-7)
  best7 = win7.max(axis=1)
  win6 = cs[:, 7:256] - cs[:, 1:250]          # [b, b+5], b = 1..249
  zero = h[:, 0] + win6.max(axis=1)
  n = e.size
  return int(n - best7.sum()), int(n - np.maximum(best7, zero).sum())


def rms_escapes(x: np.ndarray, e: np.ndarray, offset: float = 5.35) -> int:
  """Escapes of the paper's rule: base = round(log2(rms) - 5.35) + 127, per block."""
  v = x.astype(np.float64).reshape(-1, BLOCK)
  v = np.where(np.isfinite(v), v, 0.0)
  rms = np.sqrt((v * v).mean(axis=1))
  with np.errstate(divide="ignore"):
    lg = np.log2(rms)
  base = np.where(rms > 0, np.round(lg - offset) + 127, 0)
  base = np.clip(base, 0, 255 - 6).astype(np.int16)[:, None]
  d = e - base
  return int(((d < 0) | (d > 6)).sum())


def rule_escapes(e: np.ndarray, c4: int = 13, refine: bool = True) -> int:
  """Escapes of the format's window rule (docs/format.md), re-implemented in numpy.

  First guess t = floor((4S - c4 N) / 4N) (the codec uses c4 = 13: base = floor(mean
  exponent - 3.25)), zero mode when more than 1/32 of the block is zero; then, with
  `refine`, the best of bases b-1, b, b+1 by coverage from four exponent counts
  (ties keep b, then prefer b-1), as the v1 encoder does. refine=False is the
  mean-exponent guess alone.
  """
  nb = e.shape[0]
  normal = (e > 0) & (e < 255)
  S = np.where(normal, e, 0).sum(axis=1).astype(np.int64)
  N = normal.sum(axis=1).astype(np.int64)
  Z = (e == 0).sum(axis=1)
  t = np.where(N > 0, np.floor_divide(4 * S - c4 * N, np.maximum(4 * N, 1)), 0)
  zmode = Z * 32 > BLOCK
  lo = np.where(zmode, 1, 0)
  hi = np.where(zmode, 250, 249)
  W = np.where(zmode, 6, 7)
  b = np.clip(np.where(zmode, t + 1, t), lo, hi)
  base = b
  if refine:
    h = _hist(e)
    rows = np.arange(nb)

    def cnt(v):
      return np.where((v >= 0) & (v <= 255), h[rows, np.clip(v, 0, 255)], 0)

    down = cnt(b - 1) - cnt(b + W - 1)
    up = cnt(b + W) - cnt(b)
    take_down = (b > lo) & (down > 0)
    best = np.where(take_down, down, 0)
    base = np.where(take_down, b - 1, b)
    base = np.where((b < hi) & (up > best), b + 1, base)
  d = e - base[:, None]
  in0 = (d >= 0) & (d <= 6)
  in1 = (e == 0) | ((d >= 0) & (d <= 5))
  return int(np.where(zmode[:, None], ~in1, ~in0).sum())



def window_datasets(n: int, seed: int = 7):
  rng = np.random.default_rng(seed)
  out = []
  for s in [1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.02, 0.1, 0.3, 1.0, 3.0, 10.0, 1e2, 1e3]:
    out.append((f"Gaussian sigma={s:g}", "gauss", rng.standard_normal(n) * s))
  # Sigma not a power of two or near one: the window's rounding matters most here.
  for s in [2**-6 * 1.19, 2**-6 * 1.41, 2**-6 * 1.68]:
    out.append((f"Gaussian sigma=2^-6*{s * 64:.2f}", "gauss", rng.standard_normal(n) * s))
  out.append(("Laplace b=0.02", "other", rng.laplace(0, 0.02, n)))
  out.append(("Student-t(3) x0.02", "other", rng.standard_t(3, n) * 0.02))
  g = rng.standard_normal(n) * 0.02
  out.append(("ReLU-like (half zeros)", "other", np.maximum(g, 0)))
  g = rng.standard_normal(n) * 0.02
  g.reshape(-1, BLOCK)[:, 1000] = 1e4 * 0.02  # one huge outlier in every block
  out.append(("one 1e4-sigma outlier per block", "other", g))
  g = rng.standard_normal(n) * 0.02
  g.reshape(-1, BLOCK)[:, 1000] = 1e30  # and a far larger one
  out.append(("one 1e30 outlier per block", "other", g))
  # An FSDP-like flat buffer: tensors of 3000 elements (not block aligned), scales 10^U(-4,0).
  sizes = np.full(n // 3000 + 1, 3000)
  scales = 10.0 ** rng.uniform(-4, 0, sizes.size)
  out.append(("mixed scales (3000-elem tensors, sigma 1e-4..1)", "other",
              (rng.standard_normal(sizes.sum()) * np.repeat(scales, sizes))[:n]))
  return [(name, kind, x.astype(np.float32).astype(BF16)) for name, kind, x in out]


def cmd_window(args) -> int:
  import jax.numpy as jnp
  import zipccl_jax as z
  n = (256 if args.quick else 1024) * BLOCK
  info = machine_info()
  log(f"window calibration: {n:,} bf16 elements ({n // BLOCK} blocks) per distribution")
  offsets = list(range(11, 16))  # first-guess offsets c4/4 = 2.75 .. 3.75
  rows = []
  for name, kind, x in window_datasets(n):
    e = _blocks_e(x)
    enc = z.encode(jnp.asarray(x))
    codec = int(enc.escape_count)  # every escape is counted, also in a row that does not fit
    opt7, optz = optimal_escapes(e)
    sweep = {c: rule_escapes(e, c) for c in offsets}
    sweep_mean = {c: rule_escapes(e, c, refine=False) for c in offsets}
    rows.append(dict(name=name, kind=kind, n=n, codec=codec, numpy_rule=sweep[13], opt7=opt7,
                     opt=optz, rms=rms_escapes(x, e), sweep=sweep, sweep_mean=sweep_mean,
                     mean_only=sweep_mean[13]))
    log(f"{name}: codec {100 * codec / n:.3f}%  mean guess alone "
        f"{100 * sweep_mean[13] / n:.3f}%  optimal {100 * optz / n:.3f}%  "
        f"RMS rule {100 * rows[-1]['rms'] / n:.3f}%")
  mismatch = [r["name"] for r in rows if r["codec"] != r["numpy_rule"]]
  pct = lambda k, r: f"{100 * r[k] / r['n']:.3f}%"  # noqa: E731
  lines = [
      "# Window rule calibration", "",
      f"{n:,} bf16 elements per distribution ({n // BLOCK} blocks of {BLOCK}); escape rate = "
      "escapes / n. Columns:", "",
      "- **codec**: the C++ encoder's block window (`escape_count` of `zipccl_jax.encode`), "
      "format v1 (docs/format.md): first guess `t = floor((4S - 13N) / 4N)` from S, N = sum "
      "and count of the block's normal exponent fields, i.e. base = floor(mean exponent - "
      "3.25), zero mode (e = 0 gets a code, the window shrinks to 6) when more than 1/32 of "
      "the block is zero; then the best of bases b-1, b, b+1 by coverage (four exponent counts).",
      "- **mean guess alone**: the first guess without the best-of-three step (the rule "
      "before it was added).",
      "- **optimal 7**: per block, the 7 consecutive exponents that cover most elements "
      "(histogram of each block); **optimal**: the best of that and the zero mode — the "
      "floor any window rule of this format can reach.",
      "- **gap**: codec minus optimal, in percentage points.",
      "- **RMS rule**: the paper's formula, base = round(log2(rms_block) - 5.35) + 127, "
      "7-wide window, no zero mode.", "",
      "| data | codec | mean guess alone | optimal 7 | optimal | gap (pp) | RMS rule |",
      "|---|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['name']} | {pct('codec', r)} | {pct('mean_only', r)} | {pct('opt7', r)} | "
                 f"{pct('opt', r)} | {100 * (r['codec'] - r['opt']) / n:+.3f} | {pct('rms', r)} |")
  gauss = [r for r in rows if r["kind"] == "gauss"]
  gmax = max(100 * (r["codec"] - r["opt"]) / n for r in gauss)
  gavg = lambda k: statistics.mean(100 * r[k] / n for r in gauss)  # noqa: E731
  lines += [
      "",
      ("A numpy re-implementation of the rule (`benchmarks/window.py: rule_escapes`) reproduces "
       "the codec's escape count exactly on every row." if not mismatch else
       f"**The numpy re-implementation of the rule DIFFERS from the codec on: "
       f"{', '.join(mismatch)}** (docs/format.md and the encoder disagree)."), "",
      f"Gaussian rows: codec {gavg('codec'):.3f}% on average vs optimal {gavg('opt'):.3f}% "
      f"(largest gap {gmax:+.3f} pp; goal: within 0.5 pp — {'met' if gmax <= 0.5 else 'MISSED'}); "
      f"mean guess alone {gavg('mean_only'):.3f}%; RMS rule {gavg('rms'):.3f}%.", "",
      "## The first guess's offset", "",
      "Escape rate with first guess base = floor(mean exponent - c), for offsets c near the "
      "codec's 3.25, with the best-of-three step (and, for the Gaussian mean, without it):", "",
      "| c | " + " | ".join(f"{c / 4:g}" for c in offsets) + " |",
      "|---|" + "---:|" * len(offsets),
      "| Gaussian (mean), guess alone | " + " | ".join(
          f"{statistics.mean(100 * r['sweep_mean'][c] / n for r in gauss):.3f}%"
          for c in offsets) + " |",
      "| Gaussian (mean) | " + " | ".join(
          f"{statistics.mean(100 * r['sweep'][c] / n for r in gauss):.3f}%" for c in offsets)
      + " |"]
  for r in rows:
    if r["kind"] != "gauss":
      lines.append(f"| {r['name']} | " + " | ".join(
          f"{100 * r['sweep'][c] / n:.3f}%" for c in offsets) + " |")
  lines += [
      "", "## Findings", "",
      "- Gaussian: the mean-exponent guess is already within ~0.2 pp of the optimum (the "
      "optimum moves between two bases as sigma crosses a band of ~0.2 in log2 sigma); "
      "the best-of-three step closes the rest.",
      "- Heavy tails (Laplace, Student-t(3)): the optimum sits one exponent lower than the "
      "Gaussian guess; the guess alone pays ~1.9-2.2 pp, the best-of-three step none. On "
      "pretrained weights the same step removes every overflow of the default capacity "
      "(capacity.md).",
      "- Outliers: the mean of exponents is a log-domain statistic: one outlier moves it by "
      "log2(outlier/sigma)/2048 exponents, while it moves the RMS by a factor of about "
      "outlier/(sigma*sqrt(2048)): with one 1e4-sigma value per block the RMS rule shifts the "
      "window up by ~8 exponents and escapes the whole block. The mean is also cheaper: "
      "integer sums of exponent bytes, no float square or log.",
      "- Sparse data (ReLU-like, half zeros): the zero mode holds the zeros; a plain 7-window "
      "escapes half the block.",
      "- Mixed scales inside one block (FSDP flat buffers whose tensors do not start at block "
      "boundaries): the blocks that straddle two scales escape the most; no window of 7 "
      "covers both.",
      "- Why the offset 3.25: for a Gaussian the mean exponent field is log2(sigma) + 127 - 1.42 "
      "(the mean of log2|x| of a unit normal is -0.92, flooring takes ~0.5 more), so "
      "floor(mean - 3.25) = floor(log2 sigma - 4.67) + 127, next to the paper's "
      "round(log2 sigma - 5.35) = floor(log2 sigma - 4.85).", "",
      f"Machine: {info['cpu']}. Reproduce: `python benchmarks/window.py`.", ""]
  path = os.path.join(args.out, "window_calibration" + ("_quick" if args.quick else "") + ".md")
  common.write_lines(path, lines)
  return 1 if mismatch else 0



# ---- capacity on pretrained weights ---------------------------------------------------


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python benchmarks/window.py", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--out", default=RESULTS)
  return cmd_window(p.parse_args(argv))


if __name__ == "__main__":
  sys.exit(main())
