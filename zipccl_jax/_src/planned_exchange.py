"""The exchanges between the processes of a `zipccl_jax.jit` job (planned.py), and the
checks every process makes on what they exchanged.

An exchange is host to host, through the jax.distributed coordinator's key-value
store (`compat.exchange_across_processes`): no device collective, so it runs while
nothing else agrees. Each wrapper numbers its exchanges; every process makes the
same ones in the same order (one per validated step, one before a program's first
run, one per comparison of the plan with raw words), so their numbers match.

Before a program's first run the processes compare a fingerprint of what they
traced (the sites' signatures and the plan): processes whose programs differ would
issue collectives of different sizes, which gloo aborts on and NCCL may hang in. A
process whose build of that program failed exchanges NO_PROGRAM instead, so the
others stop with it rather than wait out the timeout, and one whose build stopped
for that reason before it ended (its trace waited in an exchange the failed ones
never reach: `failed_elsewhere`) exchanges STOPPED (docs/planned.md, "Compiling
ahead").
"""
from __future__ import annotations

import zlib

import numpy as np

from zipccl_jax._src import compat

EXCHANGE_TIMEOUT_S = 600.0
EXCHANGE_EPOCH = 64      # exchanges per directory of the coordinator's store (`Exchanges.blobs`)
NO_PROGRAM = -1          # the fingerprint of a process whose build failed (fingerprints are >= 0)
STOPPED = -2             # ... of one whose build stopped because others' failed (`failed_elsewhere`)


def fingerprint(sites: list, plan) -> int:
  """A 31-bit digest of a program's traced sites (their signatures) and its plan."""
  text = repr(([s[0] for s in sites], plan))
  return zlib.crc32(text.encode()) & 0x7FFFFFFF


def check_same(name: str, every: list) -> None:
  """Raises on every process when the exchanged rows' fingerprints (element 0) or
  lengths differ: the processes traced `name` into different programs."""
  differ = [i for i, e in enumerate(every) if e.size != every[0].size or e[0] != every[0][0]]
  if differ:
    raise RuntimeError(
        f"zipccl_jax.jit: the processes traced {name} into different call sites or "
        f"plans (processes {differ} differ from process 0): they pass different codec=, "
        "chunks= or options, or hold different calibrations or saved plans. Every process "
        "must run the same program.")


def _failed_to_build(name: str, failed: list) -> str:
  return (f"zipccl_jax.jit: the program for {name} failed to build on process(es) {failed} "
          "(the error is raised there); every process stops here")


class Exchanges:
  """The numbered exchanges of one wrapper (its mailbox ledger)."""

  def __init__(self, ledger: int):
    self.ledger = ledger
    self.count = 0

  def blobs(self, mine: np.ndarray) -> list | None:
    """Every process's `mine` (bytes, in process order; None outside a multi-process
    job). The coordinator's store keeps this epoch's and the previous epoch's entries."""
    self.count += 1
    s, epoch = self.count, self.count // EXCHANGE_EPOCH
    # the epoch before this one is dropped as a whole at an epoch's first exchange (no
    # delete round trip per step)
    forget = f"plan{self.ledger}/{epoch - 1}" if epoch and s % EXCHANGE_EPOCH == 0 else None
    return compat.exchange_across_processes(self._key(s), mine.tobytes(), EXCHANGE_TIMEOUT_S,
                                            forget=forget)

  def _key(self, s: int) -> str:
    """The key of exchange `s`: plan<ledger>/<epoch>/<exchange> (+ /<process> per value)."""
    return f"plan{self.ledger}/{s // EXCHANGE_EPOCH}/{s}"

  def failed_elsewhere(self, name: str) -> str | None:
    """While this process builds the program the next exchange compares (on the
    caller's thread): the error that stops it when other processes' builds of it
    failed (they sent NO_PROGRAM there: `stopped`), else None. Their failure may
    precede an exchange inside this process's trace that they will never reach (the
    first compressed call's check of the decision inputs, calibration_agreement.py);
    this is the `compat.exchanges_watched` check that ends its wait."""
    failed = sorted(p for p, v in compat.peek_across_processes(self._key(self.count + 1)).items()
                    if np.frombuffer(v, np.int32)[0] == NO_PROGRAM)
    return _failed_to_build(name, failed) if failed else None

  def stopped(self, error: Exception) -> None:
    """This process's build of the program the others are comparing did not end:
    tells them (their `compare_programs` raises) before it raises `error`, as
    NO_PROGRAM, or STOPPED when `error` is `failed_elsewhere`'s (the processes whose
    own build failed are the ones named)."""
    mine = STOPPED if isinstance(error, compat.ExchangeAbandoned) else NO_PROGRAM
    self.blobs(np.asarray([mine, 0], np.int32))

  def compare_programs(self, name: str, sites: list, plan) -> None:
    """Before a program's first run: raises on every process when the processes
    traced different programs, or when some process's build failed (`stopped`)."""
    mine = np.asarray([fingerprint(sites, plan), len(sites)], np.int32)
    blobs = self.blobs(mine)
    if blobs is None:
      return
    every = [np.frombuffer(b, np.int32) for b in blobs]
    # the processes whose own build failed (those that stopped for them, if none)
    for marker in (NO_PROGRAM, STOPPED):
      failed = [p for p, e in enumerate(every) if e[0] == marker]
      if failed:
        raise RuntimeError(_failed_to_build(name, failed))
    check_same(name, every)
