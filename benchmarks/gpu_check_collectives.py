"""The collective phases of `benchmarks/gpu_check.py` (6: the five collectives x both
codecs on a 1-device mesh, bit for bit; 7: the time of one 64 MiB bf16 collective).
"""
from __future__ import annotations

import time


if __package__:
  from benchmarks.gpu_check_codec import log, make, setup_jax, time_calls
else:  # run as a script: its folder is on sys.path
  from gpu_check_codec import log, make, setup_jax, time_calls  # type: ignore[no-redef]


def phase_collectives(args) -> dict:
  """The five compressed collectives and a gradient, jitted inside shard_map on a 1-device mesh of the
  GPU, for both codecs: the CUDA handlers inside lax.switch branches of the slot ladder. Every result
  is compared bit for bit with the lax collective (with one participant they are identities, but the
  whole encode -> agree -> switch -> decode path runs on the GPU), and stats must report a compressed
  rung on compressible data and the raw rung on random bits."""
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, _ = setup_jax(args)
  import jax.numpy as jnp
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array([gpu]), ("x",))
  failures, cases = 0, []
  n = 1 << 20 if not args.rehearse else 1 << 14
  ops = {
      "all_gather": (lambda v, c: zc.compressed_all_gather(v, "x", codec=c, tiled=True),
                     lambda v: jax.lax.all_gather(v, "x", tiled=True)),
      "psum_scatter": (lambda v, c: zc.compressed_psum_scatter(v, "x", codec=c, tiled=True),
                       lambda v: jax.lax.psum_scatter(v, "x", tiled=True)),
      "psum": (lambda v, c: zc.compressed_psum(v, "x", codec=c), lambda v: jax.lax.psum(v, "x")),
      "all_to_all": (lambda v, c: zc.compressed_all_to_all(v, "x", 0, 0, codec=c, tiled=True),
                     lambda v: jax.lax.all_to_all(v, "x", 0, 0, tiled=True)),
      "ppermute": (lambda v, c: zc.compressed_ppermute(v, "x", [(0, 0)], codec=c),
                   lambda v: jax.lax.ppermute(v, "x", [(0, 0)])),
  }
  for dt in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)):
    for dist in ("gauss", "bits"):
      x = jax.device_put(make(dist, n, dt, 7), gpu)
      for codec in ("zipccl", "entropy"):
        if codec == "entropy" and dt == np.float32:
          continue
        for name, (f, ref) in ops.items():
          t = time.time()
          try:
            g = jax.jit(jax.shard_map(lambda v: f(v, codec), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            r = jax.jit(jax.shard_map(ref, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            got, want = np.asarray(g(x)), np.asarray(r(x))
            word = {2: np.uint16, 4: np.uint32}[dt.itemsize]
            if name in ("psum", "psum_scatter"):
              # one participant: the sum is the input. lax may flush denormals to zero and quieten
              # NaNs (XLA:CPU does), so lax's bits or the input's are right, and NaN must stay NaN
              same = ((got.view(word) == want.view(word)) | (got.view(word) == np.asarray(x).view(word))
                      | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))))
            else:  # one participant: a gather / permute returns the input's bits exactly (lax may
              # quieten NaNs on the way, so the input is the reference, not lax)
              same = got.view(word) == np.asarray(x).view(word)
            ok = got.dtype == want.dtype and got.shape == want.shape and bool(same.all())
            detail = "" if ok else f"{int((~same).sum())} words differ"
          except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
          failures += not ok
          cases.append({"case": [dt.name, dist, codec, name], "ok": ok, "detail": detail})
          print(f"  {'ok  ' if ok else 'FAIL'} {dt.name:8s} {dist:6s} {codec:8s} {name:12s} "
                f"({time.time() - t:.1f}s) {detail}", flush=True)
  # grad through a compressed psum_scatter and all_gather (FSDP's pair), bf16, both codecs
  x = jax.device_put(make("gauss", n, ml_dtypes.bfloat16, 9), gpu)
  for codec in ("zipccl", "entropy"):
    def loss(v, f):
      return jnp.sum(f(v).astype(jnp.float32) ** 2)
    fz = jax.shard_map(lambda v: jax.grad(loss)(v, lambda u: zc.compressed_all_gather(u, "x", codec=codec, tiled=True)),
                      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    fr = jax.shard_map(lambda v: jax.grad(loss)(v, lambda u: jax.lax.all_gather(u, "x", tiled=True)),
                      mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    try:
      got, want = np.asarray(jax.jit(fz)(x)), np.asarray(jax.jit(fr)(x))
      ok = np.array_equal(got.view(np.uint16), want.view(np.uint16))
      detail = "" if ok else f"{int((got.view(np.uint16) != want.view(np.uint16)).sum())} words differ"
    except Exception as e:  # noqa: BLE001
      ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
    failures += not ok
    cases.append({"case": ["bfloat16", "gauss", codec, "grad(all_gather)"], "ok": ok, "detail": detail})
    print(f"  {'ok  ' if ok else 'FAIL'} bfloat16 gauss  {codec:8s} grad(all_gather) {detail}", flush=True)
  log(f"COLLECTIVES: {len(cases)} cases, {failures} failures")
  return {"ok": failures == 0, "failures": failures, "cases": cases}


# ---- phase 7: the time of one compressed collective on the GPU ----------------------------------


def phase_ctiming(args) -> dict:
  """One jitted collective of 64 MiB of Gaussian bf16 on a 1-device mesh of the GPU: lax, the raw
  transport (codec="raw") and both codecs (policy="always"), for the five collectives. With one
  participant nothing crosses a link, so the time over lax's is what a compressed call costs the GPU
  per call: the codec kernels, the size agreement, the slot switch (whose branch index XLA reads on
  the host), the slot copies. Results are checked bit for bit as in phase_collectives."""
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, _ = setup_jax(args)
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array([gpu]), ("x",))
  size = (64 << 20) >> (8 if args.rehearse else 0)
  dt = np.dtype(ml_dtypes.bfloat16)
  n = size // dt.itemsize
  reps, rounds = (10, 5) if args.quick else (20, 7)
  x = jax.device_put(make("gauss", n, dt, 11), gpu)
  xw = np.asarray(x).view(np.uint16)
  ops = {
      "all_gather": lambda v, c: (zc.compressed_all_gather(v, "x", codec=c, policy="always", tiled=True)
                                  if c else jax.lax.all_gather(v, "x", tiled=True)),
      "psum_scatter": lambda v, c: (zc.compressed_psum_scatter(v, "x", codec=c, policy="always", tiled=True)
                                    if c else jax.lax.psum_scatter(v, "x", tiled=True)),
      "psum": lambda v, c: (zc.compressed_psum(v, "x", codec=c, policy="always") if c
                            else jax.lax.psum(v, "x")),
      "all_to_all": lambda v, c: (zc.compressed_all_to_all(v, "x", 0, 0, codec=c, policy="always", tiled=True)
                                  if c else jax.lax.all_to_all(v, "x", 0, 0, tiled=True)),
      "ppermute": lambda v, c: (zc.compressed_ppermute(v, "x", [(0, 0)], codec=c, policy="always") if c
                                else jax.lax.ppermute(v, "x", [(0, 0)])),
  }
  rows, bad = [], 0
  for name, f in ops.items():
    row = {"collective": name}
    for codec in (None, "raw", "zipccl", "entropy"):
      g = jax.jit(jax.shard_map(lambda v, c=codec, f=f: f(v, c), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
      got = np.asarray(g(x)).view(np.uint16)
      # one participant: every op returns its input (a sum of one term; lax may quieten NaNs, the
      # Gaussian data has none)
      ok = got.shape == xw.shape and bool((got == xw).all())
      bad += not ok
      t, tmin = time_calls(jax, g, (x,), reps, rounds)
      row[codec or "lax"] = {"time_us": t * 1e6, "time_min_us": tmin * 1e6, "bit_identical": ok}
    rows.append(row)
    log(f"  {name:12s} " + "  ".join(f"{k} {row[k]['time_us']:8.1f} us" for k in ("lax", "raw", "zipccl", "entropy")))
  log(f"CTIMING: {len(rows) * 4} calls timed, {bad} results not bit-identical")
  return {"ok": bad == 0, "rows": rows, "bytes": size,
          "method": f"median over {rounds} rounds of {reps} back-to-back jitted calls, {size / 2**20:g} MiB bf16"}


