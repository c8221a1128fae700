"""The call sites of `zipccl_jax.jit` as its function is traced (planned.py drives them).

While `planned.Planned` traces the user's function under a plan, `active()` returns
the `Trace`; every compressed ladder transport traced then (transport.py) registers
as the next call site (`site`), moves the slot the plan gives it, and passes its rows
through `record`, the "zipccl_mailbox" custom call that writes its used size and
decode statuses into the host table the wrapper reads after the step (ffi/mailbox.h).
Sites are numbered in trace order, which is deterministic, so every process and
every re-trace numbers them alike.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src.codecs import base
from zipccl_jax._src.ladder import ALIGN

RAW = -1                 # a site's plan: move the raw words (no codec)
ELEMENTWISE = -2         # `record`'s column: every value's columns recorded apart

_local = threading.local()


@dataclasses.dataclass
class Trace:
  """What one trace of `fun` under a plan sees: the plan, and the sites as traced."""
  ledger: int
  plan: tuple | None          # per site: slot bytes, RAW; None: the measuring program
  sites: list = dataclasses.field(default_factory=list)   # (signature, rungs, raw_row)


def active() -> Trace | None:
  """The trace of `zipccl_jax.jit` in progress on this thread, or None."""
  return getattr(_local, "trace", None)


@contextlib.contextmanager
def tracing(trace: Trace):
  prev = active()
  trace.sites.clear()
  _local.trace = trace
  try:
    yield
  finally:
    _local.trace = prev


def record(x, values, ledger: int, slot: int, column: int = -1):
  """x passed through (aliased, no copy) after max(values[i]) (int32) is recorded into
  the mailbox table[ledger][slot + i] for each i (ffi/mailbox.h): x's consumers wait
  for the record. column >= 0: values[0] is read as rows of its last axis and
  max(0, its column `column`) is recorded (an encoder's stats s32[R, 4], column 2:
  the largest used size, with no reduction op of its own). column ELEMENTWISE:
  the values share a last dimension E and column j of value i goes to
  table[ledger][slot + K j + i] (a segmented group's used sizes and statuses,
  one pair of slots per site: segments.py)."""
  _ffi.register()
  out = base.result_type(x.shape, x.dtype, x)
  return jax.ffi.ffi_call("zipccl_mailbox", out, input_output_aliases={0: 0},
                          vmap_method="expand_dims")(
      x, *[v.astype(jnp.int32) for v in values], ledger=np.int64(ledger), slot=np.int64(slot),
      column=np.int64(column))


def wire_rows(where: str, n_peers: int) -> int:
  """The rows of its slot one device puts on the links per step at a call site of
  collective `where` over N = n_peers devices: an all_gather's row goes to each of
  its N - 1 peers, an all_to_all sends N - 1 of its N rows (its own stays), a
  ppermute its row to one peer. A site's wire bytes per step are its slot x these
  rows, whatever the collective's algorithm (every peer must receive its rows)."""
  return 1 if where == "a ppermute" else n_peers - 1


def signature(where: str, plan, rows_shape: tuple, check: bool, n_peers: int) -> tuple:
  """A call site's signature: (collective, codec, dtype, rows shape, chunk, check
  decode, rows on the wire), what processes compare and saved plans match."""
  return (where, plan.codec.name, np.dtype(plan.dtype).name, tuple(int(d) for d in rows_shape),
          tuple(plan.chunk), bool(check), wire_rows(where, n_peers))


def site(trace: Trace, signature: tuple, rungs: tuple, raw_row: int) -> tuple[int, int | None]:
  """Registers the next call site of `trace`: (its index, its planned slot: bytes,
  RAW, or None while measuring)."""
  k = len(trace.sites)
  trace.sites.append((signature, tuple(rungs), raw_row))
  if trace.plan is None:
    return k, None
  slot = trace.plan[k] if k < len(trace.plan) else RAW
  # A plan that does not fit this site (a stale saved plan, a fun that traces
  # differently): raw, which is always exact.
  return k, slot if fits(slot, rungs) else RAW


def fits(slot: int, rungs: tuple) -> bool:
  """Whether `slot` (bytes per row) is a slot a site with ladder `rungs` can move: a
  multiple of ALIGN from its first rung (at least the codec's smallest encoding) to
  its top one (below the raw row)."""
  return bool(rungs) and slot % ALIGN == 0 and rungs[0] <= slot <= rungs[-1]
