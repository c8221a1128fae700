"""The compiled programs of `zipccl_jax.jit` for one argument signature: built on the
caller's thread when a step needs one now, or ahead of need on a background thread
while the steps go on with the program they run (docs/planned.md, "Compiling ahead").

Why ahead: a new plan (the first one, a grown one after an overflow, a shrink)
compiles the whole step again, 3.6-5 s for the examples' steps on one core: the time
of 4 data-parallel steps over 1 Gbit/s, or of 150 of the MoE example's. Compiled
ahead, it costs the steps only the host time it takes from them (none on a host with
an idle core; a step that waits on the wire leaves its core idle too), so plans can
follow the sizes closely. `Planned` switches every process to the new program at the
same step, after the step's exchange shows that every one of them holds it: programs
with different collectives must never run side by side.

Programs run as `jax.stages.Compiled` objects: jax.jit's cache does not hold what
`.lower().compile()` built (the jit object would compile again at its next call),
and a Compiled takes jax's fast dispatch path.

A background trace sees the thread-local configuration of its own thread, not the
caller's (`jax.default_device`, `jax.default_matmul_precision` and the like as
context managers): the worker takes the caller's settings for the build
(`compat.thread_local_config`), and when its trace context still differs from the
caller's, the program is built on the caller's thread when needed instead
(`_ContextDiffers`).
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from zipccl_jax._src import compat


class Program(NamedTuple):
  """One compiled program of a plan."""
  call: Any          # the jax.stages.Compiled: called with the non-static arguments
  sites: list        # the call sites its trace registered (planned_sites.Trace.sites)
  build_s: float     # seconds to trace, lower and compile it
  # the jax.jit object it was compiled from: called, its C++ dispatch finds the same
  # executable in jax's caches (`Planned._fast_step`)
  jitted: Any = None


class _ContextDiffers(Exception):
  """The caller's thread-local jax configuration is not the worker thread's."""


_lock = threading.Lock()
_executor: list = []   # [the worker], made on first use: one thread per process


def _worker() -> concurrent.futures.ThreadPoolExecutor:
  with _lock:
    if not _executor:
      _executor.append(concurrent.futures.ThreadPoolExecutor(
          max_workers=1, thread_name_prefix="zipccl_jax-compile"))
    return _executor[0]


def spec(x):
  """An argument leaf as a compile needs it: a jax.Array's shape, dtype, weak type and
  sharding (when committed: an uncommitted array goes where the others are), not its
  buffer (a step that donates it may delete it before a background compile reads
  it); any other leaf as it is."""
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if x.committed else None,
                                weak_type=bool(x.aval.weak_type))
  return x


def signature(args, kwargs, static: tuple) -> tuple[tuple, tuple]:
  """(key, layout) of a call's arguments, in one pass over their leaves (it runs on
  every call: 0.6 us a leaf, ~35 us for the MoE example's 54 leaves; two passes took
  twice that).

  key = (treedef, per leaf (shape, dtype), the static arguments) keys a `Planned`
  state (a Python scalar's type stands for its dtype). layout = per jax.Array leaf
  its sharding (when committed) and weak type keys the state's programs: what a
  program is compiled for beyond shapes and dtypes. Training loops change it once,
  from the initial state (placed by hand) to the first step's outputs; a program
  built ahead for another layout is built again when needed. An uncommitted array's
  device is not part of it (it goes where the others are)."""
  dyn = [a for i, a in enumerate(args) if i not in static]
  leaves, treedef = jax.tree_util.tree_flatten((dyn, kwargs))
  avals, lay = [], []
  for x in leaves:
    array = type(x) in _array_types   # a set lookup: isinstance(x, jax.Array) is ~0.2 us
    if not array and isinstance(x, jax.Array):
      _array_types.add(type(x))
      array = True
    if array:
      a = x.aval
      avals.append((a.shape, a.dtype))
      lay.append((x.committed and x.sharding, a.weak_type))
    else:
      shape = getattr(x, "shape", None)
      avals.append((np.shape(x), type(x)) if shape is None else (tuple(shape), x.dtype))
      lay.append(None)
  static_args = tuple(args[i] for i in static if i < len(args))
  return (treedef, tuple(avals), static_args), tuple(lay)


_array_types: set = set()   # the concrete jax.Array types seen (`signature`)


def key_text(key) -> str:
  """A `signature` key as text, as saved plans key their entries (planned_io.py):
  dtypes by name, the tree structure as jax prints it."""
  treedef, avals, static = key
  avals = tuple((shape, str(getattr(d, "name", None) or d.__name__)) for shape, d in avals)
  return repr((str(treedef), avals, static))


class Programs:
  """The programs of one argument signature, by (plan, `layout`): built, or being
  built ahead."""

  def __init__(self):
    self._built: dict = {}
    self._ahead: dict = {}   # key -> Future[Program]

  def __contains__(self, key) -> bool:
    return key in self._built or key in self._ahead

  def get(self, key, build: Callable[[], Program]) -> tuple[Program, bool]:
    """(the program of `key`, whether this call built it on this thread): the one
    built, else the one built ahead (waited for; built here if the worker could
    not), else build() here. An error of a trace or compile ahead raises here."""
    program = self._built.get(key)
    if program is not None:
      return program, False
    future = self._ahead.pop(key, None)
    here = future is None
    if future is not None:
      try:
        program = future.result()
      except _ContextDiffers:
        here = True
    if here:
      program = build()
    self._built[key] = program
    return program, here

  def share(self, key, other) -> None:
    """Makes the program built for `key` the program of `other` too: their traces
    are the same (the measuring program and the empty plan's, with no site)."""
    self._built[other] = self._built[key]

  def ahead(self, key, build: Callable[[], Program]) -> None:
    """Starts build() on the worker thread, under the caller's thread-local jax
    settings, with the caller's trace context required (`_ContextDiffers`
    otherwise)."""
    if key in self:
      return
    context, local = compat.trace_context(), compat.thread_local_config()

    def run():
      with compat.thread_local_config_applied(local or {}):
        if context is None or compat.trace_context() != context:
          raise _ContextDiffers()
        return build()

    self._ahead[key] = _worker().submit(run)

  def building(self) -> bool:
    """Whether a build ahead is queued or running on the worker thread."""
    return any(not f.done() for f in self._ahead.values())

  def built(self, key) -> bool:
    """Whether a step took the program of `key` already (`get`): the same answer
    on every process, unlike `ready`."""
    return key in self._built

  def failed(self, key) -> bool:
    """Whether the build ahead of `key` ended in an error (which `get` raises); a
    build the worker could not take (`_ContextDiffers`) is not one: `get` builds it."""
    future = self._ahead.get(key)
    if future is None or not future.done():
      return False
    error = future.exception()
    return error is not None and not isinstance(error, _ContextDiffers)

  def ready(self, key) -> bool:
    """Whether the program of `key` is built (or its build ended, in an error that
    `get` raises): a step could switch to it without waiting."""
    future = self._ahead.get(key)
    return key in self._built or (future is not None and future.done())

