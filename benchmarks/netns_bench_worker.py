"""What each process of `benchmarks/netns_bench.py` runs: its inputs (the same on
every process, made once and shared through files), the timed calls of every
variant, and the numpy oracle every result is compared with (bit-exact, or within
one bf16 ulp for jax.lax's reductions, whose order XLA picks).

Run by the launcher as `python benchmarks/netns_bench.py --worker CFG PID`.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

COLLECTIVES = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
DATA = ("gaussian", "weights", "gradients")


def codec_variant(codec: str | None):
  """"zipccl@4" -> ("zipccl", 4); "zipccl@auto" -> ("zipccl", "auto"); "zipccl" ->
  ("zipccl", 1) (the unchunked program); None / "raw" -> (codec, None)."""
  if codec in (None, "None", "raw"):
    return (None if codec == "None" else codec), None
  name, _, ch = codec.partition("@")
  if not ch:
    return name, 1
  return name, ("auto" if ch == "auto" else int(ch))


def log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


# ---- data and references -----------------------------------------------------------------


def make_data(kind: str, owner: int, n: int):
  """The bf16 input of process `owner`: deterministic, so every process can make it."""
  import ml_dtypes
  import numpy as np
  bf16 = np.dtype(ml_dtypes.bfloat16)
  rng = np.random.default_rng([7, owner, n, DATA.index(kind)])
  if kind == "gaussian":
    return (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).astype(bf16)
  if kind == "weights":
    t = 65536
    scales = (10.0 ** rng.uniform(-3, math.log10(0.3), size=-(-n // t))).astype(np.float32)
    x = rng.standard_t(5, size=n).astype(np.float32) * np.repeat(scales, t)[:n]
    return x.astype(bf16)
  if kind == "gradients":
    return _gradients(owner, n).astype(bf16)
  raise ValueError(f"make_data: kind must be one of {DATA}, got {kind!r}")


_GRAD_STATE = {}     # the trained model and the compiled gradient function, per process
_GRAD_CHUNK = 64     # micro-batches per call of the (once-compiled) gradient function


def _gradients(owner: int, n: int):
  """n float32 gradient values of a 64-256-256-10 MLP (85 Ki parameters).

  The model is trained for 20 SGD steps on a random teacher's labels; then the
  gradients of successive micro-batches of 4 examples (different ones per owner)
  are flattened parameter by parameter and concatenated until n values exist.
  The training and the compilation happen once per process.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np
  if not _GRAD_STATE:
    # Inputs come from numpy (fixed shapes): only two small programs are compiled.
    rng = np.random.default_rng(1234)
    params = [(jnp.asarray(rng.standard_normal((a, b), np.float32) / np.sqrt(a)),
               jnp.zeros(b, jnp.float32)) for a, b in ((64, 256), (256, 256), (256, 10))]
    teacher = rng.standard_normal((64, 10), np.float32)

    def batch(r, shape):
      x = r.standard_normal(shape + (64,), np.float32)
      return x, np.argmax(x @ teacher, -1).astype(np.int32)

    def loss(p, x, y):
      h = x
      for i, (w, b) in enumerate(p):
        h = h @ w + b
        if i < len(p) - 1:
          h = jax.nn.gelu(h)
      ce = jax.nn.logsumexp(h, -1) - jnp.take_along_axis(h, y[:, None], -1)[:, 0]
      return jnp.mean(ce)

    sgd_step = jax.jit(lambda p, x, y: jax.tree.map(lambda w, d: w - 0.1 * d, p,
                                                    jax.grad(loss)(p, x, y)))
    for _ in range(20):
      params = sgd_step(params, *batch(rng, (64,)))

    @jax.jit
    def chunk(xs, ys):
      def one(x, y):
        return jnp.concatenate([a.reshape(-1) for a in jax.tree.leaves(
            jax.grad(loss)(params, x, y))])
      return jax.vmap(one)(xs, ys).reshape(-1)

    _GRAD_STATE["chunk"] = chunk
    _GRAD_STATE["batch"] = batch
  cached = _GRAD_STATE.setdefault("made", {}).get(owner)
  if cached is not None and cached.size >= n:   # a prefix of what was made before
    return cached[:n]
  chunk, batch = _GRAD_STATE["chunk"], _GRAD_STATE["batch"]
  parts, have = [], 0
  r = np.random.default_rng([1000, owner])
  while have < n:
    g = np.asarray(chunk(*batch(r, (_GRAD_CHUNK, 4))))
    parts.append(g)
    have += g.size
  out = np.concatenate(parts)
  _GRAD_STATE["made"][owner] = out
  return out[:n]


def shared_inputs(kind: str, n: int, n_proc: int, pid: int, cache: Path, timeout: float = 900):
  """All processes' inputs: each process makes its own and reads the others' files.

  Files live in a run-wide cache directory (owner k's data does not depend on the
  number of processes), written atomically as uint16 words.
  """
  import ml_dtypes
  import numpy as np
  bf16 = np.dtype(ml_dtypes.bfloat16)

  def path(o):
    return cache / f"{kind}_{o}_{n}.npy"

  if not path(pid).exists():
    tmp = cache / f".{kind}_{pid}_{n}.{os.getpid()}.npy"
    np.save(tmp, make_data(kind, pid, n).view(np.uint16))
    os.replace(tmp, path(pid))
  out = []
  deadline = time.monotonic() + timeout
  for o in range(n_proc):
    while not path(o).exists():
      if time.monotonic() > deadline:
        raise TimeoutError(f"input {path(o)} of process {o} never appeared")
      time.sleep(0.05)
    out.append(np.load(path(o)).view(bf16))
  return out


def reference(collective: str, inputs: list, pid: int):
  """(expected local result as bf16, reduction?) for process pid, from all inputs.

  Layouts match the worker's calls: tiled gathers/scatters along dimension 0, the
  ppermute ring i -> i+1. Reductions are the rank-ordered float32 sum rounded
  once (zipccl's documented semantics; `raw` and `zipccl` must match it bit for
  bit).
  """
  import numpy as np
  n_proc = len(inputs)
  n = inputs[0].size
  c = n // n_proc
  if collective == "all_gather":
    return np.concatenate(inputs), False
  if collective == "ppermute":
    return inputs[(pid - 1) % n_proc], False
  if collective == "all_to_all":
    return np.concatenate([x[pid * c:(pid + 1) * c] for x in inputs]), False
  sl = slice(pid * c, (pid + 1) * c) if collective == "psum_scatter" else slice(0, n)
  acc = inputs[0][sl].astype(np.float32)
  for x in inputs[1:]:
    acc = acc + x[sl].astype(np.float32)
  return acc.astype(inputs[0].dtype), True


def tolerance(ref, inputs, sl):
  """Allowed |error| of a jax.lax reduction (summed in an order XLA picks): one
  bf16 ulp (a sum near a rounding midpoint may round the other way) plus float32
  reassociation, 2^-7 |ref| + 2^-16 sum_i |x_i|."""
  import numpy as np
  mag = sum(np.abs(x[sl].astype(np.float32)) for x in inputs)
  return np.abs(ref.astype(np.float32)) * np.float32(2.0**-7) + mag * np.float32(2.0**-16)


def check(y, ref, tol=None):
  """(number of wrong elements, max abs error) of y against ref.

  tol None: compare the uint16 words (bit-exact). Else |y - ref| <= tol (or the
  same bits: NaN/inf) element-wise.
  """
  import numpy as np
  same = y.view(np.uint16) == ref.view(np.uint16)
  if tol is None:
    bad = int(same.size - np.count_nonzero(same))
    if not bad:
      return 0, 0.0
    err = np.abs(y.astype(np.float32) - ref.astype(np.float32))
    return bad, float(np.nanmax(err))
  err = np.abs(y.astype(np.float32) - ref.astype(np.float32))
  ok = (err <= tol) | same
  bad = int(ok.size - np.count_nonzero(ok))
  return bad, float(np.nanmax(np.where(ok, 0, err))) if bad else 0.0


# ---- worker ------------------------------------------------------------------------------


class _Sync:
  """Link changes: the worker asks the launcher for a qdisc and waits for it."""

  def __init__(self, rundir: Path, pid: int, barrier):
    self.rundir, self.pid, self.barrier, self.seq = rundir, pid, barrier, 0

  def link(self, link: str) -> None:
    self.barrier()                       # nobody is still moving data
    self.seq += 1
    (self.rundir / f"want_{self.seq}.{self.pid}").write_text(link)
    have = self.rundir / f"have_{self.seq}"
    while not have.exists():
      time.sleep(0.02)
    self.barrier()


def worker(cfg_path: str, pid: int) -> int:
  cfg = json.loads(Path(cfg_path).read_text())
  rundir = Path(cfg["rundir"])
  out = {"pid": pid, "samples": [], "events": [], "bytes": [], "taken": [], "calibrations": {},
         "errors": []}
  try:
    _worker(cfg, pid, rundir, out)
  except Exception:
    out["errors"].append(traceback.format_exc())
  (rundir / f"result.{pid}.json").write_text(json.dumps(out))
  return 1 if out["errors"] else 0


def _worker(cfg, pid, rundir, out):
  import jax

  import zipccl_jax as zc
  # Before JAX starts its backend: the one-arena limit binds only threads that have
  # not allocated yet (zipccl_jax.tune_host_allocator).
  zc.tune_host_allocator()
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  n_proc = cfg["procs"]
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{cfg['port']}",
                             num_processes=n_proc, process_id=pid, initialization_timeout=120)
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from zipccl_jax import costmodel as cm

  t_start = time.monotonic()

  def wlog(msg):
    print(f"[{time.monotonic() - t_start:7.1f}s] {msg}", flush=True)

  wlog("distributed initialised")
  mesh = jax.make_mesh((n_proc,), ("dp",), axis_types=(jax.sharding.AxisType.Explicit,))
  sharding = NamedSharding(mesh, P("dp"))
  ring = [(i, (i + 1) % n_proc) for i in range(n_proc)]
  bar = jax.jit(jax.shard_map(lambda v: lax.pmax(v, "dp"), mesh=mesh, in_specs=P("dp"),
                              out_specs=P()))
  one = jax.make_array_from_process_local_data(sharding, np.zeros(1, np.int32))

  def barrier():
    jax.block_until_ready(bar(one))

  sync = _Sync(rundir, pid, barrier)
  codecs = [None if c == "None" else c for c in cfg["codecs"]]
  compress_codecs = sorted({codec_variant(c)[0] for c in codecs if c not in (None, "raw")})
  progress = rundir / "progress"
  done = 0
  total = cfg["total_calls"]

  def tick(label):
    nonlocal done
    done += 1
    if pid == 0 and (done % 5 == 0 or done == total):
      progress.write_text(f"{done} {total} {label}")

  # Phase A: calibrate on every link (the basis of the "auto" marks); the codecs
  # are measured on the first link only (their speed does not depend on it).
  cal = None
  for link in cfg["links"]:
    sync.link(link)
    if pid == 0:
      progress.write_text(f"{done} {total} calibrate {link}")
    cal = cm.calibrate(mesh, "dp", dtypes=("bfloat16",), codecs=compress_codecs,
                       codec_bytes=tuple(cfg["cal_codec_bytes"]),
                       link_row_bytes=tuple(cfg["cal_link_bytes"]), reps=3, warmup=1,
                       save=False, activate=False, reuse_codecs=cal)
    out["calibrations"][link] = cal.to_dict()
    wlog(f"calibrated on link {link}")
  if cal is not None and any(codec_variant(c)[1] == "auto" for c in codecs):
    cm.set_calibration(cal)   # chunks="auto" asks the model (the last link's numbers)

  def body(coll, codec, stats=False):
    name, chunks = codec_variant(codec)
    kw = dict(codec=name, policy="always", stats=stats)
    if chunks is not None:
      kw["chunks"] = chunks
    if coll == "all_gather":
      return lambda v: zc.compressed_all_gather(v, "dp", tiled=True, **kw)
    if coll == "psum_scatter":
      return lambda v: zc.compressed_psum_scatter(v, "dp", scatter_dimension=0, tiled=True, **kw)
    if coll == "psum":
      return lambda v: zc.compressed_psum(v, "dp", **kw)
    if coll == "all_to_all":
      return lambda v: zc.compressed_all_to_all(v, "dp", 0, 0, tiled=True, **kw)
    return lambda v: zc.compressed_ppermute(v, "dp", ring, **kw)

  # Phase B: per size, compile once, then every link.
  for mib in cfg["mibs"]:
    n = int(mib * 2**20) // 2
    inputs = {k: shared_inputs(k, n, n_proc, pid, Path(cfg["cache"])) for k in cfg["data"]}
    xs = {k: jax.make_array_from_process_local_data(sharding, v[pid])
          for k, v in inputs.items()}
    c = n // n_proc
    refs, tols = {}, {}
    for coll in cfg["collectives"]:
      sl = slice(pid * c, (pid + 1) * c) if coll == "psum_scatter" else slice(0, n)
      for kind in cfg["data"]:
        refs[coll, kind] = reference(coll, inputs[kind], pid)
        if refs[coll, kind][1] and None in codecs:
          tols[coll, kind] = tolerance(refs[coll, kind][0], inputs[kind], sl)
    wlog(f"{mib:g} MiB: data and references made")
    fns = {}
    for coll in cfg["collectives"]:
      for codec in codecs:
        f = jax.jit(jax.shard_map(body(coll, codec), mesh=mesh, in_specs=P("dp"),
                                  out_specs=P("dp")))
        compiled = f.lower(xs[cfg["data"][0]]).compile()
        wire = zc.hlo_wire_bytes(compiled.as_text())
        fns[coll, codec] = compiled
        out["bytes"].append(dict(mib=mib, collective=coll, codec=str(codec),
                                 sent=wire.common_sent, operand=wire.common))
        if codec is not None:
          # The rung each data kind takes (untimed, with stats): the bytes that
          # matter, where the smallest rung (common_sent) may be one that dense
          # data never takes (the entropy codec's low rungs).
          fs = jax.jit(jax.shard_map(body(coll, codec, stats=True), mesh=mesh, in_specs=P("dp"),
                                     out_specs=(P("dp"), P())))
          for kind in cfg["data"]:
            st = jax.block_until_ready(fs(xs[kind]))[1]
            out["taken"].append(dict(mib=mib, collective=coll, codec=str(codec), data=kind,
                                     wire=int(np.asarray(st.wire_bytes).reshape(-1)[0]),
                                     raw=int(st.raw_bytes)))
    wlog(f"{mib:g} MiB: {len(fns)} programs compiled")
    first = True
    for link in cfg["links"]:
      sync.link(link)
      if first:   # warm-up on the fastest link
        for (coll, codec), f in fns.items():
          jax.block_until_ready(f(xs[cfg["data"][0]]))
        first = False
      allowance = cfg["round_scale"] * cfg["round_s"][f"{mib:g}@{link}"] * cfg["rounds"]
      wlog(f"{mib:g} MiB: link {link}")
      t_cell = time.monotonic()
      for rnd in range(cfg["rounds"]):
        stop = 0
        if rnd > 0:   # every process stops at the same round: a pmax of the flag
          late = time.monotonic() - t_cell > allowance or time.time() > cfg["deadline"]
          flag = np.array([int(late)], np.int32)
          stop = int(np.asarray(bar(jax.make_array_from_process_local_data(
              sharding, flag)).addressable_shards[0].data).reshape(-1)[0])
        if stop:
          out["events"].append(dict(kind="budget", procs=n_proc, mib=mib, link=link,
                                    rounds_done=rnd))
          break
        for coll in cfg["collectives"]:
          for kind in cfg["data"]:
            order = codecs[rnd % len(codecs):] + codecs[:rnd % len(codecs)]
            for codec in order:
              f = fns[coll, codec]
              barrier()
              t0 = time.perf_counter()
              y = jax.block_until_ready(f(xs[kind]))
              dt = time.perf_counter() - t0
              ref, red = refs[coll, kind]
              got = np.asarray(y.addressable_shards[0].data).reshape(-1)
              exact = not (red and codec is None)
              if got.shape != ref.shape:
                bad, err = got.size, float("nan")
              else:
                bad, err = check(got, ref, None if exact else tols[coll, kind])
              s = dict(mib=mib, link=link, collective=coll, data=kind, codec=str(codec),
                       round=rnd, t=dt, bad=bad)
              out["samples"].append(s)
              if bad:
                out["events"].append(dict(kind="wrong_result", pid=pid, procs=n_proc, mib=mib,
                                          link=link,
                                          collective=coll, data=kind, codec=str(codec),
                                          round=rnd, wrong_elements=bad, elements=ref.size,
                                          max_abs_error=err, exact_check=exact))
              tick(f"{mib:g} MiB @ {link}")
    del inputs, xs, refs, tols, fns
  barrier()
  jax.distributed.shutdown()


