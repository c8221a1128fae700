"""All five compressed collectives across real processes (jax.distributed, gloo on CPU).

Each case launches N copies of tests/_mp_worker.py with examples/launch.py
(127.0.0.1, a free coordinator port). A worker that dies makes the launcher kill
the others (they would wait forever inside a collective) and fail with that
worker's output; the whole launch has a deadline, so the test cannot hang.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("_mp_worker.py")
sys.path.insert(0, str(WORKER.parent.parent / "examples"))
import launch  # noqa: E402
DEADLINE_S = 240


def _launch(tmp_path: Path, nproc: int, local: int, extra_env=None):
  """Runs the worker as `nproc` processes with examples/launch.py; their JSON reports."""
  cmd = [sys.executable, str(WORKER), str(tmp_path)]
  try:
    launch.launch(cmd, nproc, local_devices=local, deadline_s=DEADLINE_S, logdir=tmp_path,
                  env=extra_env, echo=False, cwd=str(WORKER.parent.parent))
  except launch.LaunchError as e:
    failure = str(e)
    # A worker's own report (a failed check, a traceback) is the clearest message.
    for pid in range(nproc):
      out = tmp_path / f"worker{pid}.json"
      if out.exists():
        errors = json.loads(out.read_text()).get("errors")
        if errors:
          failure += "\nreported errors:\n" + "\n".join(errors)
          break
    pytest.fail(failure)
  return [json.loads((tmp_path / f"worker{pid}.json").read_text()) for pid in range(nproc)]


@pytest.mark.parametrize("nproc, local", [(2, 2), (4, 1)], ids=["2procs_x_2devices",
                                                                  "4procs_x_1device"])
def test_collectives_across_processes(tmp_path, nproc, local):
  results = _launch(tmp_path, nproc, local)
  for pid, r in enumerate(results):
    assert r["ok"], f"worker {pid}: " + "\n".join(r["errors"])
  # Replicated results (all_gather, psum) are the same bytes in every process, and
  # every process saw the same fallback decisions.
  first = results[0]
  for pid, r in enumerate(results[1:], start=1):
    assert r["digests"] == first["digests"], f"process {pid} disagrees with process 0"
    assert r["flags"] == first["flags"], f"process {pid} fallback flags differ"
  assert first["flags"]["gaussian"] == [False] * 5
  assert first["flags"]["random_bits"] == [True] * 5
  assert first["flags"]["size_classes"] == [False] * 5
  assert len(first["digests"]) == 8


def test_chunked_collectives_across_processes(tmp_path):
  """ZIPCCL_CHUNKS=2: every compressed row moves in two chunks (docs/design.md,
  "Transport: the slot ladder"), each with its own agreement across the processes; the same checks."""
  results = _launch(tmp_path, 2, 1, {"ZIPCCL_CHUNKS": "2"})
  for pid, r in enumerate(results):
    assert r["ok"], f"worker {pid}: " + "\n".join(r["errors"])
  assert results[1]["digests"] == results[0]["digests"]
  assert results[0]["flags"]["gaussian"] == [False] * 5
  assert results[0]["flags"]["random_bits"] == [True] * 5


def test_dead_worker_fails_fast_with_its_output(tmp_path):
  """A worker that dies mid-job is reported (exit code and output), and its peers,
  blocked in a collective, are killed instead of hanging the suite."""
  start = time.monotonic()
  with pytest.raises(pytest.fail.Exception, match=r"worker 1 of 2 exited with code 3"):
    _launch(tmp_path, 2, 1, {"ZIPCCL_MP_CRASH_PID": "1"})
  assert time.monotonic() - start < DEADLINE_S / 2


def _diverge(tmp_path: Path, nproc: int, case: str) -> list:
  """Runs tests/_diverge_worker.py CASE as `nproc` processes; their reports."""
  worker = WORKER.with_name("_diverge_worker.py")
  launch.launch([sys.executable, str(worker), str(tmp_path), case], nproc, local_devices=1,
                deadline_s=DIVERGE_DEADLINE_S, logdir=tmp_path, echo=False,
                cwd=str(WORKER.parent.parent))
  return [json.loads((tmp_path / f"worker{pid}.json").read_text()) for pid in range(nproc)]


DIVERGE_DEADLINE_S = 90   # the launch (start-up, compile); the outcome itself within 30 s
# what each divergent configuration must end in, on every process
DIVERGE_ERRORS = {
    "codec": r"planned different compressed transports \(they differ in: codec and format version",
    "chunks": r"planned different compressed transports \(they differ in: .*chunking",
    "check_decode": r"planned different compressed transports \(they differ in: .*check_decode",
    "calibration": r"the processes disagree on what decides the compressed collectives",
    # zipccl_jax.jit: the sites' signatures differ, found after the measuring step
    "planned_codec": r"zipccl_jax.jit: the processes traced .* into different call sites or plans",
    "planned_chunks": r"zipccl_jax.jit: the processes traced .* into different call sites or plans",
}


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("case", sorted(DIVERGE_ERRORS))
def test_divergent_processes_fail_on_every_process(tmp_path, case, nproc):
  """Processes configured differently: an error naming the disagreement on every
  process, within 30 s of the start of the job's first step; never a hang, never
  NaN returned as success."""
  import re
  for pid, r in enumerate(_diverge(tmp_path, nproc, case)):
    assert r["error"] and re.search(DIVERGE_ERRORS[case], r["error"]), (pid, r)
    assert r["seconds"] < 30 + 30, (pid, r)   # start-up and compile included


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_process_absent_from_an_exchange_is_named_on_every_other(tmp_path, nproc):
  """A process that does not reach an exchange between processes (by blocking reads
  with 2 processes, by a barrier with 4): the others fail within the exchange's
  timeout, naming it."""
  import re
  results = _diverge(tmp_path, nproc, "exchange_absent")
  for pid, r in enumerate(results[:-1]):
    assert r["error"] and re.search(rf"process(es)? \[?{nproc - 1}\]? did not publish 'absent' within 3 s",
                                    r["error"]), (pid, r)
    assert r["seconds"] < 30, (pid, r)
  assert results[-1]["error"] is None


def test_stats_on_one_process_only_is_the_same_program(tmp_path):
  """stats=True on process 0 only (the usual "log on rank 0"): the same collectives
  run everywhere, so the job completes with results equal to codec="raw"."""
  for pid, r in enumerate(_diverge(tmp_path, 2, "stats")):
    assert r["error"] is None and r["exact"] is True, (pid, r)


@pytest.mark.parametrize("nproc", [2, 4])
def test_planned_steps_agree_across_processes(tmp_path, nproc):
  """zipccl_jax.jit over processes: every process derives the same plan from the
  exchanged sizes and switches to it, compiled ahead, at the same step although
  the processes' builds end at different times; the planned steps equal
  codec="raw" (a pytree psum's leaves in shared transports among them)."""
  results = _diverge(tmp_path, nproc, "planned_same")
  for pid, r in enumerate(results):
    assert r["error"] is None and r["exact"] is True, (pid, r)
    assert r["slots"] == results[0]["slots"] and all(results[0]["slots"]), (pid, r)
    assert len(r["slots"]) == 1 + 2 + 2 * 2, (pid, r)   # gather, psum, the pytree's two leaves
    # the plan compiled ahead (1.5 s slower on the other processes) was taken at the
    # same step everywhere, after steps that measured on while it built
    assert r["ran"] == results[0]["ran"] and r["ran"][-1], (pid, r)
    assert r["ran"][:3] == [False] * 3, (pid, r)
    # 2 epochs + 4 exchanges (one per step, one before the first planned step): the
    # epochs before the last are deleted, so fewer than an epoch's keys are left
    assert 0 < r["store_keys"] <= 64 * nproc, (pid, r)


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("where", ["ahead", "here"])
def test_a_build_failing_on_one_process_stops_every_process(tmp_path, where, nproc):
  """The last process's builds fail (the others' succeed), on the worker thread (a
  plan compiled ahead: the failure travels in the steps' exchange) or on the caller's
  (the measuring program: in the comparison of programs before it runs): every
  process raises at the same step, that process with its build's error, the others
  naming it, within seconds rather than the exchange's timeout."""
  results = _diverge(tmp_path, nproc, f"planned_build_fails_{where}")
  text = "failed to build ahead on" if where == "ahead" else "failed to build on"
  for pid, r in enumerate(results[:-1]):
    assert r["error"] and f"{text} process(es) [{nproc - 1}]" in r["error"], (pid, r)
  assert "MemoryError: simulated: the compiler ran out of memory" in results[-1]["error"]
  for pid, r in enumerate(results):
    assert r.get("calls", 0) == results[0].get("calls", 0), (pid, r)   # the same step everywhere
    assert r["seconds"] < 30 + 30, (pid, r)   # start-up and compile included
  assert (results[0].get("calls", 0) >= 1) == (where == "ahead")


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_trace_failing_on_one_process_stops_every_process(tmp_path, nproc):
  """The last process's first trace raises before its first compressed call, while
  the others wait inside theirs in the job's check of the decision inputs, which
  that process never reaches: they stop within seconds, naming it (not after that
  check's 600 s timeout), and the job that catches the error and goes on runs
  exact steps on every process."""
  results = _diverge(tmp_path, nproc, "planned_trace_fails")
  for pid, r in enumerate(results):
    want = ("ValueError: simulated: the step's trace failed" if pid == nproc - 1
            else f"failed to build on process(es) [{nproc - 1}]")
    assert want in r["first_error"] and r["first_seconds"] < 30 + 30, (pid, r)
    assert r["error"] is None and r["exact"] is True, (pid, r)


def test_processes_that_time_differently_take_one_decision(tmp_path):
  """zipccl_jax.jit's comparison of the plan with raw words (planned_gate.py): the
  processes' clocks disagree (process 0: raw faster; process 1: the plan), and both
  take the decision of the mean of their paired differences, with results equal to
  codec="raw"."""
  results = _diverge(tmp_path, 2, "planned_gate")
  for pid, r in enumerate(results):
    assert r["error"] is None and r["exact"] is True, (pid, r)
    assert r["comparisons"] == [[5, 2.0, 1.5, 0.5, "raw"]], (pid, r)
