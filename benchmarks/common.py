"""Helpers shared by the benchmarks: results folder, logging, machine facts, timing.

Not part of the installed package: run the benchmarks from a checkout, either as
scripts (`python benchmarks/codec.py`) or as modules (`python -m benchmarks.codec`).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
# Results live next to the benchmarks, whatever the install mode of the package.
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def log(msg: str) -> None:
  print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_info() -> dict:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  try:
    affinity = len(os.sched_getaffinity(0))
  except AttributeError:
    affinity = os.cpu_count()
  info = {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": affinity,
          "machine": platform.machine(), "python": platform.python_version(),
          "date": datetime.datetime.now().isoformat(timespec="seconds")}
  flags = ""
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((ln for ln in f if ln.startswith("flags")), "")
  except OSError:
    pass
  try:
    info["loadavg_1m"] = round(os.getloadavg()[0], 2)
  except OSError:
    pass
  info["simd"] = " ".join(s for s in ("avx2", "avx512f", "avx512bw") if f" {s}" in flags)
  versions = {}
  for mod in ("jax", "jaxlib", "numpy", "zipnn", "blosc2", "zstandard", "torch"):
    try:
      versions[mod] = __import__(mod).__version__
    except Exception:
      pass
  info["versions"] = versions
  return info


def cpu_snapshot() -> tuple[float, float] | None:
  """(busy CPU seconds of the whole machine, CPU seconds of this process and its children)."""
  import resource
  try:
    with open("/proc/stat") as f:
      v = [int(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  hz = os.sysconf("SC_CLK_TCK")
  busy = (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait
  own = sum(getattr(resource.getrusage(w), k) for w in (resource.RUSAGE_SELF,
                                                        resource.RUSAGE_CHILDREN)
            for k in ("ru_utime", "ru_stime"))
  return busy, own


def other_load(start, end, wall: float) -> float | None:
  """Average number of cores other processes kept busy between two snapshots."""
  if start is None or end is None or wall <= 0:
    return None
  return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / wall)


def median_time(fn: Callable[[], object], runs: int, warmup: int = 2,
                setup: Callable[[], object] | None = None) -> tuple[float, list[float]]:
  """Median wall time of fn() over `runs` runs after `warmup` untimed ones.

  With `setup`, fn receives setup()'s result, made outside the timed region.
  """
  times = []
  for i in range(warmup + runs):
    arg = setup() if setup else None
    t0 = time.perf_counter()
    fn(arg) if setup else fn()
    dt = time.perf_counter() - t0
    if i >= warmup:
      times.append(dt)
  return statistics.median(times), times


# ---- data -----------------------------------------------------------------------------

def write_lines(path: str, lines: list) -> None:
  """Writes a markdown report, prints it, and logs where it went."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))
  log(f"wrote {path}")


def write_report(out: str, stem: str, text: str, doc: dict) -> None:
  """<out>/<stem>.md (the text, also printed) and <out>/<stem>.json (the doc)."""
  os.makedirs(out, exist_ok=True)
  write_lines(os.path.join(out, f"{stem}.md"), text.split("\n"))
  with open(os.path.join(out, f"{stem}.json"), "w") as f:
    json.dump(doc, f, indent=1)
