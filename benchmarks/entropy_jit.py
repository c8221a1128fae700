"""Entropy codec through jax.jit on one thread: per-call medians of encode_rows and
decode_rows on a 64 MiB Gaussian row, with glibc's default allocator (XLA:CPU's
outputs freshly mmapped every call: first-touch page faults included) and with
zc.tune_host_allocator()'s setting (outputs reused from the heap). Each round runs
one child process per allocator, alternating, so that both see the same machine
load; separate processes because a heap that once held the large buffers keeps
serving them after the threshold is lowered again (glibc searches its free
chunks before it decides to mmap), which would hide the default's page faults.

    python benchmarks/entropy_jit.py [--mib 64] [--rounds 6] [--calls 3] [--dtype bf16|fp16]
        [--base-dir DIR]

Prints one line per (operation, allocator): median and best GB/s of input bytes
(1 GB = 1e9 B) over rounds x calls calls. ZIPCCL_NUM_THREADS=1.

--base-dir DIR also times a base revision's build in the same rounds (its child
processes alternate with this tree's): DIR is its wheel unpacked, e.g.
    git worktree add /tmp/base REV && pip wheel --no-build-isolation --no-deps \
      --config-settings=cmake.define.ZIPCCL_CUDA=OFF -w /tmp/wheel /tmp/base && \
      unzip -d /tmp/basepkg /tmp/wheel/*.whl
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("ZIPCCL_NUM_THREADS", "1")  # read once, at the codec's first use

if "--base-dir-import" in sys.argv:  # a base child: import the base's package, not this tree's
  _d = sys.argv[sys.argv.index("--base-dir-import") + 1]
  sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]
  sys.path.insert(0, _d)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import zipccl_jax as zc  # noqa: E402
from zipccl_jax._src import entropy  # noqa: E402



def child(mib: float, calls: int, dtype_name: str, tuned: bool) -> dict:
  """Times `calls` encodes and decodes after one warm-up call each (seconds)."""
  if tuned:
    zc.tune_host_allocator()
  dtype = jnp.bfloat16 if dtype_name == "bf16" else jnp.float16
  n = int(mib * 2**20) // 2
  x = jnp.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32)).astype(dtype)
  x = x.reshape(1, n)
  enc = jax.jit(entropy.encode_rows)
  dec = jax.jit(entropy.decode_rows, static_argnums=(1, 2))
  p, _ = enc(x)
  y, st = dec(p, n, dtype)
  ok = int(st[0]) == 0 and bool((np.asarray(y).view(np.uint16) == np.asarray(x).view(np.uint16)).all())
  del y, st
  out = {"ok": ok, "n": n}
  for name, f in (("encode", lambda: enc(x)), ("decode", lambda: dec(p, n, dtype))):
    jax.block_until_ready(f())
    ts = []
    for _ in range(calls):
      t0 = time.perf_counter()
      r = f()
      jax.block_until_ready(r)
      ts.append(time.perf_counter() - t0)
      del r
    out[name] = ts
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--mib", type=float, default=64)
  ap.add_argument("--rounds", type=int, default=6)
  ap.add_argument("--calls", type=int, default=3)
  ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
  ap.add_argument("--base-dir", default=None, help="an unpacked wheel of a base revision to time too")
  ap.add_argument("--child", choices=("default", "tuned"), help=argparse.SUPPRESS)
  ap.add_argument("--base-dir-import", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child:
    print(json.dumps(child(args.mib, args.calls, args.dtype, args.child == "tuned")))
    return 0
  if args.base_dir and not os.path.isdir(os.path.join(args.base_dir, "zipccl_jax")):
    ap.error(f"--base-dir: {args.base_dir} has no zipccl_jax package")
  builds = [("new", [])] + ([("base", ["--base-dir-import", os.path.abspath(args.base_dir)])] if args.base_dir else [])
  res: dict = {}
  ok, n = True, 0
  for rnd in range(args.rounds):
    order = builds if rnd % 2 == 0 else builds[::-1]
    for mode in ("default", "tuned"):
      for build, extra in order:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--mib", str(args.mib),
                            "--calls", str(args.calls), "--dtype", args.dtype] + extra,
                           check=True, capture_output=True, text=True)
        d = json.loads(r.stdout.strip().splitlines()[-1])
        ok, n = ok and d["ok"], d["n"]
        for name in ("encode", "decode"):
          res.setdefault((name, mode, build), []).extend(d[name])
  print(f"{args.dtype} n={n} ({args.mib} MiB) round trip {'ok' if ok else 'FAILED'}; "
        f"{args.rounds} rounds x {args.calls} calls per build and allocator, jax {jax.__version__}")
  for name in ("encode", "decode"):
    for mode in ("default", "tuned"):
      alloc = "tuned allocator (heap reuse)" if mode == "tuned" else "default allocator (fresh mmap)"
      line = f"{name:6s} {alloc:32s}"
      for build, _ in builds:
        ts = res[(name, mode, build)]
        line += (f" | {build}: median {2 * n / statistics.median(ts) / 1e9:5.2f} GB/s"
                 f" best {2 * n / min(ts) / 1e9:5.2f}")
      if args.base_dir:
        line += (f" | time new/base median "
                 f"{statistics.median(res[(name, mode, 'new')]) / statistics.median(res[(name, mode, 'base')]):.3f}")
      print(line)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
