"""One process of the multi-process collectives test (launched by test_multiprocess.py).

    python examples/launch.py -n N --local-devices K tests/_mp_worker.py OUT_DIR

Joins the launcher's jax.distributed job (CPU, gloo collectives), builds a
1-D mesh "x" over every device of every process, runs all five compressed
collectives (with stats) on Gaussian bf16 data and on data where the last device
(owned by the last process) holds incompressible blocks, and checks each local
shard bit for bit against a numpy reference that every process computes from the
same seed. Writes {"ok", "errors", "digests", "flags"} to OUT_DIR/worker<i>.json;
the test compares the digests of the replicated results across processes.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from pathlib import Path

# Launched as a script: make `tests.reference` importable from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv) -> int:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
  import launch
  if not launch.launched() or len(argv) != 2:
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2
  pid = int(os.environ[launch.ENV_PROCESS_ID])
  out_path = os.path.join(argv[1], f"worker{pid}.json")
  result = {"ok": False, "errors": [], "digests": {}, "flags": {}}
  try:
    launch.init_jax()
    import jax
    if os.environ.get("ZIPCCL_MP_CRASH_PID") == str(pid):
      os._exit(3)   # the launcher's own test: a worker dying while its peers wait
    _run(jax, result)
    result["ok"] = not result["errors"]
  except Exception:  # reported to the launcher, which fails the test with it
    result["errors"].append(traceback.format_exc())
  with open(out_path, "w") as f:
    json.dump(result, f)
  return 0 if result["ok"] else 1


def _run(jax, result):
  import jax.numpy as jnp
  import ml_dtypes
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import zipccl_jax as zc
  from tests.reference import ordered_sum

  bf16 = np.dtype(ml_dtypes.bfloat16)
  devices = jax.devices()
  n = len(devices)
  mesh = jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  rows, cols = 8, 512
  kw = dict(policy="always")
  ring = [(i, (i + 1) % n) for i in range(n)]

  def body(x):
    outs = (
        zc.compressed_all_gather(x, "x", tiled=True, to="invarying", stats=True, **kw),
        zc.compressed_all_to_all(x, "x", 1, 1, tiled=True, stats=True, **kw),
        zc.compressed_ppermute(x, "x", ring, stats=True, **kw),
        zc.compressed_psum_scatter(x, "x", scatter_dimension=1, tiled=True, stats=True, **kw),
        zc.compressed_psum(x, "x", stats=True, **kw),
    )
    flags = jnp.stack([o[1].fell_back for o in outs])
    return tuple(o[0] for o in outs), flags

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                            out_specs=((P(), P("x"), P("x"), P("x"), P()), P())))
  names = ("all_gather", "all_to_all", "ppermute", "psum_scatter", "psum")

  rng = np.random.default_rng(1234)
  gauss = rng.standard_normal((n * rows, cols)).astype(np.float32).astype(bf16)
  rand = gauss.copy()
  rand[(n - 1) * rows:] = rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint32) \
      .astype(np.uint16).view(bf16)
  outl = gauss.copy()
  e = rng.integers(1, 255, size=(rows, cols)).astype(np.uint16)
  outl[(n - 1) * rows:] = ((gauss[:rows].view(np.uint16) & 0x807F) | (e << 7)).view(bf16)

  for case, x, expect in (("gaussian", gauss, False), ("random_bits", rand, True),
                          ("outliers", outl, True)):
    blocks = np.split(x, n)
    col_chunks = [np.split(b, n, axis=1) for b in blocks]
    want = (
        x,
        np.concatenate([np.concatenate([col_chunks[s][d] for s in range(n)], axis=1)
                        for d in range(n)]),
        np.concatenate([blocks[(d - 1) % n] for d in range(n)]),
        np.concatenate([ordered_sum([col_chunks[s][d] for s in range(n)], bf16)
                        for d in range(n)]),
        ordered_sum(blocks, bf16),
    )
    xg = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("x")), lambda i: x[i])
    ys, flags = f(xg)
    flags = np.asarray(flags.addressable_data(0))
    result["flags"][case] = flags.tolist()
    if flags.tolist() != [expect] * 5:
      result["errors"].append(f"{case}: fell_back flags {flags.tolist()}, expected {expect}")
    for name, y, w in zip(names, ys, want):
      for shard in y.addressable_shards:
        got = np.asarray(shard.data).view(np.uint16)
        ref = w[shard.index].view(np.uint16)
        if name in ("psum_scatter", "psum"):   # NaN payloads of sums are the platform's
          nan = np.isnan(got.view(bf16).astype(np.float32)) & np.isnan(
              ref.view(bf16).astype(np.float32))
          got, ref = np.where(nan, 0, got), np.where(nan, 0, ref)
        if got.shape != ref.shape or not np.array_equal(got, ref):
          bad = np.flatnonzero(got.reshape(-1) != ref.reshape(-1)) if got.shape == ref.shape \
              else [0]
          result["errors"].append(
              f"{case} {name}: device {shard.device.id} differs from the reference "
              f"({len(bad)} words; shapes {got.shape} vs {ref.shape})")
          break
      if y.sharding.is_fully_replicated:
        data = np.asarray(y.addressable_data(0)).tobytes()
        result["digests"][f"{case}/{name}"] = hashlib.sha256(data).hexdigest()
  jax.distributed.shutdown()


if __name__ == "__main__":
  sys.exit(main(sys.argv))
