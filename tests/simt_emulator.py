"""Building and running the SIMT-emulator drivers of tests/cuda (emulate_window.cc for
cuda/window.cu, emulate_entropy.cc for cuda/entropy.cu, emulate_transport.cc for
cuda/transport_sum.cuh): the one compile command and
the parsing of their summary lines, shared by tests/test_cuda_build.py and
tests/test_entropy_cuda.py."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
GXX = shutil.which("g++") or shutil.which("c++")
SIMT_DIR = ROOT / "tests" / "cuda"  # the folder of simt_host.h and the drivers (the one place to change when it moves)


def _cpu_object(cpu_source: str, flags: tuple) -> Path:
  """ffi/<cpu_source> compiled once per content: the mutation tests rebuild the driver
  with mutated kernels many times, while the CPU codec they compare with (half of
  each build's ~20 s) is the same. Cached by a hash of ffi/'s files, the compiler
  and the flags, in the temp directory; written atomically."""
  h = hashlib.sha256(" ".join((str(GXX),) + tuple(flags)).encode())
  for f in sorted((ROOT / "ffi").iterdir()):
    if f.is_file():
      h.update(f.name.encode() + f.read_bytes())
  cache = Path(tempfile.gettempdir()) / "zipccl_simt_cache"
  cache.mkdir(exist_ok=True)
  obj = cache / f"{Path(cpu_source).stem}-{h.hexdigest()[:20]}.o"
  if not obj.exists():
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    cc = subprocess.run(
        [GXX, "-O2", "-std=c++17", "-Wall", "-Wno-unknown-pragmas", *flags, f"-I{ROOT / 'ffi'}",
         "-isystem", jax.ffi.include_dir(), "-c", str(ROOT / "ffi" / cpu_source), "-o", str(tmp)],
        capture_output=True, text=True, timeout=300)
    assert cc.returncode == 0, cc.stderr[-6000:]
    os.replace(tmp, obj)
  return obj


def build(driver: str, cpu_source: str, cuda_dir: Path, exe: Path, *flags: str, timeout: int = 300) -> None:
  """tests/cuda/<driver> with the kernels of cuda_dir (the tree's, or a mutated copy), linked
  with ffi/<cpu_source> (the CPU codec it is compared with, compiled once: `_cpu_object`)."""
  obj = _cpu_object(cpu_source, flags)
  cc = subprocess.run(
      [GXX, "-O2", "-std=c++17", "-Wall", "-Wno-unknown-pragmas", *flags, f"-I{ROOT / 'ffi'}", f"-I{cuda_dir}",
       f"-I{SIMT_DIR}", "-isystem", jax.ffi.include_dir(), str(SIMT_DIR / driver),
       str(obj), "-lpthread", "-o", str(exe)],
      capture_output=True, text=True, timeout=timeout)
  assert cc.returncode == 0, cc.stderr[-6000:]


def run(exe: Path, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, str]:
  """The emulator's result and its stdout + stderr."""
  res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
  return res, res.stdout + res.stderr


def cases(stdout: str) -> int | None:
  """N of the summary line "N cases, 0 failures" (None without one)."""
  m = re.search(r"(\d+) cases, 0 failures", stdout)
  return int(m.group(1)) if m else None


def modes_seen(stdout: str) -> dict[int, int]:
  """The entropy driver's "block modes ...: mode:count ..." line: block modes of the rows compared."""
  return dict(map(int, kv.split(":")) for kv in re.search(r"block modes[^:]*:((?: \d+:\d+)+)", stdout).group(1).split())


def statuses_seen(stdout: str) -> dict[int, int]:
  """The "payloads: status:count ..." line: corrupted payloads compared, per decoder status."""
  return dict(map(int, kv.split(":")) for kv in re.search(r"payloads:((?: \d+:\d+)+)", stdout).group(1).split())
