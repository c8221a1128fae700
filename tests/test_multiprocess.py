"""All five compressed collectives across real processes (jax.distributed, gloo on CPU).

Each case launches N copies of tests/_mp_worker.py on 127.0.0.1 with a free
coordinator port. A worker that dies makes the launcher kill the others (they
would wait forever inside a collective) and fail with that worker's output; the
whole launch has a deadline, so the test cannot hang.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("_mp_worker.py")
DEADLINE_S = 240


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _tail(path: Path, n: int = 3000) -> str:
  try:
    return path.read_text(errors="replace")[-n:]
  except OSError:
    return "<no output>"


def _launch(tmp_path: Path, nproc: int, local: int, extra_env=None):
  env = dict(os.environ)
  env.update(extra_env or {})
  env.pop("XLA_FLAGS", None)            # the worker sets its own device count
  env["JAX_PLATFORMS"] = "cpu"
  env.setdefault("PYTHONUNBUFFERED", "1")
  port = _free_port()
  procs, logs, outs = [], [], []
  for pid in range(nproc):
    log = tmp_path / f"worker{pid}.log"
    out = tmp_path / f"worker{pid}.json"
    logs.append(log)
    outs.append(out)
    with open(log, "w") as fh:
      procs.append(subprocess.Popen(
          [sys.executable, str(WORKER), str(pid), str(nproc), str(port), str(local), str(out)],
          stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(WORKER.parent.parent)))
  deadline = time.monotonic() + DEADLINE_S
  failure = None
  try:
    while True:
      codes = [p.poll() for p in procs]
      dead = [i for i, c in enumerate(codes) if c not in (None, 0)]
      if dead:
        i = dead[0]
        failure = (f"worker {i} of {nproc} exited with code {codes[i]}; its output:\n"
                   f"{_tail(logs[i])}")
        break
      if all(c == 0 for c in codes):
        break
      if time.monotonic() > deadline:
        running = [i for i, c in enumerate(codes) if c is None]
        failure = (f"timeout after {DEADLINE_S}s; workers {running} still running. "
                   f"Output of worker {running[0]}:\n{_tail(logs[running[0]])}")
        break
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for p in procs:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:  # pragma: no cover
        pass
  if failure:
    # A worker's own report (a failed check, a traceback) is the clearest message.
    for out in outs:
      if out.exists():
        errors = json.loads(out.read_text()).get("errors")
        if errors:
          failure += "\nreported errors:\n" + "\n".join(errors)
          break
    pytest.fail(failure)
  return [json.loads(o.read_text()) for o in outs]


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


def test_dead_worker_fails_fast_with_its_output(tmp_path):
  """A worker that dies mid-job is reported (exit code and output), and its peers,
  blocked in a collective, are killed instead of hanging the suite."""
  start = time.monotonic()
  with pytest.raises(pytest.fail.Exception, match=r"worker 1 of 2 exited with code 3"):
    _launch(tmp_path, 2, 1, {"ZIPCCL_MP_CRASH_PID": "1"})
  assert time.monotonic() - start < DEADLINE_S / 2
