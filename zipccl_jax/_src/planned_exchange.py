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
others stop with it rather than wait out the timeout (docs/planned.md, "Compiling
ahead").
"""
from __future__ import annotations

import zlib

import numpy as np

from zipccl_jax._src import compat

EXCHANGE_TIMEOUT_S = 600.0
EXCHANGE_EPOCH = 64      # exchanges per directory of the coordinator's store (`Exchanges.blobs`)
NO_PROGRAM = -1          # the fingerprint of a process whose build failed (fingerprints are >= 0)


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
    # keys plan<ledger>/<epoch>/<exchange>/<process>: the epoch before this one is
    # dropped as a whole at an epoch's first exchange (no delete round trip per step)
    forget = f"plan{self.ledger}/{epoch - 1}" if epoch and s % EXCHANGE_EPOCH == 0 else None
    return compat.exchange_across_processes(f"plan{self.ledger}/{epoch}/{s}", mine.tobytes(),
                                            EXCHANGE_TIMEOUT_S, forget=forget)

  def compare_programs(self, name: str, sites: list, plan) -> None:
    """Before a program's first run: raises on every process when the processes
    traced different programs, or when some process's build failed (`no_program`)."""
    mine = np.asarray([fingerprint(sites, plan), len(sites)], np.int32)
    blobs = self.blobs(mine)
    if blobs is None:
      return
    every = [np.frombuffer(b, np.int32) for b in blobs]
    failed = [p for p, e in enumerate(every) if e[0] == NO_PROGRAM]
    if failed:
      raise RuntimeError(
          f"zipccl_jax.jit: the program for {name} failed to build on process(es) "
          f"{failed} (the error is raised there); every process stops here")
    check_same(name, every)

  def no_program(self) -> None:
    """This process's build of the program the others are comparing failed: tells
    them (their `compare_programs` raises) before it raises its error."""
    self.blobs(np.asarray([NO_PROGRAM, 0], np.int32))
