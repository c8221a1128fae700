#!/usr/bin/env python3
"""Static SASS report of the CUDA codec kernels (no GPU needed).

Compiles cuda/codec.cu for one architecture to a cubin, disassembles it and, for
each kernel, prints the instruction count, the number of CALLs (e.g. the 64-bit
division routine), the main loop (the backward branch spanning the most code)
and the basic blocks of that loop with the memory / synchronisation operations in
each. docs/cuda.md ("Expected throughput") reads the typical path of a tile off
these block tables; that reading is an estimate, not a measurement.

    python benchmarks/sass_report.py [--arch 90] [--kernels encode_kernel,decode_kernel] [--dtype BF16]
    python benchmarks/sass_report.py --source entropy      # cuda/entropy.cu (bf16 / fp16)

Needs nvcc and nvdisasm (CUDA toolkit; the copy that triton ships also works).
Writes benchmarks/results/sass_<date>_sm<arch>.md (entropy: sass_<date>_sm<arch>_entropy.md;
or --out).
"""
from __future__ import annotations

import argparse
import datetime
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTABLE = re.compile(r"^(LD|ST|RED|ATOM|BAR|SHFL|REDUX|LDGSTS|VOTE|NANOSLEEP|CALL|EXIT|MEMBAR|DEPBAR)")


def find_nvdisasm(nvcc: str) -> str | None:
  cands = [shutil.which("nvdisasm"), str(Path(nvcc).resolve().parent / "nvdisasm")]
  try:
    import triton  # noqa: PLC0415  (optional: only where the toolkit lacks nvdisasm)
    cands.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"))
  except Exception:  # noqa: BLE001
    pass
  return next((c for c in cands if c and Path(c).is_file()), None)


def parse(sass: str) -> dict[str, list[tuple[str, list[tuple[int, str]]]]]:
  """kernel name -> basic blocks [(label, [(address, instruction)])]."""
  out = {}
  parts = re.split(r"//-+ \.text\.(\S+) -+\n", sass)
  for name, body in zip(parts[1::2], parts[2::2]):
    blocks, cur = [], None
    for line in body.splitlines():
      m = re.match(r"\.(L_x_\d+):", line)
      if m:
        cur = (m.group(1), [])
        blocks.append(cur)
        continue
      m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
      if m:
        if cur is None:
          cur = ("entry", [])
          blocks.append(cur)
        cur[1].append((int(m.group(1), 16), m.group(2)))
    out[name] = [b for b in blocks if b[1]]
  return out


def opcode(ins: str) -> str:
  return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def report_kernel(name: str, blocks) -> list[str]:
  ins = [i for _, b in blocks for i in b]
  start = {lab: b[0][0] for lab, b in blocks}
  loops = []
  for addr, s in ins:
    m = re.search(r"BRA\b.*?\.(L_x_\d+)", s)
    if m and m.group(1) in start and start[m.group(1)] < addr:
      loops.append((start[m.group(1)], addr))
  calls = sum(1 for _, s in ins if opcode(s) == "CALL")
  lines = [f"### `{name}`", "", f"{len(ins)} instructions, {calls} CALL(s)"]
  if not loops:
    return lines + ["", "no loop", ""]
  lo, hi = max(loops, key=lambda t: t[1] - t[0])
  span = sum(1 for a, _ in ins if lo <= a <= hi)
  lines += [f"; main loop {lo:#x}-{hi:#x}: {span} instructions", "",
            "| block | address | instructions | memory / sync operations |", "|---|---|---|---|"]
  for lab, b in blocks:
    if lo <= b[0][0] <= hi:
      ops = " ".join(o for o in (opcode(s) for _, s in b) if NOTABLE.match(o))
      lines.append(f"| {lab} | {b[0][0]:#06x} | {len(b)} | {ops[:120]} |")
  return lines + [""]


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--arch", default="90", help="SM architecture (default 90)")
  ap.add_argument("--source", default="codec", choices=["codec", "entropy"],
                  help="cuda/codec.cu (window codec, default) or cuda/entropy.cu")
  ap.add_argument("--kernels", help="comma-separated kernel names (default: the source's tile/block kernels)")
  ap.add_argument("--dtype", default="BF16", choices=["BF16", "F16", "F32"])
  ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
  args = ap.parse_args()
  if args.kernels is None:
    args.kernels = "encode_kernel,decode_kernel" if args.source == "codec" else "ent_encode_kernel,ent_decode_blocks"
  if args.source == "entropy" and args.dtype == "F32":
    ap.error("the entropy codec has no fp32 kernels")
  nvcc = shutil.which("nvcc")
  if not nvcc:
    print("sass_report: nvcc is not on PATH", file=sys.stderr)
    return 2
  nvdisasm = find_nvdisasm(nvcc)
  if not nvdisasm:
    print("sass_report: no nvdisasm (CUDA toolkit or triton)", file=sys.stderr)
    return 2
  import jax  # noqa: PLC0415  (for the XLA FFI headers)
  with tempfile.TemporaryDirectory() as d:
    cubin = Path(d) / "codec.cubin"
    cmd = [nvcc, "-cubin", f"-arch=sm_{args.arch}", "-O3", "-std=c++17", f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'cuda'}",
           "-isystem", jax.ffi.include_dir(), str(ROOT / "cuda" / f"{args.source}.cu"), "-o", str(cubin)]
    subprocess.run(cmd, check=True)
    sass = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
  kernels = parse(sass)
  date = datetime.date.today().isoformat()
  ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
  version = next((ln.strip() for ln in ver.splitlines() if "release" in ln), "nvcc version unknown")
  src = "" if args.source == "codec" else " --source entropy"
  lines = [f"# SASS of the CUDA {args.source} kernels, sm_{args.arch}, {args.dtype} ({date})", "",
           f"`python benchmarks/sass_report.py{src} --arch {args.arch} --dtype {args.dtype}`; {version}.",
           "Static code, not a measurement: see docs/cuda.md, \"Expected throughput\".", ""]
  for want in args.kernels.split(","):
    for name, blocks in sorted(kernels.items()):
      # Window kernels are templates over <dtype>Traits, entropy kernels over DtypeCode 1 (bf16) / 2 (fp16).
      dtype_tag = f"{args.dtype}Traits" if args.source == "codec" else f"DtypeCodeE{1 if args.dtype == 'BF16' else 2}E"
      if want in name and dtype_tag in name:
        g = re.search(r"ELi(\d+)E", name)  # groups per thread, for the tile kernels
        short = f"{want}<{args.dtype}" + (f", G={g.group(1)}" if g else "") + ">"
        lines += report_kernel(short, blocks)
  text = "\n".join(lines)
  print(text)
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / f"sass_{date}_sm{args.arch}{'' if args.source == 'codec' else '_entropy'}.md"
  path.write_text(text + "\n")
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
