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
               / chunks=4 (docs/design.md, "Transport: the slot ladder");
               "<codec>" alone is chunks=1, the unchunked program. "@auto" is what the library picks with the
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

What each process runs, and the oracle, are in netns_bench_worker.py; the report
in netns_bench_report.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__:
  from benchmarks.netns_bench_worker import COLLECTIVES, DATA, log, worker
else:  # run as a script: its folder is on sys.path
  from netns_bench_worker import COLLECTIVES, DATA, log, worker  # type: ignore[no-redef]
if __package__:
  from benchmarks.netns_bench_report import replot, summarize, write_report
else:
  from netns_bench_report import replot, summarize, write_report  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
# Links: Gbit/s of the shaped loopback, or "none" (unshaped). Fastest first, so
# that each size's warm-up calls run on the fastest link.
DEFAULT_LINKS = ("none", "25", "10", "5", "1")
DEFAULT_GRID = "2:0.25,1,4,16,64;4:0.25,1,4,16"
DEFAULT_ROUNDS = 3
DEFAULT_BUDGET_S = 660
SMOKE = dict(grid="2:0.5", links=("none", "1"), rounds=2, budget=40)
_UNSHAPED_GBIT = 24.0     # only for the time estimate of "none"


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
      log(line)

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
    log(f"\nnetns_bench: worker logs in {rundir}")
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
      log(f"netns_bench: codec {c!r} skipped: {e}")
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
  log(f"netns_bench: {len(settings)} settings, links {list(args.links)}, codecs "
       f"{[str(c) for c in codecs]}, data {list(args.data)}, {args.rounds} rounds; estimated "
       f"transfer time {est:.0f}s + {fixed:.0f}s set-up, budget {args.budget:.0f}s (round scale "
       f"{scale:.2f})")
  if args.dry_run:
    for s in settings:
      log(f"  P={s['procs']}: MiB {s['mibs']}: "
           f"{sum(s['round_s'].values()) * args.rounds:.0f}s")
    return 0
  net = Net(not args.no_netns)
  if net.ns is None:
    log(f"netns_bench: {net.note}; only the unshaped link is measured")
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
        log(f"\nnetns_bench: setting P={s['procs']} failed: {fail}")
  finally:
    bar.close()
    net.close()
    shutil.rmtree(cache, ignore_errors=True)
  elapsed = time.monotonic() - start
  doc = summarize(args, all_results, codecs, net.note, elapsed, failures)
  write_report(args, doc)
  return 1 if failures or doc["wrong_results"] else 0


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
