"""One process of the divergent-configuration tests (launched by test_multiprocess.py).

    python examples/launch.py -n N tests/_diverge_worker.py OUT_DIR CASE

Process 0 and the others are configured differently (CASE, below) and run
compressed collectives over every device of every process. Writes
{"error": the exception text or None, "exact": the results equal codec="raw"'s,
"seconds"} to OUT_DIR/worker<i>.json. The test expects an error naming the
disagreement on every process, or (stats) identical programs and exact results.

CASE: codec (zipccl vs entropy), chunks (1 vs 2), calibration (a calibration in
force vs none), check_decode (off vs on), stats (stats=True on process 0 only:
the same program, exact results); with the prefix "planned_" the step runs under
zipccl_jax.jit for three steps ("planned_same": every process alike, with a pytree
psum whose leaves share transports, the plans compiled ahead and slower to build on
every process but the first; the report adds the plan's slots and per step whether
a plan was in force; "planned_gate": the processes' clocks disagree on whether
the plan or raw words is faster, the report adds the comparisons;
"planned_build_fails_ahead" / "planned_build_fails_here": the last process's builds
on the worker thread / on the caller's fail, the report adds the calls that
returned; "planned_trace_fails": the last process's first trace raises before its
first compressed call, the job catches the error and runs three steps, the report
adds the first error and its time). exchange_absent:
the last process skips an exchange between processes
(compat.exchange_across_processes, 3 s timeout) that the others make.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import launch  # noqa: E402


def _call(jax, zc, case: str, first: bool):
  """The per-process options of CASE: process 0 (first) vs the others."""
  kw = dict(policy="always")
  case = case.removeprefix("planned_")
  if case == "codec":
    kw["codec"] = "zipccl" if first else "entropy"
  elif case == "chunks":
    kw["chunks"] = 1 if first else 2
  elif case == "check_decode":
    kw["check_decode"] = first
  elif case == "calibration" and first:
    from zipccl_jax._src import calibration   # the saved defaults: a calibration in force
    zc.set_calibration(calibration.default_calibration())
  stats = case == "stats" and first

  def body(x):
    outs = [zc.compressed_all_gather(x, "x", tiled=True, stats=stats, **kw),
            zc.compressed_psum(x, "x", stats=stats, **kw)]
    outs = [o[0] if stats else o for o in outs]
    if case == "same":   # a pytree whose leaves share transports (segments.py)
      outs += zc.compressed_psum([x, x[:, :2048] * 0.5], "x", bucket_bytes=0, **kw)
    return outs

  return body


def _failing_first_trace(body):
  """body, whose first trace raises before its first compressed call (a user error
  on this process only)."""
  traces = []

  def failing(x):
    traces.append(1)
    if len(traces) == 1:
      raise ValueError("simulated: the step's trace failed on this process")
    return body(x)

  return failing


def _collectives(case: str, pid: int, out: dict, start: float) -> None:
  """The collectives of CASE over every device of every process, into out."""
  import jax
  import ml_dtypes
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  import zipccl_jax as zc
  n = len(jax.devices())
  mesh = jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  x = np.random.default_rng(5).standard_normal((n * 8, 4096)).astype(ml_dtypes.bfloat16)
  xg = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("x")), lambda i: x[i])
  planned = case.startswith("planned_")
  specs = [P("x"), P()] + ([P(), P()] if case == "planned_same" else [])
  # planned_same compiles its plans ahead, the other processes' builds slowed down;
  # planned_gate's steps are scripted from the step after the plan
  jit = (functools.partial(zc.jit, compile_ahead=case != "planned_gate") if planned else jax.jit)
  body = _call(jax, zc, case, pid == 0)
  if case == "planned_trace_fails" and pid == jax.process_count() - 1:
    body = _failing_first_trace(body)
  f = jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=specs))
  if case == "planned_same" and pid != 0:
    _slow_builds_ahead()
  if case.startswith("planned_build_fails") and pid == jax.process_count() - 1:
    _fail_builds(ahead=case == "planned_build_fails_ahead")

  def want(v):
    outs = [zc.compressed_all_gather(v, "x", tiled=True, codec="raw"), zc.compressed_psum(v, "x", codec="raw")]
    return outs + (zc.compressed_psum([v, v[:, :2048] * 0.5], "x", codec="raw") if len(specs) > 2 else [])

  raw = jax.jit(jax.shard_map(want, mesh=mesh, in_specs=P("x"), out_specs=specs))
  from zipccl_jax._src import planned_exchange
  # measure, then planned steps: "planned_same" past two epochs of the exchange's keys
  steps = 2 * planned_exchange.EXCHANGE_EPOCH + 3 if case == "planned_same" else 3 if planned else 1
  if case == "planned_gate":
    steps = _disagreeing_clocks(f, pid)
  if case.startswith("planned_build_fails"):
    steps = 10**6   # until the error (or the deadline: no error is reported)
  if case == "planned_trace_fails":   # the job catches the first step's error and goes on
    try:
      f(xg)
    except Exception as e:
      out["first_error"], out["first_seconds"] = f"{type(e).__name__}: {e}", time.monotonic() - start
  ran = []   # per step: whether a plan was in force (the step ran it)
  k, deadline = 0, time.monotonic() + 120
  # planned_same: the fixed steps count from the plan's first (the switch is agreed,
  # so every process leaves the measuring steps at the same step)
  while k < steps and time.monotonic() < deadline:
    got = jax.block_until_ready(f(xg))
    ran.append(bool(planned and f.is_planned(xg)))
    out["calls"] = len(ran)   # the calls that returned, kept when one raises
    k += 1 if ran[-1] or case != "planned_same" else 0
  out["ran"] = ran
  want = raw(xg)
  if planned:
    out["slots"] = [s.slot_bytes for s in f.site_stats()]
    # the exchanges' keys left in the coordinator's store (every process published
    # its last exchange: earlier epochs are deleted, none is read again)
    from jax._src import distributed
    out["store_keys"] = len(distributed.global_state.client.key_value_dir_get_bytes(
        f"zipccl_jax/plan{f._ledger}"))   # pylint: disable=protected-access
  if case == "planned_gate":
    out["comparisons"] = [list(c) for c in f.comparisons()]
  out["exact"] = all(
      np.asarray(a.addressable_data(0)).view(np.uint16).tobytes()
      == np.asarray(b.addressable_data(0)).view(np.uint16).tobytes() for a, b in zip(got, want))


def _on_builds(after, ahead: bool = True) -> None:
  """after() runs at the end of each of this process's builds on the worker thread
  (ahead), or on the caller's thread (not ahead), once the trace and its exchanges
  with the other processes are done (as a compile would end); the other builds are
  left alone."""
  import threading
  from zipccl_jax._src import planned
  build = planned.Planned._build

  def wrapped(wrapper, plan, args, kwargs):
    program = build(wrapper, plan, args, kwargs)
    if (threading.current_thread() is not threading.main_thread()) == ahead:
      after()
    return program

  planned.Planned._build = wrapped


def _slow_builds_ahead(seconds: float = 1.5) -> None:
  """This process's builds on the worker thread take `seconds` longer: the processes
  hold a plan compiled ahead at different steps, and must switch to it at the same."""
  _on_builds(lambda: time.sleep(seconds))


def _fail_builds(ahead: bool) -> None:
  """This process's builds on the worker thread (ahead) or on the caller's fail (as a
  compile that runs out of memory would), the others' succeed."""
  def fail():
    raise MemoryError("simulated: the compiler ran out of memory")

  _on_builds(fail, ahead)


def _disagreeing_clocks(f, pid: int) -> int:
  """A short comparison (after 1 planned step, 2 pairs) timed by a clock under which
  process 0 finds raw words faster by 2 s a step and the others find the plan faster
  by 1 s: the mean difference (0.5 s) chooses raw words on every process. Returns
  the steps to run: measure, 1 planned, 4 timed, 2 raw."""
  from zipccl_jax._src import planned_gate
  planned_gate.PAIRS, planned_gate.FIRST_COMPARE = 2, 1
  from tests.gate_clock import phase_clock
  cost = {"planned": 3.0, "raw": 1.0} if pid == 0 else {"planned": 1.0, "raw": 2.0}
  f._clock = phase_clock(f, cost)   # pylint: disable=protected-access
  return 8


def main(argv) -> int:
  if not launch.launched() or len(argv) != 3:
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2
  pid = int(os.environ[launch.ENV_PROCESS_ID])
  out = {"error": None, "exact": None, "seconds": None}
  start = time.monotonic()
  try:
    launch.init_jax()
    if argv[2] == "exchange_absent":
      _exchange_absent(pid)
    else:
      _collectives(argv[2], pid, out, start)
  except Exception as e:  # the outcome under test: reported, not raised
    out["error"] = f"{type(e).__name__}: {e}"
    if "zipccl_jax" not in str(e):
      out["error"] += "\n" + traceback.format_exc()
  return _report(argv[1], pid, out, start)


def _exchange_absent(pid: int) -> None:
  import jax
  from zipccl_jax._src import compat
  jax.devices()   # every process starts its backend (which waits for all of them)
  n = int(os.environ[launch.ENV_NUM_PROCESSES])
  if pid == n - 1:
    time.sleep(6)   # alive, but not at the exchange
  else:
    compat.exchange_across_processes("absent", b"x", 3.0)


def _report(folder: str, pid: int, out: dict, start: float) -> int:
  out["seconds"] = time.monotonic() - start
  Path(folder, f"worker{pid}.json").write_text(json.dumps(out))
  sys.stdout.flush()
  # Process 0 hosts the coordinator: it leaves once every report is written, so that
  # the others can finish their own (failing) exchange with it.
  n = int(os.environ.get(launch.ENV_NUM_PROCESSES, "1"))
  deadline = time.monotonic() + 30
  while pid == 0 and time.monotonic() < deadline and not all(
      Path(folder, f"worker{i}.json").exists() for i in range(n)):
    time.sleep(0.05)
  os._exit(0)   # no distributed shutdown barrier after a failed collective


if __name__ == "__main__":
  sys.exit(main(sys.argv))
