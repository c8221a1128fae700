"""The window codec's phases of `benchmarks/gpu_check.py` (3 identity, 4 timing) and
the helpers every GPU phase uses. Each phase runs in a process of its own (the
driver's `--phase NAME`) and returns a JSON-able dict with "ok".
"""
from __future__ import annotations

import itertools
import os
import statistics
import time


# A phase subprocess gets the driver's start time (run_phase_subprocess), so the log has one timeline.
T0 = float(os.environ.get("ZIPCCL_GPU_CHECK_T0") or time.time())


def log(msg: str) -> None:
  print(f"[gpu_check +{time.time() - T0:6.1f}s] {msg}", flush=True)


# The tile kernels' variants (8-element groups per thread; cuda/window.cu, docs/cuda.md).
GROUP_VARIANTS = (1, 2, 4)


def set_tile_groups(groups: int) -> None:
  """Chooses the CUDA tile-kernel variant of later calls in this process (0: the default).

  The CUDA module's setter (ZIPCCL_CUDA_GROUPS is read once per process); a no-op
  where the module is missing (a rehearsal without nvcc: the CPU has no variants).
  """
  try:
    import zipccl_jax._zipccl_cuda as cuda
  except ImportError:
    return
  cuda.set_tile_groups(groups)

# ---- shared helpers for the GPU phases ------------------------------------------------------


def backend_name(args) -> str:
  """What plays the GPU's part, for logs and the report."""
  return "CPU (rehearsal stand-in for the GPU)" if args.rehearse else "GPU"


def setup_jax(args):
  import jax
  import zipccl_jax as zc
  if args.rehearse:  # the CPU device plays the GPU's part: CPU vs CPU, every code path, no GPU needed
    return jax, zc, jax.devices("cpu")[0], jax.devices("cpu")[0]
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if not gpus:
    raise RuntimeError(f"no GPU device visible to jax: {jax.devices()}")
  if not zc.has_cuda_support():
    raise RuntimeError("zipccl_jax.has_cuda_support() is False: the CUDA module is not installed")
  return jax, zc, gpus[0], jax.devices("cpu")[0]


def make(dist: str, n: int, dtype, seed: int):
  import numpy as np
  rng = np.random.default_rng(seed)
  dtype = np.dtype(dtype)
  word = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
  if dist == "gauss":
    x = rng.standard_normal(n) * 0.02
  elif dist == "laplace":
    x = rng.laplace(size=n)
  elif dist == "zeros":
    x = np.zeros(n)
  elif dist == "bits":
    return rng.integers(0, 2**(8 * dtype.itemsize), n, dtype=np.uint64).astype(word).view(dtype)
  elif dist == "relu":
    x = np.maximum(rng.standard_normal(n), 0)
  # Zeros for the entropy codec's kind Z (format v3: the raw bits of +-0 elided when a
  # 4096-element block has no subnormal).
  elif dist == "relu_pm":  # half +-0 with balanced signs
    g = rng.standard_normal(n)
    x = np.where(rng.random(n) < 0.5, np.where(rng.random(n) < 0.5, -0.0, 0.0), g)
  elif dist == "negzeros":  # all -0: CONST-Z blocks
    x = np.full(n, -0.0)
  elif dist == "sparse":  # 95% +0
    x = np.where(rng.random(n) < 0.95, 0.0, rng.standard_normal(n))
  elif dist in ("zerosub", "zerosub9", "blockmix"):
    # zerosub: ReLU with a subnormal per ~1000 elements (no block Z-valid); zerosub9: the same with
    # subnormals whose top mantissa bit is set (entropy format v4, fp16: coded exponent 1, so the
    # elements of coded exponent 0 are exactly the zeros, yet no block is Z-valid); blockmix:
    # 4096-element blocks of +0, ReLU, Gaussian, -0 and ReLU with one subnormal, in turn.
    i = np.arange(n)
    g = rng.standard_normal(n)
    c = (i // 4096) % 5 if dist == "blockmix" else np.full(n, 4)
    x = np.select([c == 0, c == 1, c == 2, c == 3], [0.0, np.maximum(g, 0), g, -0.0], np.maximum(g, 0))
    w = x.astype(dtype).view(word).copy()
    sub = (rng.random(n) < 0.001) if dist != "blockmix" else ((c == 4) & (i % 4096 == 77))
    mbits = 10 if dtype == np.float16 else 7
    w[sub] = (1 << (mbits - 1)) | 1 if dist == "zerosub9" else 1  # else the smallest positive subnormal
    return w.view(dtype)
  elif dist in ("binade", "halfbinade"):
    # +-[1, 2) and +-[1, 1.5): one exponent, the top mantissa bit uniform or always 0 (entropy
    # format v4, fp16: two coded exponents (HUFF blocks) or one (CONST blocks with raw planes))
    x = np.where(rng.random(n) < 0.5, -1.0, 1.0) * (1 + rng.random(n) * (1.0 if dist == "binade" else 0.5))
  elif dist == "gelu":  # one-signed-ish activations: the entropy codec's joint (sign, exponent) kind
    g = rng.standard_normal(n)
    x = 0.5 * g * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g**3)))
  elif dist == "outlier":  # one huge value in some blocks
    x = rng.standard_normal(n)
    x[1000::2048 * 3] = 6e4 if dtype == np.float16 else 1e30
  elif dist == "specials":
    bits = {np.dtype("float16"): (5, 10), np.dtype("float32"): (8, 23)}.get(dtype, (8, 7))
    ebits, mbits = bits
    expo = ((1 << ebits) - 1) << mbits
    sign = 1 << (8 * dtype.itemsize - 1)
    pats = np.array([0, sign, expo, expo | sign, expo | 1, expo | (1 << (mbits - 1)) | 5, expo | sign | 3,
                     1, sign | 1, (1 << mbits) - 1, (1 << mbits) | 1, sign | ((1 << mbits) - 1)], dtype=np.uint64)
    w = (rng.standard_normal(n).astype(dtype)).view(word).copy()
    pick = rng.random(n) < 0.3
    w[pick] = pats[rng.integers(0, len(pats), int(pick.sum()))].astype(word)
    return w.view(dtype)
  else:
    raise ValueError(dist)
  return x.astype(dtype)


def sections(dtype, n: int, nbytes: int) -> list[tuple[str, int, int]]:
  """The row's sections (format v4) in a row of nbytes bytes: the escape section runs to the end;
  "planes" includes the plane section's padding (its end is the library's min_nbytes)."""
  import numpy as np
  import zipccl_jax as zc
  rb = 3 if np.dtype(dtype).itemsize == 4 else 1
  al = lambda v: -(-v // 128) * 128  # noqa: E731
  nb = -(-n // 2048)
  t0 = 128
  r0 = t0 + al(8 * nb)
  p0 = r0 + al(rb * n)
  e0 = zc.codecs.get("zipccl").min_nbytes(dtype, n)
  return [("header", 0, 128), ("table", t0, r0), ("raw", r0, p0), ("planes", p0, e0), ("escapes", e0, max(nbytes, e0))]


def describe_diff(a, b, dtype, n) -> str:
  import numpy as np
  if a.shape != b.shape:
    return f"shape {a.shape} vs {b.shape}"
  diff = np.flatnonzero(a.reshape(a.shape[0], -1) != b.reshape(b.shape[0], -1))
  if not diff.size:
    return "identical"
  nbytes = a.shape[-1]
  parts = []
  for name, lo, hi in sections(dtype, n, nbytes):
    cols = diff % nbytes
    k = int(((cols >= lo) & (cols < hi)).sum())
    if k:
      parts.append(f"{name}: {k}")
  i = int(diff[0])
  r, c = divmod(i, nbytes)
  return (f"{diff.size} bytes differ ({', '.join(parts)}); first at row {r} byte {c}: "
          f"gpu {a.reshape(-1)[i]:#04x} cpu {b.reshape(-1)[i]:#04x}")


def checksum_np(buf):
  """Format v2 checksum of the bytes given (a row's first used_nbytes; numpy, for re-sealing
  corrupted payloads): bytes 24..31 read as zero."""
  import numpy as np
  b = buf.copy()
  b[24:32] = 0
  w = b.view("<u4").astype(np.uint64)
  j = np.arange(w.size, dtype=np.uint64)
  with np.errstate(over="ignore"):
    return int(np.sum(w * (2 * j + 1), dtype=np.uint64))


# ---- phase 3: identity ------------------------------------------------------------------------


def compare_case(x, pg, sg, pc, sc, yg, stg, stc, dtype, n) -> tuple[bool, bool, str]:
  """(encode identical, decode ok, what differs) for one identity case: the GPU's payload and stats
  (pg, sg) against the CPU's (pc, sc), and the GPU's decode (yg, stg) of the CPU payload against the
  CPU decoder's status stc and the input x (rows that fail must be all-one bits). A function of its
  own so that the mismatch reports, which a CPU-vs-CPU rehearsal never reaches, can be tested
  (tests/test_gpu_check.py)."""
  import numpy as np
  word = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
  enc_ok = pg.shape == pc.shape and bool((pg == pc).all()) and bool((sg == sc).all())
  msg = "" if enc_ok else ("payload " + describe_diff(pg, pc, dtype, n) +
                           ("" if (sg == sc).all() else f"; stats gpu {sg.tolist()} cpu {sc.tolist()}"))
  dec_ok = bool((stg == stc).all())
  if not dec_ok:
    msg += f" decode status gpu {stg.tolist()} cpu {stc.tolist()}"
  good = stc == 0
  if good.any():
    same = (yg[good].view(word) == x[good].view(word))
    if not same.all():
      dec_ok = False
      i = int(np.flatnonzero(~same.reshape(-1))[0])
      msg += (f" decoded values differ at {i}: {yg[good].view(word).reshape(-1)[i]:#x} != "
              f"{x[good].view(word).reshape(-1)[i]:#x}")
  if (~good).any() and not (yg[~good].view(word) == np.iinfo(word).max).all():
    dec_ok = False
    msg += " a row that failed to decode is not all-one bits"
  return enc_ok, dec_ok, msg


def corrupt_summary(dtype_name: str, sg, scc, same) -> dict:
  """Logs and summarises one batch of corrupted payloads: `same` says per payload whether the GPU
  agreed with the CPU (sg, scc: their decoder statuses)."""
  import numpy as np
  hist = {int(k): int(v) for k, v in zip(*np.unique(scc, return_counts=True))}
  ok = bool(same.all())
  bad = np.flatnonzero(~same)[:8].tolist()
  log(f"  {'ok  ' if ok else 'FAIL'} {dtype_name}: {len(same)} corrupted payloads, CPU statuses {hist}"
      + ("" if ok else f"; mismatches at {bad}: gpu {sg[bad].tolist()} cpu {scc[bad].tolist()}"))
  return {"dtype": dtype_name, "count": int(len(same)), "ok": ok, "cpu_status_hist": hist}


def time_calls(jax, fn, args, reps: int, rounds: int) -> tuple[float, float]:
  """(median, min) seconds per call of fn(*args) over `rounds` rounds of `reps` back-to-back calls,
  after one warm-up call (compilation)."""
  out = fn(*args)
  jax.block_until_ready(out)
  times = []
  for _ in range(rounds):
    t = time.perf_counter()
    for _ in range(reps):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t) / reps)
  del out
  return statistics.median(times), min(times)


def phase_identity(args) -> dict:
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, cpu = setup_jax(args)
  import zipccl_jax as zcodec
  bf16, f16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
  dtypes = [bf16, f16, f32]
  enc_fn, dec_fn = {}, {}
  # GPU calls take the tile-kernel variants in turn (set_tile_groups), so every
  # variant meets the cases and decodes payloads another variant encoded. The
  # choice is read when XLA runs (or captures) the call: one jitted function per
  # variant.
  variants, variant_calls = itertools.cycle(GROUP_VARIANTS), {g: 0 for g in GROUP_VARIANTS}

  def variant(dev) -> int:
    if dev is not gpu:  # (in a rehearsal the CPU is both, and every call rotates)
      return 0
    g = next(variants)
    set_tile_groups(g)
    variant_calls[g] += 1
    return g

  def encode(dev, x2d):
    key = (x2d.shape, x2d.dtype, variant(dev))
    if key not in enc_fn:
      enc_fn[key] = jax.jit(zcodec.encode_rows)
    p, s = enc_fn[key](jax.device_put(x2d, dev))
    return np.asarray(p), np.asarray(s)

  def decode(dev, p2d, n, dtype):
    key = (p2d.shape, n, dtype, variant(dev))
    if key not in dec_fn:
      dec_fn[key] = jax.jit(lambda q: zcodec.decode_rows(q, n, dtype))
    y, s = dec_fn[key](jax.device_put(p2d, dev))
    return np.asarray(y), np.asarray(s)

  results, failures = [], 0

  def case(dtype, dist, n, rows=1, seed=0):
    nonlocal failures
    t = time.time()
    name = f"{np.dtype(dtype).name:8s} {dist:8s} rows={rows} n={n}"
    if rows * n >= (1 << 20):  # announce big cases (the last line names a case that crashed)
      print(f"  ...  {name}", flush=True)
    x = make(dist, rows * n, dtype, seed).reshape(rows, n)
    pg, sg = encode(gpu, x)
    pc, sc = encode(cpu, x)
    yg, stg = decode(gpu, pc, n, dtype)
    _, stc = decode(cpu, pc, n, dtype)
    enc_ok, dec_ok, msg = compare_case(x, pg, sg, pc, sc, yg, stg, stc, dtype, n)
    # Prefix decoding: the rows cut to the largest used size (rows that do not fit: 4).
    cut = min(int(sc[:, 2].max(initial=0)) * 128, pc.shape[1]) if rows else 0
    yg2, stg2 = decode(gpu, pc[:, :cut], n, dtype)
    _, stc2 = decode(cpu, pc[:, :cut], n, dtype)
    _, dec2_ok, msg2 = compare_case(x, pc, sc, pc, sc, yg2, stg2, stc2, dtype, n)
    dec_ok = dec_ok and dec2_ok
    msg += (" prefix:" + msg2) if msg2 else ""
    ok = enc_ok and dec_ok
    failures += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {name} status={sc[:, 0].tolist()[:4]} "
          f"esc={sc[:, 1].tolist()[:4]} ({time.time() - t:.1f}s) {msg}", flush=True)
    results.append({"case": name.split(), "ok": ok, "encode_identical": enc_ok, "decode_ok": dec_ok, "detail": msg})

  log("IDENTITY: GPU encode vs CPU encode (bytes + stats), GPU decode of CPU payloads")
  sizes = [0, 1, 7, 8, 1001, 2047, 2048, 2049, 4097, 100003, 1 << 20]
  for dt in dtypes:
    for n in sizes:
      case(dt, "gauss", n)
    for dist in ["laplace", "zeros", "bits", "relu", "outlier", "specials"]:
      for n in ([2049, 300001] if not args.quick else [4099]):
        case(dt, dist, n, seed=n)
    case(dt, "bits", 50000)            # does not fit (random bits)
    case(dt, "gauss", 0, rows=2)       # n = 0
    case(dt, "gauss", 2049, rows=3)    # several rows, misaligned (odd n)
    case(dt, "outlier", 7, rows=5)     # tiny misaligned rows
    case(dt, "bits", 3001, rows=4)     # rows that do not fit, several at once
  # Large cases. A rehearsal caps them at 1M elements (4 MiB of fp32), same odd tails, same overflow.
  big = (lambda v: min(v, 1 << 20)) if args.rehearse else (lambda v: v)  # noqa: E731
  if not args.quick:
    case(f16, "gauss", 1 << 20, rows=2)
    case(f32, "laplace", big(1 << 22) + 5)
  case(bf16, "gauss", big(1 << 28) + 3)   # 256M+ elements
  if not args.quick:
    case(bf16, "bits", big(1 << 24) + 1)  # 16M random bits: does not fit, at scale

  log("IDENTITY: corrupted payloads (GPU status == CPU status)")
  corrupt = []
  for dt in dtypes:
    n = 50001
    x = make("gauss", n, dt, 7).reshape(1, n)
    pc, sc = encode(cpu, x)
    row = pc[0]
    used = int(sc[0, 2]) * 128
    secs = {k: (lo, hi) for k, lo, hi in sections(dt, n, used)}
    nb = -(-n // 2048)
    esc_used = int(sc[0, 1])
    muts = []

    def reseal(b):
      b[24:32] = np.frombuffer(np.uint64(checksum_np(b[:used])).tobytes(), np.uint8)
      return b

    def flip(pos, bit=0, reseal_=False):
      b = row.copy()
      b[pos] ^= np.uint8(1 << bit)
      return reseal(b) if reseal_ else b

    def setbytes(pos, vals, reseal_=True):
      b = row.copy()
      b[pos:pos + len(vals)] = np.array(vals, np.uint8)
      return reseal(b) if reseal_ else b

    for pos in [0, 3, 4, 5, 6, 7, 8, 16, 24, 32, 33, 40, 47, 48, 100, 127]:
      muts += [flip(pos), flip(pos, 1, reseal_=True)]
    muts += [setbytes(7, [1]), setbytes(7, [2]), setbytes(40, list(np.uint64(esc_used - 1).tobytes())),
             setbytes(48, list(np.uint64(esc_used + 1).tobytes())),
             setbytes(16, list(np.uint64(used + 128).tobytes())), setbytes(16, list(np.uint64(2**64 - 128).tobytes()))]
    t0, _ = secs["table"]
    for b in [0, nb // 2, nb - 1]:
      for off, bit in [(0, 0), (4, 0), (4, 3), (5, 2), (6, 0), (6, 7), (7, 0), (7, 1)]:
        muts += [flip(t0 + 8 * b + off, bit), flip(t0 + 8 * b + off, bit, reseal_=True)]
    t1 = secs["table"][1]
    if t0 + 8 * nb < t1:
      muts += [flip(t0 + 8 * nb, 0), flip(t1 - 1, 4, reseal_=True)]
    for name in ["raw", "planes", "escapes"]:
      lo, hi = secs[name]
      rng = np.random.default_rng(sum(map(ord, name)))
      for _ in range(6):
        p = int(rng.integers(lo, hi))
        muts += [flip(p, int(rng.integers(8))), flip(p, int(rng.integers(8)), reseal_=True)]
    pl0, pl1 = secs["planes"]
    muts += [flip(pl1 - 1, 7, reseal_=True), flip(pl1 - 1, 7)]  # padding bit of the last block
    e0, e1 = secs["escapes"]
    muts += [flip(e0, 0, reseal_=True), flip(e0 + esc_used, 0), flip(e1 - 1, 0, reseal_=True)]
    muts += [setbytes(e0, [200]), flip(e1, 3), flip(len(row) - 1, 5)]  # fp16: escape > 31 (7); past used: OK
    r0, r1 = secs["raw"]
    muts += [flip(r1 - 1, 0), flip(r1 - 1, 0, reseal_=True)]  # raw padding
    batch = np.stack(muts)
    _, sg = decode(gpu, batch, n, dt)
    _, scc = decode(cpu, batch, n, dt)
    corrupt.append(corrupt_summary(np.dtype(dt).name, sg, scc, sg == scc))
    failures += not corrupt[-1]["ok"]
  log(f"IDENTITY: {len(results)} cases, {failures} failures")
  set_tile_groups(0)
  log(f"IDENTITY: GPU calls per tile-kernel variant: {variant_calls}")
  return {"ok": failures == 0, "failures": failures, "cases": results, "corrupt": corrupt,
          "variant_calls": {str(k): v for k, v in variant_calls.items()}}


# ---- phase 4: timing ---------------------------------------------------------------------------


def phase_timing(args) -> dict:
  import ml_dtypes
  import numpy as np
  jax, zc, gpu, cpu = setup_jax(args)
  import jax.numpy as jnp
  import zipccl_jax as zcodec
  bf16, f16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
  plan = [(bf16, 64 << 20), (bf16, 1 << 30), (f32, 64 << 20)]
  if not args.quick:
    plan += [(f32, 1 << 30), (f16, 64 << 20)]
  if args.rehearse:  # the same plan 256 times smaller: 256 KiB and 4 MiB
    plan = [(dt, size >> 8) for dt, size in plan]
  reps, rounds = (10, 5) if args.quick else (20, 7)

  def bench(fn, *a):
    return time_calls(jax, fn, a, reps, rounds)

  rows, key = [], jax.random.PRNGKey(int(time.time()))
  for dt, size in plan:
    n = size // dt.itemsize
    nbytes = zc.codecs.get("zipccl").max_nbytes(dt, n)
    label = next(f"{size >> k} {u}" for k, u in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B")) if size >> k)
    log(f"TIMING: {label} {dt.name} (n = {n}), fresh Gaussian data")
    key, sub = jax.random.split(key)
    with jax.default_device(gpu):
      x = (jax.random.normal(sub, (1, n), jnp.float32) * 0.02 + 1e-3).astype(dt)  # never zero
      xb = jax.lax.bitcast_convert_type(x, jnp.uint16 if dt.itemsize == 2 else jnp.uint32)
      salt = jnp.zeros((), xb.dtype)
    x = jax.device_put(x, gpu)
    cpy = jax.jit(lambda v, s: v ^ s)
    t_copy, t_copy_min = bench(cpy, xb, salt)
    in_bytes = n * dt.itemsize
    copy_bw = 2 * in_bytes / t_copy
    pc, sc = zcodec.encode_rows(jax.device_put(x, cpu))  # the CPU codec's bytes for this data
    pc, sc = np.asarray(pc), np.asarray(sc)
    # Every variant of the tile kernels (set_tile_groups, docs/cuda.md): fresh jitted
    # functions per variant, since the handler reads the choice when XLA runs (or
    # captures into a CUDA graph) the call.
    for groups in GROUP_VARIANTS:
      set_tile_groups(groups)
      enc = jax.jit(zcodec.encode_rows)
      dec = jax.jit(lambda p: zcodec.decode_rows(p, n, dt))
      t_enc, t_enc_min = bench(enc, x)
      payload, stats = enc(x)
      t_dec, t_dec_min = bench(dec, payload)
      # Bit identity of exactly this data: GPU encode vs CPU encode, and the round trip.
      y, st = dec(payload)
      roundtrip = bool(jnp.array_equal(jax.lax.bitcast_convert_type(y, xb.dtype), xb)) and int(st[0]) == 0
      identical = bool(np.array_equal(np.asarray(payload), pc)) and bool(np.array_equal(np.asarray(stats), sc))
      esc, used = int(np.asarray(stats)[0, 1]), int(np.asarray(stats)[0, 2]) * 128
      # The encoder writes its whole max_nbytes buffer; the decoder reads the used bytes.
      for op, t, tmin, moved in [("encode", t_enc, t_enc_min, in_bytes + nbytes),
                                 ("decode", t_dec, t_dec_min, used + in_bytes)]:
        r = {"size": label, "dtype": dt.name, "op": op, "groups": groups, "n": n, "input_bytes": in_bytes,
             "payload_bytes": nbytes, "used_bytes": used, "escapes": esc, "time_us": t * 1e6, "time_min_us": tmin * 1e6,
             "gbps_input": in_bytes / t / 1e9, "gbps_moved": moved / t / 1e9, "copy_gbps": copy_bw / 1e9,
             "copy_time_us": t_copy * 1e6, "roofline_share": (moved / t) / copy_bw,
             "bit_identical": identical if op == "encode" else roundtrip}
        rows.append(r)
        log(f"  {op} G={groups}: {t * 1e6:9.1f} us  {r['gbps_input']:7.1f} GB/s of input  moved "
            f"{r['gbps_moved']:7.1f} GB/s  copy {copy_bw / 1e9:7.1f} GB/s  share {r['roofline_share']:.2f}  "
            f"bit-identical {r['bit_identical']}")
      del payload, stats, y
    set_tile_groups(0)
    del x, xb, pc, sc
  # Both checks of exactly this data count: a fast but wrong codec is not a pass.
  return {"ok": all(r["bit_identical"] for r in rows), "rows": rows,
          "method": f"median over {rounds} rounds of {reps} back-to-back jitted calls "
          "(block_until_ready after each round); copy = jitted x ^ s over the same bytes"}


