"""The entropy codec's phase of `benchmarks/gpu_check.py` (5, cuda/entropy.cu): GPU vs
CPU bytes and stats, GPU decode of whole and prefix-cut rows, statuses of corrupted
payloads, encode/decode GB/s next to a copy.
"""
from __future__ import annotations

import time



if __package__:
  from benchmarks.gpu_check_codec import corrupt_summary, log, make, setup_jax, time_calls
else:  # run as a script: its folder is on sys.path
  from gpu_check_codec import corrupt_summary, log, make, setup_jax, time_calls  # type: ignore[no-redef]


# ---- phase 5: the entropy codec (cuda/entropy.cu) -------------------------------------------------


def entropy_checksum_np(b) -> int:
  """The common v2 row checksum (COMMON.md) of an entropy payload row: over [0, used_nbytes) with
  bytes 24..31 read as zero, sum_j w_j (2j + 1) mod 2^64 over its u32 words."""
  import numpy as np
  used = int.from_bytes(bytes(b[16:24]), "little")
  w = np.frombuffer(bytes(b[:used]), "<u4").astype(np.uint64)
  w[6:8] = 0
  return int((w * (2 * np.arange(w.size, dtype=np.uint64) + np.uint64(1))).sum(dtype=np.uint64))


def phase_entropy(args) -> dict:
  """The entropy codec on the GPU against the CPU codec: encode bytes and stats, GPU decode of CPU
  payloads (whole rows and rows cut to the largest used_nbytes), decoder statuses of corrupted
  payloads; then encode/decode time of 64 MiB bf16 next to a copy of the same bytes."""
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, cpu = setup_jax(args)
  import jax.numpy as jnp
  ent = zc.codecs.get("entropy")
  bf16, f16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
  fns = {}

  def enc(dev, x2d):
    key = ("enc", x2d.shape, x2d.dtype, dev.platform)
    if key not in fns:
      fns[key] = jax.jit(ent.encode_rows)
    return tuple(np.asarray(a) for a in fns[key](jax.device_put(x2d, dev)))

  def dec(dev, p2d, n, dtype):
    key = ("dec", p2d.shape, n, dtype, dev.platform)
    if key not in fns:
      fns[key] = jax.jit(lambda q: ent.decode_rows(q, n, dtype))
    return tuple(np.asarray(a) for a in fns[key](jax.device_put(p2d, dev)))

  cases, failures = [], 0

  def case(dtype, dist, n, rows=1, seed=0):
    nonlocal failures
    t = time.time()
    name = f"{np.dtype(dtype).name:8s} {dist:8s} rows={rows} n={n}"
    if rows * n >= (1 << 20):
      print(f"  ...  {name}", flush=True)
    x = make(dist, rows * n, dtype, seed).reshape(rows, n)
    xw = x.view(np.uint16)
    pg, sg = enc(gpu, x)
    pc, sc = enc(cpu, x)
    msg = []
    if not np.array_equal(pg, pc):
      bad = np.argwhere(pg != pc)
      msg.append(f"{len(bad)} payload bytes differ, first at row {bad[0][0]} byte {bad[0][1]}: "
                 f"gpu {pg[tuple(bad[0])]:#04x} cpu {pc[tuple(bad[0])]:#04x}")
    if not np.array_equal(sg, sc):
      msg.append(f"stats gpu {sg.tolist()[:3]} cpu {sc.tolist()[:3]}")
    used = int(sc[:, 2].max()) * 128 if rows else 0
    for label, p in (("full", pc), ("prefix", pc[:, :used])):
      yg, stg = dec(gpu, p, n, dtype)
      if not (stg == 0).all():
        msg.append(f"{label} decode status gpu {stg.tolist()[:4]}")
      elif not np.array_equal(yg.view(np.uint16), xw):
        i = np.argwhere(yg.view(np.uint16) != xw)[0]
        msg.append(f"{label} decode differs at {tuple(i)}: {yg.view(np.uint16)[tuple(i)]:#06x} != {xw[tuple(i)]:#06x}")
    ok = not msg
    failures += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {name} used/128={sc[:, 2].tolist()[:3]} raw_blocks={sc[:, 1].tolist()[:3]} "
          f"({time.time() - t:.1f}s) {'; '.join(msg)}", flush=True)
    cases.append({"case": name.split(), "ok": ok, "detail": "; ".join(msg)})

  log("ENTROPY: GPU encode vs CPU encode (bytes + stats), GPU decode of CPU payloads (whole and prefix)")
  for dt in (bf16, f16):
    for n in [0, 1, 7, 4095, 4096, 4097, 100003]:
      case(dt, "gauss", n, seed=n)
    for dist in ["laplace", "gelu", "relu", "zeros", "bits", "outlier", "specials",
                 "relu_pm", "negzeros", "sparse", "zerosub", "zerosub9", "blockmix", "binade", "halfbinade"]:
      case(dt, dist, 4096 * 5 + 3 if args.quick else 300001, seed=len(dist))
    case(dt, "gauss", 4097, rows=3)
    case(dt, "gelu", 7, rows=5)
  big = (lambda v: min(v, 1 << 20)) if args.rehearse else (lambda v: v)  # noqa: E731
  case(bf16, "gauss", big(1 << 26) + 3)  # 64M+ elements: 16385 blocks, long look-back chains
  if not args.quick:
    case(f16, "gelu", 1 << 20, rows=2)

  log("ENTROPY: corrupted payloads (GPU status == CPU status)")
  corrupt = []
  # Gaussian (HUFF-E blocks) and ReLU (kind Z: HUFF-Z blocks).
  for dt, dist in [(bf16, "gauss"), (f16, "gauss"), (bf16, "relu"), (f16, "relu")]:
    n = 50001
    x = make(dist, n, dt, 11).reshape(1, n)
    pc, sc = enc(cpu, x)
    used = int(sc[0, 2]) * 128
    row = pc[0, :used]
    rng = np.random.default_rng(5)
    muts = []
    for lo, hi in [(0, 56), (56, 128), (128, 256), (256, used)]:
      for k in range(24):
        b = row.copy()
        b[int(rng.integers(lo, hi))] ^= np.uint8(1 << int(rng.integers(8)))
        if k % 2 and lo >= 128:  # re-sealed: block-level statuses instead of BAD_CHECKSUM
          b[24:32] = np.frombuffer(np.uint64(entropy_checksum_np(b)).tobytes(), np.uint8)
        muts.append(b)
    for pos, val in [(7, 1), (5, 3), (6, 1), (33, 7), (100, 1)]:
      b = row.copy()
      b[pos] = val
      b[24:32] = np.frombuffer(np.uint64(entropy_checksum_np(b)).tobytes(), np.uint8)
      muts.append(b)
    batch = np.stack(muts)
    yg, sg = dec(gpu, batch, n, dt)
    yc, scc = dec(cpu, batch, n, dt)
    same = (sg == scc) & (yg.view(np.uint16) == yc.view(np.uint16)).all(axis=1)
    corrupt.append(corrupt_summary(f"{np.dtype(dt).name} {dist}", sg, scc, same))
    failures += not corrupt[-1]["ok"]

  log("ENTROPY: timing")
  rows_t = []
  reps, rounds = (10, 5) if args.quick else (20, 7)
  # Gaussian (HUFF-E blocks), GELU-like activations (one-signed-ish: HUFF-J blocks, the
  # joint kind's 512-symbol alphabet and 7-bit packed plane) and ReLU (half +0: HUFF-Z
  # blocks, the compaction and expansion of the raw planes); fp16 (format v4: 64 / 128
  # symbols, byte plane + 2 / 1 packed bits) Gaussian and ReLU.
  plan = [(bf16, 64 << 20, "gauss"), (bf16, 64 << 20, "gelu"), (bf16, 64 << 20, "relu"), (f16, 64 << 20, "gauss"),
          (f16, 64 << 20, "relu")] + ([] if args.quick else [(bf16, 1 << 30, "gauss")])
  for dt, size, dist in plan:
    size >>= 8 if args.rehearse else 0
    n = size // 2
    with jax.default_device(gpu):
      g = jax.random.normal(jax.random.PRNGKey(3), (1, n), jnp.float32)
      if dist == "gelu":
        g = 0.5 * g * (1 + jnp.tanh(0.7978845608 * (g + 0.044715 * g**3)))
      elif dist == "relu":
        g = jnp.maximum(g, 0)
      else:
        g = g * 0.02 + 1e-3
      xv = g.astype(dt)
      del g
      xb = jax.lax.bitcast_convert_type(xv, jnp.uint16)
      salt = jnp.zeros((), jnp.uint16)
    xv = jax.device_put(xv, gpu)
    encf = jax.jit(ent.encode_rows)
    decf = jax.jit(lambda q: ent.decode_rows(q, n, dt))

    def bench(fn, *a):
      return time_calls(jax, fn, a, reps, rounds)[0]

    t_copy = bench(jax.jit(lambda v, s_: v ^ s_), xb, salt)
    t_enc = bench(encf, xv)
    payload, stats = encf(xv)
    t_dec = bench(decf, payload)
    y, st = decf(payload)
    pc, sc = enc(cpu, np.asarray(xv))
    identical = bool(np.array_equal(np.asarray(payload), pc)) and bool(np.array_equal(np.asarray(stats), sc))
    roundtrip = bool(jnp.array_equal(jax.lax.bitcast_convert_type(y, jnp.uint16), xb)) and int(st[0]) == 0
    ratio = 2 * n / (int(sc[0, 2]) * 128)
    for op, t, okb in [("encode", t_enc, identical), ("decode", t_dec, roundtrip)]:
      r = {"dtype": dt.name, "data": dist, "op": op, "n": n, "input_bytes": 2 * n, "time_us": t * 1e6,
           "gbps_input": 2 * n / t / 1e9, "copy_gbps": 4 * n / t_copy / 1e9, "ratio": ratio, "bit_identical": okb}
      rows_t.append(r)
      log(f"  entropy {dt.name} {dist} {op}: {t * 1e6:9.1f} us  {r['gbps_input']:7.1f} GB/s of input  copy {r['copy_gbps']:7.1f} GB/s"
          f"  ratio {ratio:.3f}  bit-identical {okb}")
    failures += not (identical and roundtrip)
  log(f"ENTROPY: {len(cases)} cases, {failures} failures")
  return {"ok": failures == 0, "failures": failures, "cases": cases, "corrupt": corrupt, "rows": rows_t,
          "method": f"median over {rounds} rounds of {reps} back-to-back jitted calls; copy = jitted x ^ s"}


