"""The CUDA entropy codec (cuda/entropy.cu) without a GPU: its kernels, launch code
and FFI handler functions compiled for the CPU SIMT emulator (simt_host.h) by
tests/cuda/emulate_entropy.cc and compared with the CPU codec byte for byte (payloads,
stats, decoded words, decoder statuses of prefix-cut and corrupted payloads). The
emulator is shown to catch a missing barrier in these kernels. ptxas resources of
the kernels are checked by tests/test_cuda_build.py (same build as the window codec).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jax
import pytest

import zipccl_jax as _zc

ent = _zc.get_codec("entropy")   # the entropy codec's contract functions

ROOT = Path(__file__).resolve().parents[1]
GXX = shutil.which("g++") or shutil.which("c++")
SIMT_DIR = ROOT / "tests" / "cuda"  # the folder of simt_host.h (the one place to change when it moves)

needs_gxx = pytest.mark.skipif(GXX is None, reason="no host C++ compiler")


def _build(cuda_dir: Path, exe: Path) -> None:
  cc = subprocess.run(
      [GXX, "-O2", "-std=c++17", "-Wall", "-Wno-unknown-pragmas", "-U_FORTIFY_SOURCE", f"-I{ROOT / 'ffi'}",
       f"-I{cuda_dir}", f"-I{SIMT_DIR}", "-isystem", jax.ffi.include_dir(),
       str(ROOT / "tests" / "cuda" / "emulate_entropy.cc"), str(ROOT / "ffi" / "entropy_cpu.cc"), "-lpthread",
       "-o", str(exe)],
      capture_output=True, text=True, timeout=400)
  assert cc.returncode == 0, cc.stderr[-6000:]


@needs_gxx
def test_entropy_kernels_on_the_simt_emulator_match_cpu_codec(tmp_path):
  exe = tmp_path / "emulate_entropy"
  _build(ROOT / "cuda", exe)
  res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
  out = res.stdout + res.stderr
  assert res.returncode == 0 and " 0 failures" in res.stdout, out[-6000:]
  m = re.search(r"(\d+) cases, 0 failures", res.stdout)
  assert m and int(m.group(1)) >= 200, out[-2000:]
  seen = dict(map(int, kv.split(":")) for kv in re.search(r"payloads:((?: \d+:\d+)+)", res.stdout).group(1).split())
  assert all(seen[s] > 0 for s in range(9)) and sum(seen.values()) > 3000, seen
  # The handlers' workspace size is the one the Python module allocates.
  ws = re.findall(r"workspace_nbytes n=(\d+) W=(\d+)", res.stdout)
  assert len(ws) == 5 and all(ent.workspace_nbytes(int(n)) == int(w) for n, w in ws), ws


@needs_gxx
def test_simt_emulator_catches_a_missing_barrier_in_the_entropy_encoder(tmp_path):
  """Warps read the other streams' bit counts before they are all stored: the emulator must fail."""
  old = "    __syncthreads();  // (S) every stream's bit count is in s.sbits"
  cuda = tmp_path / "cuda"
  shutil.copytree(ROOT / "cuda", cuda)
  src = (cuda / "entropy.cu").read_text()
  assert src.count(old) == 1, "mutation anchor (S) not found in cuda/entropy.cu"
  (cuda / "entropy.cu").write_text(src.replace(old, "    (void)0;"))
  exe = tmp_path / "emulate_entropy"
  _build(cuda, exe)
  res = subprocess.run([str(exe), "--quick", "--stop"], capture_output=True, text=True, timeout=300)
  out = res.stdout + res.stderr
  assert res.returncode != 0, f"the emulator passed entropy kernels without barrier (S)\n{out[-2000:]}"
  # A mismatch, an emulator error, or a crash (garbage bit offsets can send a store out of
  # the CTA's guarded shared memory: killed by a signal).
  assert res.returncode < 0 or "FAIL" in out or "SIMT emulation error" in out, (res.returncode, out[-2000:])
