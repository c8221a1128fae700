"""The CUDA codec without a GPU: it compiles, ptxas reports no spills or local
memory, the module imports and registers, the CPU-only build still works, and the
kernels themselves -- cuda/window.cu compiled for the CPU SIMT emulator of
tests/cuda/simt_host.h, launched through the FFI handler functions -- produce the
CPU codec's bytes and decoder statuses (tests/cuda/emulate_window.cc). The emulator is shown
to catch broken synchronisation by running it on deliberately broken kernels.

The GPU itself is exercised by benchmarks/gpu_check.py on a GPU machine.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ptxas import parse_ptxas
from tests import simt_emulator as emulator

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")
NINJA = shutil.which("ninja")
GXX = shutil.which("g++") or shutil.which("c++")
DTYPES = ("BF16", "F16", "F32")
GROUPS = (1, 2, 4)  # the tile kernels' variants: 8-element groups per thread
# cuda/window.cu min_ctas<T, G>(): CTAs per SM that __launch_bounds__ asks for.
MIN_CTAS = {("BF16", 1): 5, ("BF16", 2): 8, ("BF16", 4): 10, ("F16", 1): 5, ("F16", 2): 8, ("F16", 4): 10,
            ("F32", 1): 4, ("F32", 2): 5, ("F32", 4): 8}

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA module cannot be compiled here")


def _cmake(build: Path, *defs: str, timeout: int = 600) -> subprocess.CompletedProcess:
  gen = ["-G", "Ninja"] if NINJA else []
  cfg = subprocess.run(
      ["cmake", "-S", str(ROOT), "-B", str(build), *gen, f"-DPython_EXECUTABLE={sys.executable}", *defs],
      capture_output=True, text=True, timeout=timeout)
  assert cfg.returncode == 0, f"configure failed:\n{cfg.stdout}\n{cfg.stderr}"
  out = subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)],
                       capture_output=True, text=True, timeout=timeout)
  out.configure_log = cfg.stdout + cfg.stderr  # type: ignore[attr-defined]
  return out




@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
  if NVCC is None:
    pytest.skip("nvcc is not on PATH: the CUDA module cannot be compiled here")
  build = tmp_path_factory.mktemp("cuda_build")
  out = _cmake(build, "-DZIPCCL_CUDA=ON", "-DZIPCCL_CUDA_ARCHITECTURES=90", "-DZIPCCL_PTXAS_VERBOSE=ON")
  return build, out


@needs_nvcc
def test_cuda_module_compiles_without_spills(cuda_build):
  build, out = cuda_build
  log = out.stdout + out.stderr
  assert out.returncode == 0, f"CUDA build failed:\n{log[-6000:]}"
  assert list(build.glob("_zipccl_cuda*.so")), "the _zipccl_cuda module was not built"
  usage = parse_ptxas(log)
  want = {f"{k}<{d}> sm_90" for k in ("encode_finalize", "decode_finalize") for d in DTYPES}
  want |= {f"{k}<{d},G={g}> sm_90" for k in ("encode_kernel", "decode_kernel") for d in DTYPES for g in GROUPS}
  # The entropy codec's kernels (cuda/entropy.cu): bf16 and fp16, and a dtype-free finalize.
  want |= {f"{k}<{d}> sm_90" for k in ("ent_encode_kernel", "ent_encode_finalize", "ent_decode_rows",
                                       "ent_decode_blocks") for d in ("BF16", "F16")}
  want |= {"ent_decode_finalize sm_90", "ent_encode_tail sm_90"}
  assert want <= set(usage), f"ptxas -v did not report every kernel; got {sorted(usage)}"
  for name, u in sorted(usage.items()):
    assert u.get("stack") == 0 and u.get("spill_stores") == 0 and u.get("spill_loads") == 0, (name, u)
    # The register cap __launch_bounds__ sets (cuda/window.cu, min_ctas): 65536 / (threads x CTAs).
    m = re.search(r"<(\w+),G=(\d)>", name)
    # cuda/entropy.cu: ent_encode_kernel 256 threads x 6 CTAs (42 -> 40); ent_decode_blocks one warp x 16 CTAs
    # (65536 / 512 = 128: its 12.7 KB of shared memory per CTA allows 16 per SM, registers must too);
    # the other kernels (no min CTAs) 64.
    cap = 64 if not m else 65536 // ((256 // int(m.group(2))) * MIN_CTAS[m.group(1), int(m.group(2))])
    if name.startswith("ent_encode_kernel<"):
      cap = 40
    elif name.startswith("ent_decode_blocks<"):
      cap = 128
    assert 0 < u.get("registers", 0) <= cap, (name, u, cap)


@needs_nvcc
def test_cuda_module_imports_and_registers_without_a_gpu(cuda_build):
  build, out = cuda_build
  assert out.returncode == 0
  code = (
      "import sys; sys.path.insert(0, sys.argv[1])\n"
      "import _zipccl_cuda as m, jax\n"
      "r = m.registrations()\n"
      "import zipccl_jax._zipccl_cpu as cpu\n"
      "cpu_only = {'zipccl_row_pack', 'zipccl_segments_decode', 'zipccl_segments_encode'}\n"
      "assert set(r) == set(cpu.registrations()) - cpu_only, r\n"
      "assert sorted(r) == ['zipccl_agree', 'zipccl_bitcast_copy', 'zipccl_entropy_decode', 'zipccl_entropy_encode',"
      " 'zipccl_mailbox', 'zipccl_row_join', 'zipccl_row_prefix', 'zipccl_row_split', 'zipccl_row_sum', 'zipccl_row_unpack',"
      " 'zipccl_used_max', 'zipccl_zipccl_decode', 'zipccl_zipccl_encode'], r\n"
      "assert m.set_tile_groups(4) is None and m.set_tile_groups(0) is None\n"
      "for k, v in r.items(): jax.ffi.register_ffi_target(k, v, platform='CUDA')\n"
      "print('ok')\n")
  res = subprocess.run([sys.executable, "-c", code, str(build)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
  # Static cudart: no dynamic dependency on the CUDA runtime or driver libraries.
  if shutil.which("ldd"):
    so = next(build.glob("_zipccl_cuda*.so"))
    deps = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
    assert "libcudart" not in deps and "libcuda.so" not in deps, deps


def test_cpu_only_build(tmp_path):
  """ZIPCCL_CUDA=OFF builds the CPU module and nothing of CUDA, even where nvcc exists."""
  out = _cmake(tmp_path, "-DZIPCCL_CUDA=OFF")
  assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
  assert list(tmp_path.glob("_zipccl_cpu*.so"))
  assert not list(tmp_path.glob("_zipccl_cuda*"))
  cache = (tmp_path / "CMakeCache.txt").read_text()
  assert not re.search(r"^CMAKE_CUDA_COMPILER:", cache, re.M), "CUDA was enabled in a CUDA=OFF build"
  assert "zipccl_cuda_kernels" not in out.stdout + out.configure_log


def _build_emulator(cuda_dir: Path, exe: Path) -> None:
  """tests/cuda/emulate_window.cc with the kernels of cuda_dir/window.cu (the tree's, or a mutated copy)."""
  emulator.build("emulate_window.cc", "window_cpu.cc", cuda_dir, exe)


needs_gxx = pytest.mark.skipif(GXX is None, reason="no host C++ compiler")


@needs_gxx
def test_kernels_on_the_simt_emulator_match_cpu_codec(tmp_path):
  exe = tmp_path / "emulate_window"
  _build_emulator(ROOT / "cuda", exe)
  res, out = emulator.run(exe)
  assert res.returncode == 0 and " 0 failures" in res.stdout, out[-6000:]
  # It really ran: hundreds of cases, thousands of corrupted payloads over every status.
  m = emulator.cases(res.stdout)
  assert m and m >= 400, out[-2000:]
  seen = emulator.statuses_seen(res.stdout)
  assert all(seen[s] > 0 for s in range(10)) and sum(seen.values()) > 5000, seen


@needs_gxx
def test_row_sum_kernel_on_the_simt_emulator_matches_the_contract(tmp_path):
  """tests/cuda/emulate_transport.cc: cuda/transport_sum.cuh's kernel on the emulator,
  every word against ffi/transport.h's contract (dtypes, rows, batches, random words,
  a grid smaller than the columns)."""
  exe = tmp_path / "emulate_transport"
  emulator.build("emulate_transport.cc", "transport_cpu.cc", ROOT / "cuda", exe)
  res, out = emulator.run(exe)
  assert res.returncode == 0 and " 0 failures" in res.stdout, out[-6000:]
  assert (emulator.cases(res.stdout) or 0) >= 400, out[-2000:]


# Each mutation breaks the kernels' synchronisation in a way a GPU may or may not
# show on a given run; the emulator must catch every one. A mutation replaces the
# statement after a named marker `/*ZC_MUTATE:<name>*/` in the window codec's kernels
# (cuda/window_encode.cuh, cuda/window_decode.cuh; comments around it may change freely).
MUTATIONS = {
    "decoder reads a stage before the barrier after its copies":
        ("window_decode.cuh", "dec_syncA", "(void)0;"),
    "encoder waits for one cp.async group too few": ("window_encode.cuh", "enc_wait", "cp_wait<S>();"),
    "encoder reads the escape offset without the barrier that publishes it":
        ("window_encode.cuh", "enc_sync3", "(void)0;"),
}


def mutate(src: str, marker: str, statement: str) -> str:
  """src with the statement after /*ZC_MUTATE:marker*/ (up to its ';') replaced."""
  pattern = re.compile(r"(/\*ZC_MUTATE:" + re.escape(marker) + r"\*/)\s*[^;]*;")
  assert len(pattern.findall(src)) == 1, f"marker /*ZC_MUTATE:{marker}*/ not found once"
  return pattern.sub(lambda m: m.group(1) + " " + statement, src)


def _run_mutated(tmp_path, name: str, edit):
  """The quick emulator run (stopping at the first failure) with cuda/<name> replaced
  by edit(its text), in a copy of cuda/: (result, output)."""
  cuda = tmp_path / "cuda"
  shutil.copytree(ROOT / "cuda", cuda)
  (cuda / name).write_text(edit((cuda / name).read_text()))
  exe = tmp_path / "emulate_window"
  _build_emulator(cuda, exe)
  return emulator.run(exe, "--quick", "--stop", timeout=300)


@needs_gxx
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_simt_emulator_catches_broken_kernels(tmp_path, mutation):
  name, marker, statement = MUTATIONS[mutation]
  res, out = _run_mutated(tmp_path, name, lambda src: mutate(src, marker, statement))
  assert res.returncode != 0, f"the emulator passed kernels with this bug: {mutation}\n{out[-2000:]}"
  assert "FAIL" in out or "SIMT emulation error" in out, out[-2000:]


# Handlers that ignore the skip mask (cuda/device_util.h): the emulator's skipped-row
# cases (tests/cuda/emulate_common.h check_skipped_rows) must fail.
SKIP_MUTATIONS = {
    "encoder keeps the stats of skipped rows": ("if (r < rows && skip[r])", "if (false)"),
    "decoder ignores skip and fill": ("if (r >= rows || !skip[r]) return;", "return;"),
}


@needs_gxx
@pytest.mark.parametrize("mutation", sorted(SKIP_MUTATIONS))
def test_simt_emulator_catches_handlers_that_ignore_skip(tmp_path, mutation):
  old, new = SKIP_MUTATIONS[mutation]

  def edit(src):
    assert src.count(old) == 1, old
    return src.replace(old, new)

  res, out = _run_mutated(tmp_path, "device_util.h", edit)
  assert res.returncode != 0 and "FAIL skip" in out, f"the emulator passed: {mutation}\n{out[-2000:]}"
