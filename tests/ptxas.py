"""Register, shared-memory and spill usage per CUDA kernel from `ptxas -v` output.

Used by tests/test_cuda_build.py (no spills, register caps) and by
benchmarks/gpu_check.py's build report.
"""
from __future__ import annotations

import re

# Entropy-codec kernels (cuda/entropy.cu) first: "encode_kernel" is part of "ent_encode_kernel".
KERNELS = ("ent_encode_kernel", "ent_encode_tail", "ent_encode_finalize", "ent_decode_rows", "ent_decode_blocks",
           "ent_decode_finalize", "encode_kernel", "encode_finalize", "decode_kernel", "decode_finalize")
ENTROPY_DTYPE_CODES = {"1": "BF16", "2": "F16"}  # cuda/entropy.cu kernels are templates over DtypeCode


def parse_ptxas(text: str) -> dict:
  res, name = {}, None
  for line in text.splitlines():
    m = re.search(r"Compiling entry function '(\S+)' for '(\w+)'", line)
    if m:
      kern = next((k for k in KERNELS if k in m.group(1)), None)
      dt = re.search(r"(BF16|F16|F32)Traits", m.group(1))
      code = re.search(r"DtypeCodeE(\d)E", m.group(1))
      g = re.search(r"ELi(\d+)E", m.group(1))  # the tile kernels' groups per thread G
      dts = dt.group(1) if dt else ENTROPY_DTYPE_CODES.get(code.group(1), "?") if code else ""
      targs = dts + (f",G={g.group(1)}" if g else "")
      name = (f"{kern}<{targs}> {m.group(2)}" if targs else f"{kern} {m.group(2)}") if kern else None
      if name:
        res[name] = {}
      continue
    if not name:
      continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
      res[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
    m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
    if m:
      res[name].update(registers=int(m.group(1)), smem=int(m.group(2)))
    elif re.search(r"Used (\d+) registers", line):
      res[name]["registers"] = int(re.search(r"Used (\d+) registers", line).group(1))
  return res
