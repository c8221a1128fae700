"""Every process of a job decides alike: the calibration broadcast from process 0
(`agree_across_processes`, which `calibrate` uses), and the check that every
process holds the same decision inputs (`check_agreement`; once automatically at
the job's first compressed collective, `check_agreement_once`).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from zipccl_jax._src import compat
from zipccl_jax._src.calibration import Calibration, active_calibration


def agree_across_processes(cal: Calibration, *, process_index: int | None = None,
                           broadcast: Callable[[np.ndarray], np.ndarray] | None = None
                           ) -> Calibration:
  """Process 0's calibration on every process (identical decisions everywhere).

  Two broadcasts from process 0: the length of its canonical JSON, then the bytes
  (as int32, padded to that length). `broadcast(array) -> array` must return
  process 0's array on every process; the default is
  `jax.experimental.multihost_utils.broadcast_one_to_all` (a psum over all
  devices), and with a single process the calibration is returned unchanged.

  Args:
    cal: this process's measurement.
    process_index: this process (default `jax.process_index()`).
    broadcast: see above (injectable for tests).
  """
  if broadcast is None:
    if jax.process_count() == 1:
      return cal
    broadcast = multihost_utils.broadcast_one_to_all
  if process_index is None:
    process_index = jax.process_index()
  blob = cal.to_json().encode() if process_index == 0 else b""
  length = int(np.asarray(broadcast(np.array([len(blob)], np.int32))).reshape(-1)[0])
  if length <= 0:
    raise RuntimeError(f"agree_across_processes: process 0 sent a calibration of "
                       f"{length} bytes")
  buf = np.zeros(length, np.int32)
  buf[:len(blob)] = np.frombuffer(blob, np.uint8)
  got = np.asarray(broadcast(buf)).astype(np.uint8).tobytes()
  return Calibration.from_json(got)


# Environment variables that change what the collectives compile: every process of
# a job must see the same values (docs/env.md).
PROGRAM_ENV_VARS = ("ZIPCCL_CHUNKS", "ZIPCCL_OVERLAP", "ZIPCCL_CHECK_DECODE")


def decision_inputs() -> dict:
  """What a process's static decisions depend on beyond the call's own arguments:
  the calibration in force (its fingerprint, or "none": no calibration decides
  differently from any calibration, the saved defaults included) and the
  environment variables that change the program."""
  cal = active_calibration()
  inputs = {"calibration": cal.fingerprint if cal is not None else "none"}
  for var in PROGRAM_ENV_VARS:
    inputs[var] = os.environ.get(var, "").strip()
  return inputs


def _digest(inputs: Mapping) -> np.ndarray:
  """int32[8]: sha256 of the canonical JSON of `inputs`."""
  blob = hashlib.sha256(json.dumps(dict(inputs), sort_keys=True).encode()).digest()
  return np.frombuffer(blob, np.int32).copy()


# The automatic check (`check_agreement_once`): how long a process waits for the
# others to reach their first compressed collective.
AUTO_CHECK_TIMEOUT_S = 600.0
_auto_checked = False


def check_agreement_once() -> None:
  """check_agreement(raise_on_mismatch=True) at the first compressed collective of a
  multi-process job, once per process lifetime (one small host-to-host exchange
  through the coordinator: it runs while the first call is traced, before any
  program of it can run). A no-op with one process and after the first call.

  Decisions taken later from inputs changed on some processes only (a
  set_calibration after the first call) are not re-checked; call check_agreement()
  again after such a change, on every process.
  """
  global _auto_checked
  if _auto_checked or jax.process_count() == 1:
    return
  _auto_checked = True

  def allgather(mine):
    global _auto_checked
    try:
      blobs = compat.exchange_across_processes("decision_inputs", mine.tobytes(), AUTO_CHECK_TIMEOUT_S)
    except Exception:
      # the wait ended without every value (a timeout, or the others' trace failed:
      # `compat.exchanges_watched`): the next first call checks again (this
      # process's value stays published, the others read it when they come)
      _auto_checked = False
      raise
    if blobs is None:
      return mine[None]
    return np.stack([np.frombuffer(b, mine.dtype) for b in blobs])

  check_agreement(raise_on_mismatch=True, allgather=allgather)


def check_agreement(*, raise_on_mismatch: bool = False,
                    allgather: Callable[[np.ndarray], np.ndarray] | None = None) -> bool:
  """Whether every process has the same decision inputs (`decision_inputs`).

  Symmetric: every process gathers every process's digest, so every process
  returns the same verdict. Must be called by all processes (it runs a
  collective); with one process it is True.

  Args:
    raise_on_mismatch: raise RuntimeError instead of returning False; the message
      lists this process's inputs and which processes differ.
    allgather: `array -> stacked arrays of all processes` (default
      `jax.experimental.multihost_utils.process_allgather`; injectable for tests).
  """
  mine = _digest(decision_inputs())
  if allgather is None:
    if jax.process_count() == 1:
      return True
    allgather = multihost_utils.process_allgather
  every = np.asarray(allgather(mine)).reshape(-1, mine.size)
  differ = [i for i in range(every.shape[0]) if not np.array_equal(every[i], every[0])]
  if differ and raise_on_mismatch:
    raise RuntimeError(
        f"zipccl_jax: the processes disagree on what decides the compressed collectives: "
        f"processes {differ} differ from process 0. This process has "
        f"{decision_inputs()}. Every process must hold the same calibration file (or "
        f"none) and the same {', '.join(PROGRAM_ENV_VARS)}.")
  return not differ
