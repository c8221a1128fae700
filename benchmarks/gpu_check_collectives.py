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




# ---- phase 8: planned vs ladder per call, between matmuls ----------------------------------------


def _steps_timed(jax, f, args, reps: int) -> tuple[float, float, object]:
  """(median seconds from the call to its return, median seconds to its outputs, the last
  outputs) over `reps` steps of f, each waited for, after one warm-up step."""
  import statistics
  out = jax.block_until_ready(f(*args))
  back, done = [], []
  for _ in range(reps):
    t0 = time.perf_counter()
    out = f(*args)
    t1 = time.perf_counter()
    jax.block_until_ready(out)
    back.append(t1 - t0)
    done.append(time.perf_counter() - t0)
  return statistics.median(back), statistics.median(done), out


def phase_planned(args) -> dict:
  """The planned transport (zipccl_jax.jit) against the ladder (jax.jit) per call, on the GPU: a
  step of K layers, each a matmul of a [B, D] bf16 activation with a [D, D] weight and a
  compressed psum_scatter of the product (entropy codec, policy="always"; a 1-device mesh, so the
  collective is the identity and the codec path runs), jitted three ways: lax, ladder, planned.

  Per variant: the step's time (median of steps, each waited for), the time the host takes to
  return from the call (a host that must read a conditional's branch index waits for the device
  to reach it, so the ladder's call returns late; lax's returns at once; a planned step returns
  after its validation, by design, so its return time is its step's), the overhead per call over
  lax in us ((step - lax step) / K), and the conditionals of the compiled HLO (the ladder: one
  per call; planned: none). The outputs must equal lax's bit for bit."""
  import jax.numpy as jnp
  import numpy as np
  jax, zc, gpu, _ = setup_jax(args)
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array([gpu]), ("x",))
  b, d, k = (64, 256, 4) if args.rehearse else (1024, 4096, 16)
  reps = 10 if args.quick else 30
  rng = np.random.default_rng(3)
  x = jax.device_put(jnp.asarray(rng.standard_normal((b, d)) * 0.02, jnp.bfloat16), gpu)
  w = jax.device_put(jnp.asarray(rng.standard_normal((k, d, d)) / np.sqrt(d), jnp.bfloat16), gpu)

  def layers(codec):
    def body(v, ws):
      for i in range(k):
        v = v @ ws[i]
        v = (jax.lax.psum_scatter(v, "x", tiled=True) if codec is None else
             zc.compressed_psum_scatter(v, "x", tiled=True, codec=codec, policy="always"))
      return v
    return jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))

  variants = {"lax": jax.jit(layers(None)), "ladder": jax.jit(layers("entropy")),
              "planned": zc.jit(layers("entropy"), compare_raw=False)}
  planned = variants["planned"]
  for _ in range(200):   # measuring steps, then until the plan compiled ahead is in force
    if planned.is_planned(x, w):
      break
    jax.block_until_ready(planned(x, w))
  rows, want = {}, None
  for name, f in variants.items():
    back, step, out = _steps_timed(jax, f, (x, w), reps)
    text = (f.compiled(x, w) if name == "planned" else f.lower(x, w).compile()).as_text()
    got = np.asarray(out).view(np.uint16)
    want = got if want is None else want
    rows[name] = {"step_us": step * 1e6, "return_us": back * 1e6,
                  "conditionals": text.count("conditional("), "bit_identical": bool((got == want).all())}
  for name, r in rows.items():
    r["per_call_over_lax_us"] = (r["step_us"] - rows["lax"]["step_us"]) / k
    log(f"  {name:8s} step {r['step_us']:9.1f} us  returns after {r['return_us']:9.1f} us  "
        f"{r['per_call_over_lax_us']:+8.1f} us/call over lax  conditionals {r['conditionals']}")
  ok = (all(r["bit_identical"] for r in rows.values()) and rows["planned"]["conditionals"] == 0
        and planned.is_planned(x, w))
  log(f"PLANNED: {'ok' if ok else 'FAILED'} (planned in force: {planned.is_planned(x, w)})")
  return {"ok": ok, "rows": rows, "layers": k, "shape": [b, d],
          "method": f"median of {reps} steps each waited for; {k} layers of a [{b}, {d}] @ [{d}, {d}] "
                    "bf16 matmul and a psum_scatter on a 1-device mesh"}
