"""Command line: `python -m zipccl_jax analyze FILE [FILE...]`.

Prints, for every tensor of .npy, .npz and .safetensors files (bfloat16 included),
what a codec does to it (`--codec`: any registered one, or "auto", the default:
per tensor the codec the collectives pick for its dtype, as `zipccl_jax.decide`
uncalibrated): the order-0 entropy bound on the ratio, the codec's ratio in used
bytes, the wire ratio a compressed collective of the tensor reaches (the slot of
the codec's ladder it moves), the escape rate (window codec), and whether the
bit-exact round trip holds. The first thing to run on a checkpoint.

Exit status: 0 all analyzed tensors round-trip; 1 a round trip failed or a tensor
could not be analyzed; 2 a file is missing, of an unknown kind or malformed (or
bad arguments).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import zipfile
from typing import Any, Sequence

import numpy as np

from zipccl_jax._src import analysis
from zipccl_jax._src import io as tio
from zipccl_jax._src import plan
from zipccl_jax._src.codecs import registry
from zipccl_jax._src.progress import progress_bar

_MANY_TENSORS = 10  # show a progress bar from this many tensors on


# ---- analysis of files ----------------------------------------------------------------


@dataclasses.dataclass
class Row:
  """One tensor's line of the table (JSON-serializable)."""
  file: str
  name: str
  dtype: str
  shape: list
  elements: int
  analyzed_elements: int = 0
  entropy_ratio: float | None = None
  ratio: float | None = None
  wire_ratio: float | None = None
  escape_rate: float | None = None
  escape_count: int | None = None
  roundtrip_ok: bool | None = None
  raw_nbytes: int = 0
  actual_nbytes: int = 0
  wire_nbytes: int = 0
  entropy_bits_total: float = 0.0
  skipped: str | None = None
  error: str | None = None
  note: str | None = None
  estimated: bool = False   # sampled (--max-elements): sizes estimated for the whole tensor
  codec: str | None = None  # the codec analyzed (with --codec auto: per dtype)


def analyze_tensor(path: str, t: tio.Tensor, max_elements: int, codec: str = "auto") -> Row:
  """Runs zipccl_jax.analyze(x, codec) on one tensor (subsampled past max_elements).

  codec "auto": the collectives' default codec for the tensor's dtype. A tensor of a
  dtype the codec does not take is listed as skipped.
  """
  row = Row(file=path, name=t.name, dtype=t.dtype, shape=list(t.shape), elements=t.size,
            note=t.note)
  if t.array is None:
    row.skipped = t.skip
    return row
  if codec == "auto":
    codec = plan.default_codec(t.array.dtype)
    if codec is None:
      row.skipped = "no codec takes this dtype"
      return row
  row.codec = codec
  c = registry.get(codec, "--codec")
  if not c.supports(t.array.dtype):
    row.skipped = (f"codec {codec!r} takes "
                   f"{', '.join(np.dtype(d).name for d in c.dtypes)}")
    return row
  x = tio.subsample(t.array, max_elements) if max_elements else t.array.reshape(-1)
  x = np.ascontiguousarray(x)
  row.analyzed_elements = int(x.size)
  if x.size >= 2**31 - 2048:
    row.error = (f"{x.size} elements is more than one encoded row holds (< 2^31); "
                 "use --max-elements")
    return row
  try:
    a = analysis.analyze(x, codec=codec)
  except Exception as e:  # report the tensor, go on with the others
    row.error = f"{type(e).__name__}: {e}"
    return row
  row.escape_rate, row.roundtrip_ok = a.escape_rate, a.roundtrip_ok
  if x.size == t.size:
    row.raw_nbytes = int(x.nbytes)
    row.actual_nbytes, row.wire_nbytes = a.actual_nbytes, a.wire_nbytes
    row.escape_count = a.escape_count
  else:
    _whole_tensor_estimate(row, a, t.size, x.dtype, c)
  if a.n:
    row.entropy_ratio = a.entropy_ratio
    row.entropy_bits_total = a.entropy_bits * row.elements
    row.ratio = row.raw_nbytes / row.actual_nbytes if row.actual_nbytes else None
    row.wire_ratio = row.raw_nbytes / row.wire_nbytes if row.wire_nbytes else None
  return row


def _whole_tensor_estimate(row: Row, a, n: int, dtype, c) -> None:
  """Sizes of the WHOLE tensor (n elements) from a sample's analysis `a`.

  A row is its fixed part (`min_nbytes`: header, block tables, what every row of
  that length holds) plus what the data adds. The sample's bytes above its own
  fixed part, scaled to n, plus the fixed part of n elements: so a sample of 1000
  elements of a 200,000-element tensor does not report the much worse ratio a
  1000-element row has. The window codec's escapes scale with the sample's rate
  (at most a byte each); the wire size is the ladder's slot for the estimate.
  """
  row.estimated = True
  m, item = a.n, np.dtype(dtype).itemsize
  per_elem = max(a.actual_nbytes - int(c.min_nbytes(dtype, m)), 0) / m
  row.raw_nbytes = n * item
  extra = math.ceil(per_elem * n)
  if a.escape_rate is not None:
    # the window codec: the sample's extra bytes are mostly its escape section's
    # 128-byte alignment; scale the escapes instead, at most a byte each
    row.escape_count = min(n, round(a.escape_rate * n))
    extra = row.escape_count
  row.actual_nbytes = min(-(-(int(c.min_nbytes(dtype, n)) + extra) // 128) * 128,
                          int(c.max_nbytes(dtype, n)))
  row.wire_nbytes = analysis.wire_nbytes(c.name, dtype, n, row.actual_nbytes if a.fits else None)


def total_row(rows: Sequence[Row], label: str) -> Row:
  """The sum over analyzed rows: byte-weighted ratios, escape rate over all elements."""
  done = [r for r in rows if r.roundtrip_ok is not None]
  raw = sum(r.raw_nbytes for r in done)
  n = sum(r.elements for r in done)     # sizes and escapes are whole-tensor (or estimates)
  ent = sum(r.entropy_bits_total for r in done)
  esc = sum(r.escape_count or 0 for r in done)
  actual = sum(r.actual_nbytes for r in done)
  wire = sum(r.wire_nbytes for r in done)
  dtypes = sorted({r.dtype for r in done})
  has_esc = any(r.escape_rate is not None for r in done)  # the window codec's field
  return Row(
      file="", name=label, dtype=dtypes[0] if len(dtypes) == 1 else ("mixed" if dtypes else "-"),
      shape=[], elements=n, analyzed_elements=sum(r.analyzed_elements for r in done),
      entropy_ratio=8 * raw / ent if ent else None, ratio=raw / actual if raw else None,
      wire_ratio=raw / wire if raw else None,
      escape_rate=esc / n if n and has_esc else None, escape_count=esc if has_esc else None,
      roundtrip_ok=all(r.roundtrip_ok for r in done) if done else None, raw_nbytes=raw,
      actual_nbytes=actual, wire_nbytes=wire, entropy_bits_total=ent,
      estimated=any(r.estimated for r in done),
      skipped=f"{len(rows) - len(done)} not analyzed" if len(done) < len(rows) else None)


# ---- output ---------------------------------------------------------------------------

_COLUMNS = ("tensor", "dtype", "shape", "elements", "entropy", "zipccl", "wire", "escapes",
            "roundtrip", "codec")  # column 5 is named after the codec; "codec" with auto only
_RIGHT = {3, 4, 5, 6, 7}  # right-aligned column indexes


def _fmt_ratio(v: float | None) -> str:
  if v is None:
    return "-"
  return f"{v:.3f}x" if math.isfinite(v) else "inf"  # inf: a constant tensor (0 bits)


def _cells(r: Row, is_total: bool = False) -> list[str]:
  shape = "" if is_total else "x".join(str(d) for d in r.shape) or "()"
  elems = f"{r.elements:,}"
  if r.analyzed_elements and r.analyzed_elements != r.elements:
    elems += f" (sampled {r.analyzed_elements:,})"
  dtype = r.dtype + ("*" if r.note else "")
  if r.skipped and not is_total:
    return [r.name, dtype, shape, elems, f"skipped: {r.skipped}", "", "", "", "", ""]
  if r.error:
    return [r.name, dtype, shape, elems, f"error: {r.error}", "", "", "", "", ""]
  esc = "-" if r.escape_rate is None else f"{100 * r.escape_rate:.2f}%"
  rt = "-" if r.roundtrip_ok is None else ("ok" if r.roundtrip_ok else "FAIL")
  return [r.name, dtype, shape, elems, _fmt_ratio(r.entropy_ratio), _fmt_ratio(r.ratio),
          _fmt_ratio(r.wire_ratio), esc, rt, r.codec or ""]


def _ratio_column(codec: str) -> str:
  # "zipccl" as it always was; "entropy codec" would otherwise read like the bound column
  if codec == "auto":
    return "ratio"
  return codec if codec == "zipccl" else f"{codec} codec"


def format_table(rows: Sequence[Row], total: Row | None, codec: str = "zipccl") -> str:
  """A plain-text table of rows plus a total line (the ratio column named after `codec`)."""
  keep = len(_COLUMNS) if codec == "auto" else len(_COLUMNS) - 1   # the codec column
  columns = (_COLUMNS[:5] + (_ratio_column(codec),) + _COLUMNS[6:])[:keep]
  body = [_cells(r)[:keep] for r in rows]
  tot = _cells(total, is_total=True)[:keep] if total is not None else None
  allrows = body + ([tot] if tot else [])
  # Long messages (skipped/error) span the metric columns: do not size columns by them.
  def spans(c):
    return c[4].startswith(("skipped:", "error:"))
  widths = [len(h) for h in columns]
  for c in allrows:
    for i, v in enumerate(c):
      if not (spans(c) and i == 4):
        widths[i] = max(widths[i], len(v))

  def line(c):
    out = []
    for i, (v, w) in enumerate(zip(c, widths)):
      if spans(c) and i == 4:
        out.append(v)
        break
      out.append(v.rjust(w) if i in _RIGHT else v.ljust(w))
    return "  ".join(out).rstrip()

  sep = "  ".join("-" * w for w in widths)
  lines = [line(list(columns)), sep] + [line(c) for c in body]
  if tot:
    lines += [sep, line(tot)]
  return "\n".join(lines)


_LEGEND = (
    "entropy: order-0 entropy bound on the ratio (fp32: exponent entropy + raw bits); "
    "{codec}: raw / used bytes of the encoded row (with --codec auto, the codec of the "
    "last column: the collectives' default for the dtype); wire: raw / the bytes a compressed "
    "collective of the tensor moves (the slot of the codec's ladder at or above the used "
    "size, or raw); escapes: exponents outside the block windows (window codec; - for "
    "other codecs); *: dtype interpreted (see --void2); dtypes the codec does not take are "
    "skipped. Sampled tensors (--max-elements; 'sampled N' in the elements column): the "
    "round trip is checked on the sample; ratios are estimates for the WHOLE tensor (the "
    "sample's coded bytes per element times all its elements, plus the per-row overhead "
    "once)."
)


# ---- main -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m zipccl_jax",
                              description="zipccl_jax: lossless exponent compression tools.")
  sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
  a = sub.add_parser("analyze", help="what a codec does to the tensors of files",
                     description="Analyze every tensor of .npy, .npz and .safetensors files "
                     "(bfloat16, float16, float32; other dtypes are listed as skipped).")
  a.add_argument("files", nargs="+", metavar="FILE", help=".npy, .npz or .safetensors file")
  a.add_argument("--max-elements", type=int, default=0, metavar="N",
                 help="analyze at most N elements of each tensor, sampled as evenly spaced "
                 "contiguous runs over the whole tensor; ratios are then estimates for the "
                 "whole tensor; 0 = all (default)")
  a.add_argument("--codec", default="auto", metavar="NAME",
                 help="the codec to measure: auto (default: per tensor the codec the "
                 "collectives pick for its dtype, entropy for bfloat16/float16, zipccl for "
                 "float32) or a registered codec name, e.g. zipccl (the window codec) or "
                 "entropy")
  a.add_argument("--json", action="store_true", help="print JSON instead of tables")
  a.add_argument("--void2", choices=("bfloat16", "float16", "skip"), default="bfloat16",
                 help="how to read 2-byte void arrays of .npy/.npz files, which is how "
                 "np.save stores ml_dtypes/JAX bfloat16 (default: bfloat16)")
  g = a.add_mutually_exclusive_group()
  g.add_argument("--progress", dest="progress", action="store_true", default=None,
                 help="always show a progress bar on stderr")
  g.add_argument("--no-progress", dest="progress", action="store_false",
                 help=f"never show one (default: from {_MANY_TENSORS} tensors on)")
  return p


def _count(path: str) -> int:
  """How many tensors a file holds, cheaply (for the progress bar)."""
  try:
    if path.lower().endswith(".safetensors"):
      header, _ = tio.read_safetensors_header(path)
      return sum(1 for k in header if k != "__metadata__")
    if path.lower().endswith(".npz"):
      with zipfile.ZipFile(path) as z:
        return len(z.infolist())
  except Exception:  # the real load reports the error
    pass
  return 1


def _json_default(o: Any):
  if isinstance(o, (np.integer,)):
    return int(o)
  if isinstance(o, (np.floating,)):
    return float(o)
  return str(o)


def _clean(v):
  return None if isinstance(v, float) and not math.isfinite(v) else v


def _row_dict(r: Row) -> dict:
  d = dataclasses.asdict(r)
  d.pop("entropy_bits_total")
  return {k: _clean(v) for k, v in d.items()}


def run_analyze(args, out=None, err=None) -> int:
  """Runs `analyze` on parsed arguments, writing to out/err (default: sys.stdout/stderr)."""
  out = sys.stdout if out is None else out
  err = sys.stderr if err is None else err
  # Fail fast, before any work, on files that cannot be read at all.
  bad = [p for p in map(tio.check_path, args.files) if p]
  if bad:
    for b in bad:
      print(f"error: {b}", file=err)
    return 2
  if args.max_elements < 0:
    print("error: --max-elements must be >= 0", file=err)
    return 2
  codec = getattr(args, "codec", "auto")
  if codec != "auto" and codec not in registry.names():
    print(f"error: --codec must be auto or one of {', '.join(registry.names())}, got {codec!r}",
          file=err)
    return 2

  total = sum(_count(f) for f in args.files)
  enabled = total >= _MANY_TENSORS if args.progress is None else args.progress
  bar = progress_bar(total, "analyze", unit="tensor", enabled=enabled, leave=False)
  status = 0
  per_file: list[tuple[str, list[Row], Row | None, str | None]] = []
  try:
    for f in args.files:
      rows: list[Row] = []
      failure = None
      try:
        for t in tio.iter_tensors(f, void2=args.void2, max_elements=args.max_elements):
          rows.append(analyze_tensor(f, t, args.max_elements, codec))
          bar.update(1)
      except tio.TensorFileError as e:
        failure = str(e)
        status = 2
      except (Exception, MemoryError) as e:  # anything else a hostile file causes: one line, exit 2
        failure = f"{f}: not readable ({type(e).__name__}: {e})"
        status = 2
      per_file.append((f, rows, total_row(rows, "TOTAL") if rows else None, failure))
  finally:
    bar.close()

  all_rows = [r for _, rows, _, _ in per_file for r in rows]
  if any(r.error or r.roundtrip_ok is False for r in all_rows):
    status = max(status, 1)
  grand = total_row(all_rows, "TOTAL (all files)")

  if args.json:
    doc = {"codec": codec, "files": [{"path": f, "error": failure, "tensors": [_row_dict(r) for r in rows],
                      "total": _row_dict(tot) if tot else None}
                     for f, rows, tot, failure in per_file],
           "total": _row_dict(grand), "status": status}
    json.dump(doc, out, indent=1, default=_json_default)
    out.write("\n")
  else:
    for f, rows, tot, failure in per_file:
      print(f"== {f}", file=out)
      if rows:
        print(format_table(rows, tot, codec), file=out)
      print(file=out)
    if len(per_file) > 1:
      print(format_table([], grand, codec), file=out)
      print(file=out)
    print(_LEGEND.format(codec=_ratio_column(codec)), file=out)
  for f, _, _, failure in per_file:
    if failure:
      print(f"error: {failure}", file=err)
  if any(r.roundtrip_ok is False for r in all_rows):
    print("error: a round trip was not bit-exact (see the roundtrip column)", file=err)
  return status


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of `python -m zipccl_jax` and the `zipccl-jax` script. Returns the exit status."""
  args = _parser().parse_args(argv)
  if args.command == "analyze":
    return run_analyze(args)
  raise AssertionError(args.command)  # argparse rejects other commands
