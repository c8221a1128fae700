"""Wall-clock time of the five compressed collectives over emulated network links.

Runs P jax.distributed processes (CPU, gloo collectives, one device each) on
127.0.0.1 inside a fresh network namespace whose loopback is rate-limited with tc
tbf, so that time on the wire dominates as it does between hosts. All processes
share that one loopback: its rate is the *aggregate* bandwidth of the emulated
network. For every (processes, link) setting it times

  collectives  compressed_all_gather / _psum_scatter / _psum / _all_to_all / _ppermute
  codecs       None (plain jax.lax; XLA:CPU widens bf16 to f32 on the wire),
               "raw" (uint16 bits through zipccl's transport), "zipccl"
               (policy="always"), and "entropy" when that codec is registered
  chunks       --chunks 1,auto,4 adds, per compressing codec, the variants
               "<codec>@auto" and "<codec>@4": the same codec with chunks="auto"
               / chunks=4 (docs/design.md, "Transport"); "<codec>" alone is chunks=1,
               the unchunked program. "@auto" is what the library picks with the
               calibration of the last link in --links (1 on XLA:CPU, where no
               overlap was measured, unless ZIPCCL_OVERLAP is set).
  data         gaussian (bf16, sigma 0.02), weights (Student-t(5) tensors of
               64 Ki elements at log-uniform scales 1e-3..0.3), gradients (real
               micro-batch gradients of a small MLP trained a few steps with jax,
               made here, no downloads)
  sizes        bf16 MiB per process

Method: the variants of a cell are interleaved in every round (rotating their
order), each call starts after a barrier, its time is the slowest process's, and
the table reports medians over rounds. Run time is bounded by --budget: every
cell runs at least one round; further rounds stop when the cell has used its
share of the budget (by a transfer-time estimate, see --dry-run) or the setting
its deadline; a last-resort hard limit (1.5 x budget + 2 min) kills workers.

EVERY result is compared with a numpy reference that each process computes
from all processes' inputs: bit-exact for
gathers, permutes and zipccl/raw reductions (rank-ordered float32 sums), within
one bf16 ulp for jax.lax reductions (whose order XLA picks). Mismatches are
reported as events (plain lax.psum_scatter over gloo has been seen returning
wrong values intermittently); nothing is retried or hidden.

Each link phase first runs `zipccl_jax.calibrate` on the same processes; the
report marks what `decide` (policy="auto" with that calibration) picks per cell
and how far that is from the faster of raw and compressed.

    sudo python benchmarks/netns_bench.py            # default grid, ~12 min (--budget)
    sudo python benchmarks/netns_bench.py --smoke    # < 1 min: the harness works
    python benchmarks/netns_bench.py --dry-run       # the plan and its time estimate
    python benchmarks/netns_bench.py --replot A.json B.json --tag both   # one plot of runs

Needs root and iproute2 (`ip`, `tc`) for the namespace; without them (or with
--no-netns) it runs on the unshaped host loopback and says so. Writes
benchmarks/results/netns.md, .json and .png (time vs size per link, with
matplotlib: `pip install -e .[bench]`). Whether two runs agree:
benchmarks/netns_compare.py.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
DATA = ("gaussian", "weights", "gradients")
# Links: Gbit/s of the shaped loopback, or "none" (unshaped). Fastest first, so
# that each size's warm-up calls run on the fastest link.
DEFAULT_LINKS = ("none", "25", "10", "5", "1")
DEFAULT_GRID = "2:0.25,1,4,16,64;4:0.25,1,4,16"
DEFAULT_ROUNDS = 3
DEFAULT_BUDGET_S = 660
SMOKE = dict(grid="2:0.5", links=("none", "1"), rounds=2, budget=40)
_UNSHAPED_GBIT = 24.0     # only for the time estimate of "none"


def codec_variant(codec: str | None):
  """"zipccl@4" -> ("zipccl", 4); "zipccl@auto" -> ("zipccl", "auto"); "zipccl" ->
  ("zipccl", 1) (the unchunked program); None / "raw" -> (codec, None)."""
  if codec in (None, "None", "raw"):
    return (None if codec == "None" else codec), None
  name, _, ch = codec.partition("@")
  if not ch:
    return name, 1
  return name, ("auto" if ch == "auto" else int(ch))


def _log(msg: str) -> None:
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


# ---- time estimate -----------------------------------------------------------------------


def traffic_bytes(collective: str, codec, n_proc: int, block: int) -> float:
  """Bytes all processes put on the shared loopback in one call (block = raw bytes
  per process). lax moves f32 for bf16 (x2); zipccl is modelled at 0.71 of raw."""
  per = {"all_gather": n_proc * (n_proc - 1) * block,
         "psum_scatter": (n_proc - 1) * block,
         "psum": 2 * (n_proc - 1) * block,
         "all_to_all": (n_proc - 1) * block,
         "ppermute": n_proc * block}[collective]
  return per * (2.0 if codec is None else 0.71 if codec != "raw" else 1.0)


def estimate_call_s(collective, codec, n_proc, block, link) -> float:
  gbit = _UNSHAPED_GBIT if link == "none" else float(link)
  wire = traffic_bytes(collective, codec, n_proc, block) * 8 / (gbit * 1e9)
  codec_s = 0.0 if codec in (None, "raw") else 3 * block / 1.5e9 * max(1, n_proc / 2)
  return wire + codec_s + 0.004


def plan(args, codecs) -> list[dict]:
  """Settings [(procs, sizes)], each with per-(size, link) round estimates."""
  out = []
  for spec in args.grid.split(";"):
    p, _, sizes = spec.partition(":")
    n_proc = int(p)
    mibs = [float(s) for s in sizes.split(",") if s]
    cells = {}
    for mib in mibs:
      block = int(mib * 2**20)
      for link in args.links:
        cells[f"{mib:g}@{link}"] = sum(
            estimate_call_s(c, k, n_proc, block, link)
            for c in args.collectives for k in codecs for _ in args.data)
    out.append(dict(procs=n_proc, mibs=mibs, round_s=cells))
  return out


def _cal_link_bytes(mibs) -> list:
  """Row sizes the calibration times the links at: 4 KiB..4 MiB and the largest
  message of the grid (up to 16 MiB). A per-call time grows faster than linearly
  past the 4 MiB rows (host copies leave the caches): a link fitted on rows up to
  4 MiB under-estimated the 16 MiB cells by 15-29% at 10 Gbit/s."""
  sizes = [2**12, 2**16, 2**20, 2**22]
  top = min(int(max(mibs) * 2**20), 2**24)
  return sizes + [top] if top > sizes[-1] else sizes


def fixed_s(setting: dict, n_links: int) -> float:
  """Estimated time of a setting outside the timed calls: start-up, calibration
  (codecs once, the link on every link) and, per size, data + 15 compilations."""
  return 10 + 8 + 10 * n_links + 15 * len(setting["mibs"])


def allowances(settings, rounds: int, budget_s: float, n_links: int) -> float:
  """Scale so that the estimated total (rounds of every cell, plus `fixed_s`)
  fits the budget; returns the per-round time scale (1 = no cut)."""
  fixed = sum(fixed_s(s, n_links) for s in settings)
  work = sum(sum(s["round_s"].values()) * rounds for s in settings)
  return min(1.0, max(budget_s - fixed, 1.0) / max(work, 1e-9))


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


# ---- launcher ----------------------------------------------------------------------------


class Net:
  """The shaped loopback: a fresh network namespace with tc tbf on its lo."""

  def __init__(self, use_netns: bool):
    self.ns = None
    self.note = ""
    if not use_netns:
      self.note = "--no-netns: unshaped host loopback"
      return
    if os.geteuid() != 0:
      self.note = "not root: `ip netns add` needs CAP_SYS_ADMIN; unshaped host loopback"
      return
    if not (shutil.which("ip") and shutil.which("tc")):
      self.note = "iproute2 (ip, tc) not found; unshaped host loopback"
      return
    ns = f"zcbench{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if r.returncode:
      self.note = f"`ip netns add` failed ({r.stderr.strip()}); unshaped host loopback"
      return
    self.ns = ns
    self._run(["ip", "-n", ns, "link", "set", "lo", "up"])
    self.current = None

  @staticmethod
  def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
      raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")

  def set_link(self, link: str) -> None:
    if self.ns is None or link == self.current:
      return
    base = ["ip", "netns", "exec", self.ns, "tc", "qdisc"]
    if link == "none":
      subprocess.run(base + ["del", "dev", "lo", "root"], capture_output=True)
    else:
      # burst: a few jumbo loopback frames (64 KiB MTU) per token refill; the queue
      # may hold 50 ms of traffic before tbf drops.
      self._run(base + ["replace", "dev", "lo", "root", "tbf", "rate", f"{link}gbit",
                        "burst", "256kb", "latency", "50ms"])
    self.current = link

  def prefix(self) -> list[str]:
    return [] if self.ns is None else ["ip", "netns", "exec", self.ns]

  def close(self) -> None:
    if self.ns is not None:
      subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
      self.ns = None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class _Bar:
  def __init__(self, total: int):
    self.total, self.start = max(total, 1), time.monotonic()
    self.tty = sys.stderr.isatty()
    self.last = ""

  def show(self, done: int, label: str, setting: str) -> None:
    el = time.monotonic() - self.start
    w = 30
    k = min(w, w * done // self.total)
    line = (f"[{'#' * k}{'.' * (w - k)}] {done}/{self.total} calls  {el:5.0f}s  "
            f"{setting} {label}")
    if self.tty:
      sys.stderr.write("\r" + line[:150].ljust(150))
      sys.stderr.flush()
      return
    # Not a terminal (a log file): a line per new phase, else every 30 s at most.
    key = f"{setting} {label}"
    if key != self.last or el - getattr(self, "t_last", 0.0) >= 30:
      self.last, self.t_last = key, el
      _log(line)

  def close(self):
    if self.tty:
      sys.stderr.write("\n")


def run_setting(args, net: Net, setting: dict, codecs, scale: float, bar: _Bar, offset: int,
                hard_deadline: float, cache: Path, deadline: float) -> tuple[list, str | None]:
  n_proc = setting["procs"]
  rundir = Path(tempfile.mkdtemp(prefix=f"netns_bench_p{n_proc}_"))
  total = (len(setting["mibs"]) * len(args.links) * args.rounds * len(args.collectives) *
           len(args.data) * len(codecs))
  cfg = dict(procs=n_proc, port=_free_port(), rundir=str(rundir), cache=str(cache),
             mibs=setting["mibs"],
             links=list(args.links), collectives=list(args.collectives), data=list(args.data),
             codecs=[str(c) for c in codecs], rounds=args.rounds, round_s=setting["round_s"],
             round_scale=scale, total_calls=total, deadline=deadline,
             cal_codec_bytes=[2**14, 2**18] if args.smoke else [2**16, 2**20, 2**22, 2**24],
             cal_link_bytes=[2**12, 2**16] if args.smoke else _cal_link_bytes(setting["mibs"]))
  (rundir / "cfg.json").write_text(json.dumps(cfg))
  cores = os.cpu_count() or 1
  pin = args.pin == "on" or (args.pin == "auto" and n_proc <= cores)
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  if pin:
    env["ZIPCCL_NUM_THREADS"] = "1"
  net.set_link(args.links[0])
  procs = []
  for pid in range(n_proc):
    cmd = net.prefix() + (["taskset", "-c", str(pid % cores)] if pin else []) + [
        sys.executable, str(Path(__file__).resolve()), "--worker", str(rundir / "cfg.json"),
        str(pid)]
    log = open(rundir / f"log.{pid}", "w")
    procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=str(ROOT)))
  seq = 0
  failure = None
  setting_name = f"P={n_proc}{' pinned' if pin else ''}"
  try:
    while True:
      codes = [p.poll() for p in procs]
      if any(c not in (None, 0) for c in codes):
        i = next(i for i, c in enumerate(codes) if c not in (None, 0))
        failure = (f"worker {i} exited with {codes[i]}:\n" +
                   (rundir / f"log.{i}").read_text()[-3000:])
        break
      if all(c == 0 for c in codes):
        break
      want = sorted(rundir.glob(f"want_{seq + 1}.*"))
      if want:
        net.set_link(want[0].read_text())
        seq += 1
        (rundir / f"have_{seq}").write_text("ok")
      prog = rundir / "progress"
      if prog.exists():
        try:
          d, _, label = prog.read_text().split(" ", 2)
          bar.show(offset + int(d), label, setting_name)
        except ValueError:
          pass
      if time.monotonic() > hard_deadline:
        failure = "hard deadline reached (budget + grace): workers killed"
        break
      time.sleep(0.05)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for p in procs:
      p.wait()
  results = []
  for pid in range(n_proc):
    f = rundir / f"result.{pid}.json"
    if f.exists():
      r = json.loads(f.read_text())
      if r["errors"] and failure is None:
        failure = f"worker {pid}: {r['errors'][0][-3000:]}"
      results.append(r)
  for r in results:
    r["procs"] = n_proc
    r["pinned"] = pin
  if failure is None and not args.keep_logs:
    shutil.rmtree(rundir, ignore_errors=True)
  elif failure is None:
    _log(f"\nnetns_bench: worker logs in {rundir}")
  else:
    failure += f"\n(logs kept in {rundir})"
  return results, failure


def collective_codecs() -> list:
  """Registered codecs the collectives accept (probed by tracing one on 1 device)."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import zipccl_jax as zc
  from zipccl_jax import costmodel as cm
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("p",))
  ok = []
  for c in cm.available_codecs():
    f = jax.shard_map(lambda v, c=c: zc.compressed_all_gather(v, "p", codec=c, policy="always"),
                      mesh=mesh, in_specs=P("p"), out_specs=P("p"))
    try:
      jax.eval_shape(f, jax.ShapeDtypeStruct((4096,), jax.numpy.bfloat16))
      ok.append(c)
    except NotImplementedError as e:
      _log(f"netns_bench: codec {c!r} skipped: {e}")
  return ok


def launch(args) -> int:
  codecs = [None, "raw"] + collective_codecs()   # "entropy" once the transport moves it
  if args.codecs:
    codecs = [None if c == "None" else c for c in args.codecs.split(",")]
  codecs = [c for base in codecs for c in ([base] if base in (None, "raw") else
                                            [base] + [f"{base}@{v}" for v in args.chunks
                                                      if v != "1"])]
  settings = plan(args, codecs)
  scale = allowances(settings, args.rounds, args.budget, len(args.links))
  est = sum(sum(s["round_s"].values()) * args.rounds for s in settings)
  fixed = sum(fixed_s(s, len(args.links)) for s in settings)
  _log(f"netns_bench: {len(settings)} settings, links {list(args.links)}, codecs "
       f"{[str(c) for c in codecs]}, data {list(args.data)}, {args.rounds} rounds; estimated "
       f"transfer time {est:.0f}s + {fixed:.0f}s set-up, budget {args.budget:.0f}s (round scale "
       f"{scale:.2f})")
  if args.dry_run:
    for s in settings:
      _log(f"  P={s['procs']}: MiB {s['mibs']}: "
           f"{sum(s['round_s'].values()) * args.rounds:.0f}s")
    return 0
  net = Net(not args.no_netns)
  if net.ns is None:
    _log(f"netns_bench: {net.note}; only the unshaped link is measured")
    args.links = ("none",)
    settings = plan(args, codecs)
  start = time.monotonic()
  hard = start + args.budget * 1.5 + 120
  all_results, failures = [], []
  total = sum(len(s["mibs"]) * len(args.links) * args.rounds * len(args.collectives) *
              len(args.data) * len(codecs) for s in settings)
  bar = _Bar(total)
  offset = 0
  cache = Path(tempfile.mkdtemp(prefix="netns_bench_data_"))
  # Each setting may run until its share of the budget (by estimate) is used up,
  # counted from the start: time left over by one setting goes to the next.
  weights = [sum(s["round_s"].values()) * args.rounds + fixed_s(s, len(args.links))
             for s in settings]
  t_wall = time.time()
  try:
    for i, s in enumerate(settings):
      deadline = t_wall + args.budget * sum(weights[:i + 1]) / sum(weights)
      res, fail = run_setting(args, net, s, codecs, scale, bar, offset, hard, cache, deadline)
      offset += (len(s["mibs"]) * len(args.links) * args.rounds * len(args.collectives) *
                 len(args.data) * len(codecs))
      all_results += res
      if fail:
        failures.append(f"P={s['procs']}: {fail}")
        _log(f"\nnetns_bench: setting P={s['procs']} failed: {fail}")
  finally:
    bar.close()
    net.close()
    shutil.rmtree(cache, ignore_errors=True)
  elapsed = time.monotonic() - start
  doc = summarize(args, all_results, codecs, net.note, elapsed, failures)
  write_report(args, doc)
  return 1 if failures or doc["wrong_results"] else 0


# ---- report ------------------------------------------------------------------------------


def summarize(args, results, codecs, net_note, elapsed, failures) -> dict:
  """Medians over rounds of the slowest process per call; ratios; auto's picks."""
  from zipccl_jax import costmodel as cm
  cells = {}
  for r in results:
    for s in r["samples"]:
      key = (r["procs"], s["link"], s["mib"], s["collective"], s["data"], s["codec"])
      cells.setdefault(key, {}).setdefault(s["round"], []).append(s["t"])
  med = {k: statistics.median(max(ts) for ts in v.values()) for k, v in cells.items()}
  nrounds = {k: len(v) for k, v in cells.items()}
  byts = {}
  taken = {}
  cals = {}
  pinned = {}
  for r in results:
    pinned[r["procs"]] = r.get("pinned", False)
    if r["pid"] == 0:
      for b in r["bytes"]:
        byts[(r["procs"], b["mib"], b["collective"], b["codec"])] = b["sent"]
      for b in r.get("taken", []):
        taken[(r["procs"], b["mib"], b["collective"], b["codec"], b["data"])] = (b["wire"],
                                                                                 b["raw"])
      for link, c in r["calibrations"].items():
        cals[(r["procs"], link)] = c
  events = [e for r in results for e in r["events"]]
  wrong = [e for e in events if e["kind"] == "wrong_result"]
  comp = [str(c) for c in codecs if c not in (None, "raw")]
  rows = []
  for (procs, link, mib, coll, data, codec), t in sorted(med.items(), key=lambda kv: (
      kv[0][0], _link_order(kv[0][1]), kv[0][2], COLLECTIVES.index(kv[0][3]), kv[0][4])):
    if codec != "raw":
      continue
    row = dict(procs=procs, link=link, mib=mib, collective=coll, data=data,
               rounds=nrounds[(procs, link, mib, coll, data, codec)], times={})
    for c in codecs:
      k = (procs, link, mib, coll, data, str(c))
      if k in med:
        row["times"][str(c)] = med[k]
    raw_b = byts.get((procs, mib, coll, "raw"))
    row["byte_ratio"] = {c: byts[(procs, mib, coll, c)] / raw_b for c in [str(x) for x in codecs]
                         if raw_b and (procs, mib, coll, c) in byts}
    # the rung the data took, where measured: over the same call's raw rung (its
    # stats' raw_bytes). Not over codec="raw"'s own call: on CPU an all-to-all
    # transport's rungs hand N - 1 rows to XLA (permutes; the own row stays) where
    # the plain uncompressed path hands N (lax.all_to_all), so the two stats count
    # different rows (docs/design.md, "Transport").
    for c in [str(x) for x in codecs]:
      k = (procs, mib, coll, c, data)
      if k in taken and taken[k][1]:
        row["byte_ratio"][c] = taken[k][0] / taken[k][1]
    row["time_ratio"] = {c: tt / t for c, tt in row["times"].items()}
    # What policy="auto" with this link's calibration would do (bf16 rows).
    cal_d = cals.get((procs, link))
    if cal_d is not None and comp:
      cal = cm.Calibration.from_dict(cal_d)
      n = int(mib * 2**20) // 2
      m = n if coll in ("all_gather", "ppermute") else n // procs
      yes, which = cm.decide(coll, "bfloat16", m, procs, cal, codecs=comp)
      pick = which if yes else "raw"
      row["auto"] = pick
      model = {"raw": cm.model_time(coll, "bfloat16", m, procs, cal, None)}
      for c in comp:
        name, ch = codec_variant(c)
        if name in cal.codecs:
          k = cm.best_chunks(coll, "bfloat16", m, procs, cal, name) if ch == "auto" else ch
          model[c] = cm.model_time(coll, "bfloat16", m, procs, cal, name, chunks=k)
      row["model"] = model
      cand = {c: row["times"][c] for c in ["raw"] + comp if c in row["times"]}
      if pick in cand:
        row["auto_over_best"] = cand[pick] / min(cand.values())
    rows.append(row)
  return dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
              machine=_machine(), net=net_note or "network namespace, tc tbf on its loopback",
              args=dict(grid=args.grid, links=list(args.links), rounds=args.rounds,
                        chunks=list(getattr(args, "chunks", ("1",))),
                        data=list(args.data), collectives=list(args.collectives),
                        budget=args.budget, smoke=args.smoke, pin=args.pin),
              pinned={str(k): v for k, v in pinned.items()}, codecs=[str(c) for c in codecs],
              elapsed_s=round(elapsed, 1), rows=rows, events=events, wrong_results=len(wrong),
              failures=failures,
              calibrations={f"{p}@{l}": c for (p, l), c in cals.items()})


def _link_order(link: str) -> float:
  return 1e9 if link == "none" else float(link)


def _machine() -> dict:
  cpu = platform.processor() or platform.machine()
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  import jax
  return dict(cpu=cpu, cores=os.cpu_count(), host=platform.node(), python=platform.python_version(),
              jax=jax.__version__, load=os.getloadavg()[0])


def _link_name(link: str) -> str:
  return "unshaped" if link == "none" else f"{link} Gbit/s"


def write_report(args, doc) -> None:
  m = doc["machine"]
  codecs = doc["codecs"]
  comp = [c for c in codecs if c not in ("None", "raw")]
  lines = [f"# Compressed collectives over emulated links ({doc['date'][:10]})", "",
           f"Machine: {m['cpu']}, {m['cores']} cores, host {m['host']}, jax {m['jax']}, "
           f"load average at the end {m['load']:.2f}. Network: {doc['net']}. "
           f"jax.distributed on CPU with gloo, one device per process; processes pinned to "
           f"their own core with ZIPCCL_NUM_THREADS=1: {doc['pinned']}. "
           f"Run time {doc['elapsed_s']:.0f}s" + (" (--smoke: timings are not meaningful)"
                                                  if doc["args"]["smoke"] else "") + ".", "",
           "Each time is the median over rounds of the slowest process's wall time of one call "
           "(variants interleaved within each round, a barrier before every call). "
           "'x raw' columns: time / time of codec='raw' (< 1 is faster); 'bytes': bytes one "
           "process sends on the rung its data takes (`CollectiveStats.wire_bytes` of an untimed call "
           "with stats=True) / raw's; the compiled HLO's smallest rung where not measured. "
           "'auto': what `decide` (policy='auto') picks with the calibration measured on that "
           "link by `zipccl_jax.calibrate` in the same processes; 'auto/best': the measured "
           "time of that pick over the faster of raw and the compressed codecs.", ""]
  if doc["failures"]:
    lines += ["## Failures", ""] + [f"- `{f.splitlines()[0]}`" for f in doc["failures"]] + [""]
  wrong = [e for e in doc["events"] if e["kind"] == "wrong_result"]
  lines += ["## Result checks", ""]
  total_checked = sum(r["rounds"] * len(r["times"]) for r in doc["rows"])
  if wrong:
    lines.append(f"**{len(wrong)} wrong results** (of ~{total_checked} checked calls x "
                 "processes), not retried:")
    lines.append("")
    lines.append("| procs | link | MiB | collective | data | codec | round | process | "
                 "wrong elements | max abs error |")
    lines.append("|---|---|---:|---|---|---|---:|---:|---:|---:|")
    for e in wrong:
      lines.append(f"| {e['procs']} | {_link_name(e['link'])} | {e['mib']:g} | "
                   f"{e['collective']} | {e['data']} | {e['codec']} | {e['round']} | {e['pid']} | "
                   f"{e['wrong_elements']} of {e['elements']} | {e['max_abs_error']:.3g} |")
  else:
    lines.append(f"Every result of every call on every process matched its numpy reference "
                 f"({total_checked} calls).")
  budget = [e for e in doc["events"] if e["kind"] == "budget"]
  if budget:
    lines += ["", f"{len(budget)} cells stopped early to stay within the time budget "
              "(their 'rounds' column shows how many ran)."]
  lines.append("")
  # Headline: gaussian, zipccl/raw time (bytes) per collective.
  for c in comp:
    lines += [f"## {c} / raw, Gaussian bf16: time ratio (byte ratio)", "",
              "| procs | link | MiB/process | " + " | ".join(COLLECTIVES) + " |",
              "|---|---|---:|" + "---:|" * len(COLLECTIVES)]
    keyed = {(r["procs"], r["link"], r["mib"], r["collective"]): r for r in doc["rows"]
             if r["data"] == "gaussian"}
    for (p, l, mib) in sorted({k[:3] for k in keyed}, key=lambda k: (k[0], _link_order(k[1]),
                                                                      k[2])):
      cellv = []
      for coll in COLLECTIVES:
        r = keyed.get((p, l, mib, coll))
        if r is None or c not in r["time_ratio"]:
          cellv.append("")
          continue
        cellv.append(f"{r['time_ratio'][c]:.2f} ({r['byte_ratio'].get(c, float('nan')):.2f})")
      lines.append(f"| {p} | {_link_name(l)} | {mib:g} | " + " | ".join(cellv) + " |")
    lines.append("")
  # Auto.
  autos = [r for r in doc["rows"] if "auto_over_best" in r]
  if autos:
    worst = max(autos, key=lambda r: r["auto_over_best"])
    missed = [r for r in autos if r["auto"] == "raw" and any(
        r["time_ratio"].get(c, 9) < 0.9 for c in comp)]
    lines += ["## policy='auto' with calibration", "",
              f"{len(autos)} cells: auto within 5% of the best in "
              f"{sum(r['auto_over_best'] <= 1.05 for r in autos)}; "
              f"worst {worst['auto_over_best']:.2f}x "
              f"({worst['collective']} {worst['mib']:g} MiB {worst['data']}, "
              f"{_link_name(worst['link'])}, P={worst['procs']}); cells where compression wins "
              f"by > 10% but auto keeps raw: {len(missed)}.", ""]
    for c in ["raw"] + comp:
      errs = [r["model"][c] / r["times"][c] - 1 for r in autos if c in r["times"]
              and c in r.get("model", {})]
      if errs:
        within = sum(abs(e) <= 0.15 for e in errs)
        lines.append(f"- model vs measured time, {c}: median error "
                     f"{statistics.median(errs) * 100:+.0f}%, median |error| "
                     f"{statistics.median(abs(e) for e in errs) * 100:.0f}%, largest |error| "
                     f"{max(abs(e) for e in errs) * 100:.0f}%, within 15% in "
                     f"{within} of {len(errs)} cells (per cell: 'model err' columns below)")
    lines += ["", "| procs | link | fitted bandwidth (all_gather) | alpha all_gather | "
              "encode GB/s | decode GB/s | ratio assumed |", "|---|---|---:|---:|---:|---:|---:|"]
    for key, c in sorted(doc["calibrations"].items()):
      p, l = key.split("@")
      ag = c["links"]["all_gather"]
      fit = next(iter(c["codecs"].values()), {}).get("bfloat16") if c["codecs"] else None
      bw = 8e-9 / ag["beta_s_per_byte"] if ag["beta_s_per_byte"] > 0 else float("inf")
      enc = f"{1e-9 / fit['encode_s_per_byte']:.2f}" if fit else ""
      dec = f"{1e-9 / fit['decode_s_per_byte']:.2f}" if fit else ""
      lines.append(f"| {p} | {_link_name(l)} | {bw:.2f} Gbit/s | {ag['alpha_s'] * 1e3:.3f} ms | "
                   f"{enc} | {dec} | {fit['ratio']:.3f} |" if fit else "")
    lines.append("")
  # Full table.
  hdr = ["procs", "link", "MiB", "collective", "data", "rounds"] + [f"{c} ms" for c in codecs]
  hdr += [f"{c} x raw" for c in codecs if c != "raw"] + [f"{c} bytes" for c in comp]
  hdr += [f"model {c} x raw" for c in comp] + ["auto", "auto/best"]
  hdr += [f"model err {c}" for c in ["raw"] + comp]
  lines += ["## All cells", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
  for r in doc["rows"]:
    v = [str(r["procs"]), _link_name(r["link"]), f"{r['mib']:g}", r["collective"], r["data"],
         str(r["rounds"])]
    v += [f"{r['times'][c] * 1e3:.2f}" if c in r["times"] else "" for c in codecs]
    v += [f"{r['time_ratio'][c]:.2f}" if c in r["time_ratio"] else "" for c in codecs
          if c != "raw"]
    v += [f"{r['byte_ratio'][c]:.3f}" if c in r["byte_ratio"] else "" for c in comp]
    mod = r.get("model", {})
    v += [f"{mod[c] / mod['raw']:.2f}" if c in mod and mod.get("raw") else "" for c in comp]
    v += [r.get("auto", ""), f"{r['auto_over_best']:.2f}" if "auto_over_best" in r else ""]
    # (model time / measured time - 1) of each variant: the calibrated model's error
    v += [f"{(mod[c] / r['times'][c] - 1) * 100:+.0f}%" if c in mod and r["times"].get(c)
          else "" for c in ["raw"] + comp]
    lines.append("| " + " | ".join(v) + " |")
  cmd = "sudo python benchmarks/netns_bench.py" + (" --smoke" if doc["args"]["smoke"] else "")
  lines += ["", f"Reproduce: `{cmd}` (arguments: {json.dumps(doc['args'])})", ""]
  text = "\n".join(lines)
  res = Path(args.out)
  res.mkdir(parents=True, exist_ok=True)
  tag = getattr(args, "tag", "")
  stem = ("netns" + (f"_{tag}" if tag else "") +
          ("_smoke" if doc["args"]["smoke"] else ""))
  (res / f"{stem}.md").write_text(text)
  (res / f"{stem}.json").write_text(json.dumps(doc, indent=1))
  png = plot(res / f"{stem}.png", doc)
  _log(f"netns_bench: wrote {res / stem}.md, .json" + (", .png" if png else " (no plot)"))
  print(text[:4000])


def plot(path: Path, doc) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter
  except ImportError:
    _log("matplotlib not installed: no plot (pip install matplotlib)")
    return False
  rows = [r for r in doc["rows"] if r["data"] == "gaussian"]
  if not rows:
    return False
  settings = sorted({(r["procs"], r["link"]) for r in rows},
                    key=lambda k: (k[0], _link_order(k[1])))
  colls = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
  fig, axes = plt.subplots(len(colls), len(settings), figsize=(3.2 * len(settings),
                                                                2.6 * len(colls)),
                           squeeze=False, sharex=True)
  colors = {"None": "C7", "raw": "C0", "zipccl": "C3", "entropy": "C2"}
  for j, (p, l) in enumerate(settings):
    for i, coll in enumerate(colls):
      ax = axes[i][j]
      sel = sorted((r for r in rows if r["procs"] == p and r["link"] == l and
                    r["collective"] == coll), key=lambda r: r["mib"])
      for c in doc["codecs"]:
        pts = [(r["mib"], r["times"][c] * 1e3) for r in sel if c in r["times"]]
        if pts:
          ax.plot(*zip(*pts), marker=".", color=colors.get(c, "C4"),
                  label="lax" if c == "None" else c)
      auto = [(r["mib"], r["times"][r["auto"]] * 1e3) for r in sel
              if r.get("auto") in r["times"]]
      if auto:
        ax.scatter(*zip(*auto), s=90, facecolors="none", edgecolors="k", zorder=5,
                   label="auto's pick")
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
      ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
      ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
      ax.grid(True, which="both", alpha=0.3)
      if i == 0:
        ax.set_title(f"P={p}, {_link_name(l)}", fontsize=9)
      if j == 0:
        ax.set_ylabel(f"{coll}\nms per call", fontsize=8)
      if i == len(colls) - 1:
        ax.set_xlabel("MiB per process", fontsize=8)
      ax.tick_params(labelsize=7)
  axes[0][0].legend(fontsize=7)
  fig.suptitle(f"zipccl_jax collectives, Gaussian bf16, {doc['date'][:10]}, "
               f"{doc['machine']['cores']} cores", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return True


def replot(paths, tag: str, out: Path) -> int:
  """--replot: one plot from the rows of earlier results (their codecs must agree)."""
  docs = []
  for p in paths:
    try:
      docs.append(json.loads(Path(p).read_text()))
    except (OSError, ValueError) as e:
      raise SystemExit(f"netns_bench --replot: cannot read {p}: {e}")
    if "rows" not in docs[-1] or "codecs" not in docs[-1]:
      raise SystemExit(f"netns_bench --replot: {p} is not a netns_bench result")
  if any(d["codecs"] != docs[0]["codecs"] for d in docs):
    raise SystemExit("netns_bench --replot: the results compare different codecs: "
                     + ", ".join(f"{p}: {d['codecs']}" for p, d in zip(paths, docs)))
  doc = dict(docs[0], rows=[r for d in docs for r in d["rows"]])
  out.mkdir(parents=True, exist_ok=True)
  path = out / ("netns" + (f"_{tag}" if tag else "") + ".png")
  if not plot(path, doc):
    return 1
  _log(f"netns_bench: wrote {path}")
  return 0


# ---- command line ------------------------------------------------------------------------


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog=__doc__.split("\n\n", 1)[1])
  ap.add_argument("--grid", default=DEFAULT_GRID,
                  help="'P:MiB,MiB;P:MiB,...': processes and bf16 MiB per process "
                       f"(default {DEFAULT_GRID})")
  ap.add_argument("--links", default=",".join(DEFAULT_LINKS),
                  help="Gbit/s of the shaped loopback, comma-separated; 'none' = unshaped")
  ap.add_argument("--collectives", default=",".join(COLLECTIVES))
  ap.add_argument("--data", default=",".join(DATA))
  ap.add_argument("--codecs", default=None,
                  help="comma-separated among None,raw,zipccl,entropy (default: all available)")
  ap.add_argument("--chunks", default="1",
                  help="comma-separated chunk counts (ints, 'auto') of the compressing codecs: "
                       "each value v != 1 adds the variant '<codec>@v' (default 1: unchunked only)")
  ap.add_argument("--tag", default="", help="appended to the report's file name "
                  "(netns_<tag>.md)")
  ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
  ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                  help="seconds the measurements may take; rounds are cut to fit")
  ap.add_argument("--pin", choices=("auto", "on", "off"), default="auto",
                  help="taskset each process to its own core with ZIPCCL_NUM_THREADS=1 "
                       "(auto: when processes <= cores)")
  ap.add_argument("--no-netns", action="store_true", help="unshaped host loopback only")
  ap.add_argument("--smoke", action="store_true", help="a < 1 minute run that exercises "
                  "everything (2 processes, 0.25 and 1 MiB, unshaped and 1 Gbit/s)")
  ap.add_argument("--keep-logs", action="store_true", help="keep the workers' logs (phase times)")
  ap.add_argument("--dry-run", action="store_true", help="print the plan and estimate")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  ap.add_argument("--replot", nargs="+", metavar="JSON",
                  help="no measurement: plot the rows of these results (e.g. a small-message "
                       "and a large-message run of one grid) into one netns_<tag>.png")
  ap.add_argument("--worker", nargs=2, metavar=("CFG", "PID"), help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    return worker(args.worker[0], int(args.worker[1]))
  if args.replot:
    return replot(args.replot, args.tag, Path(args.out))
  if args.smoke:
    args.grid, args.rounds, args.budget = SMOKE["grid"], SMOKE["rounds"], SMOKE["budget"]
    args.links = ",".join(SMOKE["links"])
  args.links = tuple(x.strip() for x in args.links.split(",") if x.strip())
  args.collectives = tuple(x.strip() for x in args.collectives.split(",") if x.strip())
  args.data = tuple(x.strip() for x in args.data.split(",") if x.strip())
  for c in args.collectives:
    if c not in COLLECTIVES:
      ap.error(f"--collectives: {c!r} is not one of {COLLECTIVES}")
  for d in args.data:
    if d not in DATA:
      ap.error(f"--data: {d!r} is not one of {DATA}")
  for link in args.links:
    if link != "none":
      try:
        if float(link) <= 0:
          raise ValueError
      except ValueError:
        ap.error(f"--links: {link!r} must be a positive number of Gbit/s or 'none'")
  if args.rounds < 1:
    ap.error("--rounds must be >= 1")
  args.chunks = tuple(x.strip() for x in args.chunks.split(",") if x.strip()) or ("1",)
  for v in args.chunks:
    if v != "auto" and not (v.isdigit() and 1 <= int(v) <= 16):
      ap.error(f"--chunks: {v!r} must be 'auto' or an int in [1, 16]")
  if args.tag and not args.tag.replace("-", "").replace("_", "").isalnum():
    ap.error(f"--tag: {args.tag!r} may hold letters, digits, '-' and '_' only")
  return launch(args)


if __name__ == "__main__":
  sys.exit(main())
