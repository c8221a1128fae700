"""Host (CPU) runtime tuning that the codec's throughput depends on.

XLA:CPU allocates every call's output buffers afresh with malloc. glibc serves
allocations above its mmap threshold (at most 32 MiB by default) with a new
mmap, so each call first-touches its whole output in 4 KiB pages: for a 64 MiB
decode that is 16,384 page faults, ~36 ms of kernel time, more than the codec
itself takes (benchmarks/results/codec_*.md). Raising the threshold keeps large
buffers in the heap, where they are reused from call to call.

This is process-wide, so it is opt-in: call `tune_host_allocator()` once at the
start of a CPU-heavy program (or set MALLOC_MMAP_THRESHOLD_ / GLIBC_TUNABLES in
its environment).
"""
from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_host_allocator(mmap_threshold: int = 1 << 30) -> bool:
  """Keeps malloc'd buffers below `mmap_threshold` bytes in the reusable heap.

  Args:
    mmap_threshold: allocations at least this large still get their own mmap.
      The heap is trimmed (memory returned to the OS) only above twice this.

  Returns:
    True if glibc accepted the settings; False on other C libraries (no-op).

  Raises:
    ValueError: mmap_threshold is not a positive int.
  """
  if not isinstance(mmap_threshold, int) or isinstance(mmap_threshold, bool) or mmap_threshold <= 0:
    raise ValueError(f"tune_host_allocator: mmap_threshold must be a positive int, "
                     f"got {mmap_threshold!r}")
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  value = min(mmap_threshold, 2**31 - 1)
  ok = mallopt(_M_MMAP_THRESHOLD, value) == 1
  return ok and mallopt(_M_TRIM_THRESHOLD, min(2 * value, 2**31 - 1)) == 1
