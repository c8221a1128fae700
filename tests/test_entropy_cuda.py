"""The CUDA entropy codec (cuda/entropy.cu) without a GPU: its kernels, launch code
and FFI handler functions compiled for the CPU SIMT emulator (simt_host.h) by
tests/cuda/emulate_entropy.cc and compared with the CPU codec byte for byte (payloads,
stats, decoded words, decoder statuses of prefix-cut and corrupted payloads). The
emulator is shown to catch missing barriers and a missing decoder check in these
kernels. ptxas resources of the kernels are checked by tests/test_cuda_build.py (same
build as the window codec).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import zipccl_jax as _zc
from tests import simt_emulator as emulator

ent = _zc.codecs.get("entropy")   # the entropy codec's contract functions

ROOT = Path(__file__).resolve().parents[1]
GXX = emulator.GXX

needs_gxx = pytest.mark.skipif(GXX is None, reason="no host C++ compiler")


def _build(cuda_dir: Path, exe: Path) -> None:
  emulator.build("emulate_entropy.cc", "entropy_cpu.cc", cuda_dir, exe, "-U_FORTIFY_SOURCE", timeout=400)


@needs_gxx
def test_entropy_kernels_on_the_simt_emulator_match_cpu_codec(tmp_path):
  exe = tmp_path / "emulate_entropy"
  _build(ROOT / "cuda", exe)
  res, out = emulator.run(exe)
  assert res.returncode == 0 and " 0 failures" in res.stdout, out[-6000:]
  m = emulator.cases(res.stdout)
  assert m and m >= 300, out[-2000:]
  seen = emulator.statuses_seen(res.stdout)
  assert all(seen[s] > 0 for s in range(9)) and sum(seen.values()) > 3000, seen
  # Every block mode was compared: RAW, CONST and HUFF of kinds E and J, and kind Z
  # (format v3: 9 CONST-Z, 10 HUFF-Z).
  modes = emulator.modes_seen(res.stdout)
  assert all(modes.get(m, 0) > 0 for m in (0, 1, 2, 5, 6, 9, 10)), modes
  # ... and every one of them on fp16 rows alone (format v4: fp16 symbols carry the top
  # mantissa bit, so fp16 has its own alphabets, raw widths and kind Z expansion).
  f16 = re.search(r"fp16 rows' modes:((?: \d+:\d+)+)", res.stdout)
  f16_modes = dict(map(int, kv.split(":")) for kv in f16.group(1).split()) if f16 else {}
  assert all(f16_modes.get(m, 0) > 0 for m in (0, 1, 2, 5, 6, 9, 10)), f16_modes
  # The handlers' workspace size is the one the Python module allocates.
  ws = re.findall(r"workspace_nbytes n=(\d+) W=(\d+)", res.stdout)
  assert len(ws) == 5 and all(ent.workspace_nbytes(int(n)) == int(w) for n, w in ws), ws


@needs_gxx
@pytest.mark.parametrize("old,new", [
    # Encoder: warps read the other streams' bit counts before they are all stored.
    ("    __syncthreads();  // (S) every stream's bit count is in s.sbits", "    (void)0;"),
    # Encoder, kind Z's compaction: warps read the other warps' counts of nonzero elements
    # before they are stored (and overwrite the bit area that others still copy out).
    ("      __syncthreads();  // the warp totals are stored; the bit area is read (s.u.cr overlays it)",
     "      (void)0;"),
    # Decoder: a HUFF-Z block's raw part is no longer checked against the decoded nz
    # (the crafted last-block +-1 payloads must then differ from the CPU's status 7).
    ("      if (kb.rz != traits_c<D>().raw_bytes(kKindJ, kb.nz)) st = kDecBadStream;\n"
     "      else expand_z<D>(kb, lane);", "      expand_z<D>(kb, lane);"),
    # Decoder join of kinds E and J with the format v3 raw width (M, not M - q): fp16 kind E
    # rows (v4: raw = s << 9 | m[8:0]) lose their sign bit.
    ("pmask = (1u << pw) - 1, rw = t.raw_width(kKindJ);", "pmask = (1u << pw) - 1, rw = t.mbits;"),
    # Encoder mode choice with RAW first in ties (format v3's order; v4 puts RAW last): fp16
    # one-element blocks then stay RAW where the CPU writes CONST-J of the same 6 bytes.
    ("uint32_t best = max_block_bytes(len) + 1, coding = kRaw", "uint32_t best = max_block_bytes(len), coding = kRaw"),
], ids=["streams_barrier", "kind_z_compaction_barrier", "kind_z_raw_size_check", "fp16_join_raw_width",
        "raw_last_in_ties"])
def test_simt_emulator_catches_broken_entropy_kernels(tmp_path, old, new):
  """A barrier of the encoder or a check of the decoder removed, or a format v4 rule reverted
  to v3's: the emulator must fail."""
  cuda = tmp_path / "cuda"
  shutil.copytree(ROOT / "cuda", cuda)
  parts = [cuda / name for name in ("entropy.cu", "entropy_encode.cuh", "entropy_encode_rows.cuh",
                                    "entropy_decode.cuh", "entropy_decode_rows.cuh",
                                    "entropy_device.cuh")]
  hits = [p for p in parts if old in p.read_text()]
  assert len(hits) == 1 and hits[0].read_text().count(old) == 1, \
      f"mutation anchor not found once in the entropy kernels: {old!r}"
  hits[0].write_text(hits[0].read_text().replace(old, new))
  exe = tmp_path / "emulate_entropy"
  _build(cuda, exe)
  res, out = emulator.run(exe, "--quick", "--stop", timeout=300)
  assert res.returncode != 0, f"the emulator passed entropy kernels without {old!r}\n{out[-2000:]}"
  # A mismatch, an emulator error, or a crash (garbage bit offsets can send a store out of
  # the CTA's guarded shared memory: killed by a signal).
  assert res.returncode < 0 or "FAIL" in out or "SIMT emulation error" in out, (res.returncode, out[-2000:])
