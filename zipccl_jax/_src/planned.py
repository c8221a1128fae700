"""The planned transport: `zipccl_jax.jit`, static slots decided before the step and
validated after it (docs/planned.md).

Under `zipccl_jax.jit(fun)` every compressed ladder transport traced in `fun` is a
*call site*, numbered in trace order (tracing is deterministic, so every process
and every re-trace numbers the sites alike). A site moves its rows in a slot taken
from the plan: encode -> cut the rows to the planned slot -> one lax collective ->
decode; no agreement collective and no conditional. Each site records into the
mailbox (ffi/mailbox.h) the largest used size of its rows and its decode failures;
after the step the wrapper takes the table (one read of host memory per step), and
in a multi-process job exchanges it once through the coordinator, so every process
sees the same maxima and takes the same decision:

  * every row fit its slot: the outputs are returned;
  * some row did not (its receivers decoded a cut row: NaN rows, status != 0): the
    outputs are discarded and the step runs again on the same inputs as the
    measuring program (raw words: bit-identical to codec="raw", and every site's
    true used size); the plan of the sites that outgrew their slots grows to the
    slot above the used size plus a grown headroom (`MAX_HEADROOM`), for the next
    steps (each plan compiled once, cached).

The first MEASURE_STEPS calls for given argument shapes measure: a program that
encodes at each site (to record the used size) and moves the raw words, so its
results are exact; the plan is then the slot (a multiple of 128 bytes) above each
site's largest used size plus a headroom from their spread and trend
(planned_slots.py). Plans can be saved and loaded (`save_plans` / `load_plans`), so
a restart starts planned.

One step is in flight at a time: the wrapper returns a step's outputs once it has
validated them (a host that runs ahead would have to discard every later step that
consumed a failed one). A plan whose sites are all raw has nothing to validate (raw
words neither overflow nor fail to decode): its steps return as from jax.jit, and
once two calls of one signature ran raw words, the next ones go through jax.jit's
own dispatch (`_fast_step`). Donated
arguments are donated by the programs that cannot run again (the measuring program,
raw words) and kept by planned steps, which a re-run may need them for
(`_compresses`). Every so often the plan is timed against raw words, and the faster runs
(planned_gate.py).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Callable

import jax
import numpy as np

from zipccl_jax._src import compat
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src import planned_exchange as exchange_lib
from zipccl_jax._src import planned_gate as gate_lib
from zipccl_jax._src import planned_programs as programs_lib
from zipccl_jax._src import planned_reports as reports_lib
from zipccl_jax._src import planned_slots as slots
from zipccl_jax._src.planned_state import State as _State
from zipccl_jax._src.planned_sites import RAW, Trace, tracing
from zipccl_jax._src.planned_slots import (HEADROOM, MAX_HEADROOM, SHRINK_MIN, SHRINK_WINDOW,
                                           slot_for as _slot_for, window_target)

CLOCK_UNIT_S = 1e-5      # the exchanged clocks' unit (int32: up to ~6 h)

_ALIGN = ladder_lib.ALIGN
_ledgers = itertools.count(1)


class _Retrace(Exception):
  """A fast step's arguments are not those its program was compiled for."""


_fast = threading.local()   # .on: a fast step is dispatching on this thread


def _compresses(plan) -> bool:
  """Whether `plan` has a compressed site: its steps are validated (a row may outgrow
  its slot) and keep their donated arguments for a re-run; the measuring program
  (None) and plans of raw sites only cannot fail, and take them."""
  return plan is not None and any(p != RAW for p in plan)


class Planned(reports_lib.Reports):
  """`zipccl_jax.jit(fun)`: see `jit`."""

  _clock = staticmethod(time.perf_counter)   # the gate's clock (seconds)

  def __init__(self, fun: Callable, jit_kwargs: dict, compare_raw: bool = True,
               compile_ahead: bool = True):
    for name, value in (("compare_raw", compare_raw), ("compile_ahead", compile_ahead)):
      if not isinstance(value, bool):
        raise TypeError(f"zipccl_jax.jit: {name} must be a bool, got {value!r}")
    if jit_kwargs.get("static_argnames"):
      raise ValueError("zipccl_jax.jit: static_argnames is not supported; use static_argnums")
    self._fun = fun
    self._compare_raw = compare_raw
    self._compile_ahead = compile_ahead
    self._jit_kwargs = dict(jit_kwargs)
    # Donation holds for the programs no re-run can need the inputs of (`_compresses`).
    self._donate = {k: self._jit_kwargs.pop(k) for k in ("donate_argnums", "donate_argnames")
                    if k in self._jit_kwargs}
    self._static = tuple(np.atleast_1d(jit_kwargs.get("static_argnums", ())).tolist())
    self._ledger = next(_ledgers)
    self._states: dict = {}
    self._exchanges = exchange_lib.Exchanges(self._ledger)
    self._loaded: dict = {}
    self._last_state: _State | None = None   # the last call's
    self._armed: _State | None = None   # the state whose raw words `_fast_step` tries
    self.__wrapped__ = fun
    self.__name__ = getattr(fun, "__name__", "planned")
    self.__doc__ = getattr(fun, "__doc__", None)

  # ---- programs -------------------------------------------------------------------------------

  def _state_for(self, args, kwargs) -> _State:
    """The state of these arguments' signature, with their layout (`_State.layout`:
    the programs' key beside the plan) as of this call."""
    key, layout = programs_lib.signature(args, kwargs, self._static)
    state = self._state(key)
    state.layout = layout
    return state

  def _jitted(self, plan, trace: Trace):
    """jax.jit of `fun` traced under `plan` (its sites registered into `trace`)."""
    def traced(*args, **kwargs):
      if getattr(_fast, "on", False):
        raise _Retrace()   # a fast step traces nothing: it takes the slow path
      with tracing(trace):
        return self._fun(*args, **kwargs)

    traced.__name__ = self.__name__
    donate = {} if _compresses(plan) else self._donate
    return jax.jit(traced, **self._jit_kwargs, **donate)

  def _build(self, plan, args, kwargs) -> programs_lib.Program:
    """Traces, lowers and compiles the program of `plan` (on any thread)."""
    trace = Trace(self._ledger, plan)
    start = time.perf_counter()
    jitted = self._jitted(plan, trace)
    compiled = jitted.lower(*args, **kwargs).compile()
    return programs_lib.Program(compiled, list(trace.sites), time.perf_counter() - start, jitted)

  def _specs(self, args, kwargs) -> tuple:
    """The arguments as a compile ahead takes them (`planned_programs.spec`)."""
    return (tuple(a if i in self._static else jax.tree.map(programs_lib.spec, a)
                  for i, a in enumerate(args)), jax.tree.map(programs_lib.spec, kwargs))

  def _call(self, program: programs_lib.Program, args, kwargs):
    return program.call(*[a for i, a in enumerate(args) if i not in self._static], **kwargs)

  def _checked(self, state: _State, plan, args, kwargs) -> tuple[programs_lib.Program, bool]:
    """(the program of `plan`, whether it was built now, on this thread). Before its
    first run, the processes compare what they traced (sites and plan): processes
    whose programs differ would issue collectives of different sizes, which gloo
    aborts on and NCCL may hang in, so they must fail here, on every process, before
    any runs."""
    key = (plan, state.layout)
    compared = plan not in state.checked
    # a build here, before the comparison: others' failed builds end its trace's
    # waits (`failed_elsewhere`)
    watch = (compat.exchanges_watched(lambda: self._exchanges.failed_elsewhere(self.__name__))
             if compared else contextlib.nullcontext())
    try:
      with watch:
        program, built = state.programs.get(key, lambda: self._build(plan, args, kwargs))
    except Exception as e:
      # a build that failed here only (a compile out of memory), or stopped because
      # others' failed: the others are about to compare programs with this one
      if compared:
        self._exchanges.stopped(e)
      raise
    if compared:
      self._exchanges.compare_programs(self.__name__, program.sites, plan)
      state.checked.add(plan)
    state.sites = list(program.sites)
    return program, built

  def _state(self, key) -> _State:
    state = self._states.get(key)
    if state is None:
      state = self._states[key] = _State()
      loaded = self._loaded.pop(programs_lib.key_text(key), None)
      if loaded is not None:
        state.sites, state.plan = loaded
    return state

  def lower(self, *args, **kwargs):
    """Lowers the program of the plan for these arguments, like `jax.jit(fun).lower`:
    the one the next call runs, or the one compiling ahead (which the calls take once
    every process holds it); the measuring program before a plan exists."""
    plan = self._plan_ahead(self._state_for(args, kwargs))
    return self._jitted(plan, Trace(self._ledger, plan)).lower(*args, **kwargs)

  def compiled(self, *args, **kwargs):
    """The compiled program of the plan for these arguments (as `lower` chooses it;
    one compiling ahead is waited for). Its `as_text()` is the HLO, e.g. for
    `hlo_wire_bytes`."""
    state = self._state_for(args, kwargs)
    return self._checked(state, self._plan_ahead(state), args, kwargs)[0].call

  @staticmethod
  def _plan_ahead(state: _State):
    return state.next if state.next is not None else state.plan

  # ---- one step -------------------------------------------------------------------------------

  def __call__(self, *args, **kwargs):
    if self._armed is not None:
      out = self._fast_step(self._armed, args, kwargs)
      if out is not None:
        return out[0]
    state = self._state_for(args, kwargs)
    armable, self._last_state = state is self._last_state, state
    if state.next is not None and (state.next_ready or state.next_failed):
      self._switch(state, args, kwargs)
    plan = state.plan
    if plan is None:
      return self._measure(state, args, kwargs)
    compressed = _compresses(plan)
    program = state.gate.next() if compressed and self._compare_raw else gate_lib.PLANNED
    timed = compressed and self._compare_raw and state.gate.phase is not None
    start = self._clock() if timed else 0.0
    if program == gate_lib.RAW:
      raw = (RAW,) * len(plan)
      run = self._checked(state, raw, args, kwargs)[0]
      out, ran = self._call(run, args, kwargs), RAW
      if timed:
        jax.block_until_ready(out)
      elif armable:
        self._arm(state, run)
    elif state.remeasure:
      out, ran = self._probe(state, args, kwargs), None
    elif compressed:
      out, ran = self._planned_step(state, plan, args, kwargs), plan
    else:
      # Nothing to validate: raw sites move every word and decode nothing, so no row
      # can outgrow a slot or fail to decode. The step returns unvalidated, as from
      # jax.jit (no host read, no exchange, not waited for); it counts towards the
      # next probe of the raw sites (`_replan_from_window`), a step every process
      # takes at the same count.
      run = self._checked(state, plan, args, kwargs)[0]
      out = self._call(run, args, kwargs)
      self._counted_raw_plan_step(state, args, kwargs)
      if armable:
        self._arm(state, run)
    if timed and state.gate.timed(self._clock() - start, ran):
      self._decide(state.gate)
    return out

  def _arm(self, state: _State, program: programs_lib.Program) -> None:
    """The next call tries `_fast_step` with `program`'s raw words (a step of the
    same signature as the two before it ran them)."""
    state.fast, self._armed = program.jitted, state

  def _fast_step(self, state: _State, args, kwargs):
    """(outputs,) of a step of raw words dispatched by jax.jit's own C++ path, or None
    when the step is another kind (a comparison, a probe, a switch to a plan built
    ahead) or the arguments are not the signature the program was compiled for.

    Why: the wrapper's own work per call (`planned_programs.signature`, dispatch in
    Python) took 0.35-0.55 ms a call inside the MoE example's training loop, ~1% of
    its step, and a step of raw words has nothing to validate. jax.jit checks the
    arguments itself (shapes, dtypes, weak types, shardings, static arguments) and
    traces again on any difference: that trace raises `_Retrace` at once, nothing
    runs, and the call takes the slow path. The bookkeeping is the slow path's for
    the same step."""
    compressed = _compresses(state.plan)
    if (state.fast is None or state.next is not None or state.remeasure
        or (compressed and not state.gate.raw_untimed_next())):
      return None
    _fast.on = True
    try:
      out = state.fast(*args, **kwargs)
    except _Retrace:
      self._armed = None
      return None
    finally:
      _fast.on = False
    if compressed:
      state.gate.next()   # the chosen raw words, counted towards the next comparison
    else:
      self._counted_raw_plan_step(state, args, kwargs)
    return (out,)

  def _counted_raw_plan_step(self, state: _State, args, kwargs) -> None:
    """After a step of a plan of raw sites: counted towards the next probe of those
    sites (`_replan_from_window`, with no size: raw sites record none)."""
    state.count_sites()
    self._replan_from_window(state, [-1] * len(state.plan), args, kwargs)

  def _adopt(self, state: _State, plan: tuple, args, kwargs, *, meanwhile: str = "plan") -> None:
    """Makes `plan` the plan of the next steps: at once when its program is built or
    cannot be built ahead, else once every process holds it, built ahead
    (planned_programs.py; `_switch`). The steps meanwhile run the current plan
    (meanwhile="plan") or the measuring program ("measure": the current plan
    overflowed)."""
    runs = state.plan if meanwhile == "plan" else None
    # the switch is agreed in the exchange of the steps meanwhile, which a plan of
    # raw sites only does not make
    agreed = runs is None or _compresses(runs)
    key = (plan, state.layout)
    if plan == state.plan or not (self._compile_ahead and agreed) or state.programs.built(key):
      state.next = None
      state.new_plan(plan)
      return
    args, kwargs = self._specs(args, kwargs)
    state.programs.ahead(key, lambda: self._build(plan, args, kwargs))
    state.next, state.next_key, state.next_ready, state.next_failed = plan, key, False, []
    # the steps' own mean time so far under the program that runs on: what the
    # steps during the compile took beyond it is its cost (`_switch`)
    same = meanwhile == "plan" and state.own_window_n > 0
    state.ahead_base_s = state.own_window_s / state.own_window_n if same else None
    state.ahead_cost_s = 0.0
    if runs is None:
      state.plan = None
    state.new_window()

  def _switch(self, state: _State, args, kwargs) -> None:
    """Every process holds the program of the plan built ahead: the steps take it from
    this one on. The cost of its compile to the steps (the ski-rental rule's, in
    `_replan_from_window`) is what the steps since it started took beyond their mean
    time before it, when measured, else the last such cost, else its build time."""
    if state.next_failed:
      # every process stops at this step: the ones whose build failed with its error
      # (`Programs.get` raises it), the others naming them (they would wait for them
      # in the next exchange)
      if state.programs.failed(state.next_key):
        state.programs.get(state.next_key, None)
      raise RuntimeError(
          f"zipccl_jax.jit: the program of a new plan for {self.__name__} failed to build "
          f"ahead on process(es) {state.next_failed} (the error is raised there); every "
          "process stops at this step")
    plan, state.next = state.next, None
    program, built = self._checked(state, plan, args, kwargs)
    if built or (state.ahead_base_s is None and not state.cost_measured):
      state.own_compile_s = program.build_s
    elif state.ahead_base_s is not None:
      state.own_compile_s, state.cost_measured = state.ahead_cost_s, True
    # else: the last measured cost stands (the steps during this compile ran another
    # program: an overflow's measuring steps)
    state.new_plan(plan)
    if self._compare_raw and _compresses(plan):
      # the raw-words program the gate's first comparison runs (planned_gate.py), ahead
      # too: built when that step needs it, it stalled the step for a whole compile.
      # Each process waits for its own there (`Programs.get`): nothing to agree on.
      raw = (RAW,) * len(plan)
      specs = self._specs(args, kwargs)
      state.programs.ahead((raw, state.layout),
                           lambda: self._build(raw, *specs))

  def _decide(self, gate: gate_lib.Gate) -> None:
    """Ends a comparison of the plan with raw words: the same decision on every
    process, from every process's numbers (planned_gate.py)."""
    mine = gate.mine()
    blobs = self._exchanges.blobs(np.asarray(mine, np.float64))
    gate.decide([mine] if blobs is None else [np.frombuffer(b, np.float64) for b in blobs])

  def _measure(self, state: _State, args, kwargs):
    """One of the first MEASURE_STEPS steps: the measuring program (raw moves, exact);
    after the last, the first plan from their sizes (`window_target`)."""
    out, used, _ = self._run(state, None, args, kwargs)
    state.count_sites()
    if state.next is not None:   # a plan is compiling ahead
      return out
    if not state.sites:
      # No compressed call site (codec="raw" throughout, say): the measuring program
      # is the program of the empty plan, the same trace, so it is taken as such at
      # once. Measuring on would run MEASURE_STEPS waited steps with an exchange
      # each, then compile that program again. Every process decides alike: the
      # step's exchange checked that they all traced no site.
      state.programs.share((None, state.layout), ((), state.layout))
      self._adopt(state, (), args, kwargs)
      return out
    state.window.append(used[:len(state.sites)])
    if len(state.window) < slots.MEASURE_STEPS:
      return out
    plan = []
    for k, (_, rungs, _) in enumerate(state.sites):
      sizes = [u[k] for u in state.window if u[k] >= 0]
      if not sizes:
        plan.append(RAW)
        continue
      top, headroom = window_target(sizes, HEADROOM)
      plan.append(_slot_for(top, rungs, max(HEADROOM, headroom)))
    self._adopt(state, tuple(plan), args, kwargs)
    return out

  def _planned_step(self, state: _State, plan, args, kwargs):
    """One validated step of `plan` (which has a compressed site)."""
    out, used, bad = self._run(state, plan, args, kwargs)
    n = state.count_sites()
    over = [k for k in range(n) if plan[k] != RAW and used[k] >= 0 and used[k] * _ALIGN > plan[k]]
    if not over:
      failed = [k for k in range(n) if bad[k] > 0]
      if failed:
        raise RuntimeError(
            f"zipccl_jax.jit: {len(failed)} call site(s) of {self.__name__} received rows that "
            f"failed to decode although they fit their slots (sites {failed[:8]}): the payload "
            "was corrupted in transit. The step's outputs are discarded.")
      self._replan_from_window(state, used, args, kwargs)
      return out
    # Some rows outgrew their slots: the outputs are discarded. Sites after the first
    # overflow saw cut (NaN) rows, so their sizes in this step say nothing; the step
    # runs again as the measuring program (raw words: exact, and every site's true
    # used size), whose outputs are returned, and each site whose true size exceeds
    # its slot is re-planned with a larger headroom (HEADROOM above).
    out, used, _ = self._run(state, None, args, kwargs)
    grown = list(plan)
    for k in range(n):
      if plan[k] != RAW and used[k] * _ALIGN > plan[k]:
        excess = used[k] * _ALIGN / plan[k] - 1
        state.headroom[k] = min(MAX_HEADROOM, max(2 * state.headroom[k], excess))
        grown[k] = _slot_for(used[k], state.sites[k][1], state.headroom[k])
        state.replans[k] += 1
    self._adopt(state, self._grow_short(state, used, grown), args, kwargs, meanwhile="measure")
    return out

  @staticmethod
  def _grow_short(state: _State, used: list, new: list) -> tuple:
    """`new` (a plan that changes, so a compile is due anyway), with every other
    planned site whose headroom above the sizes just measured is short of its own
    grown to it: the compile it would cost later, and the re-run if it overflowed,
    are saved (early in training many sites drift upwards together)."""
    for k, (_, rungs, _) in enumerate(state.sites):
      if new[k] == RAW or new[k] != state.plan[k] or used[k] < 0:
        continue
      slot = _slot_for(used[k], rungs, state.headroom[k])
      if slot != RAW and slot > new[k]:
        new[k] = slot
        state.grows[k] += 1
    return tuple(new)

  def _probe(self, state: _State, args, kwargs):
    """One step as the measuring program (raw words: exact outputs), whose sizes give
    the sites planned raw a slot where they now fit one (data that grew compressible,
    e.g. gradients after the first steps)."""
    state.remeasure, state.windows_since_probe = False, 0
    out, used, _ = self._run(state, None, args, kwargs)
    new = list(state.plan)
    for k, (_, rungs, _) in enumerate(state.sites):
      if new[k] == RAW and used[k] >= 0:
        new[k] = _slot_for(used[k], rungs, state.headroom[k])
    if tuple(new) != state.plan:
      state.probe_every = 1
      self._adopt(state, self._grow_short(state, used, new), args, kwargs)
    else:
      state.probe_every *= 2
    return out

  def _replan_from_window(self, state: _State, used: list, args, kwargs) -> None:
    """After SHRINK_WINDOW fitting steps under one plan, each site's slot follows the
    window's sizes (`window_target`): it grows when less than half its headroom is
    left, and shrinks when the window needs a slot smaller by SHRINK_MIN x raw row
    (when nothing grows, once they pay for their compile: the ski-rental break-even
    of planned_slots.py)."""
    n = len(state.sites)
    if state.next is not None:   # a plan is compiling ahead: its window starts with it
      return
    state.window.append(used[:n])
    if len(state.window) < SHRINK_WINDOW:
      return
    plan, new, shrunk = state.plan, list(state.plan), {}
    for k, (_, rungs, raw_row) in enumerate(state.sites):
      sizes = [u[k] for u in state.window if u[k] >= 0]   # -1: the site did not run that step
      if plan[k] == RAW or not sizes:
        continue
      top, headroom = window_target(sizes, state.headroom[k])
      state.headroom[k] = headroom
      slot = _slot_for(top, rungs, headroom)
      if slot == RAW:
        continue
      if slot > plan[k] and top * _ALIGN * (1 + headroom / 2) > plan[k]:
        # less than half the headroom left: grow now, before a step overflows (an
        # overflow costs a re-run, a grow only the new plan's compile)
        new[k] = slot
        state.grows[k] += 1
      elif plan[k] - slot >= SHRINK_MIN * raw_row:
        shrunk[k] = slot
    if shrunk:
      # The step time the shrinks would have saved since they became due, this window
      # included (a window's: its steps' time x the share of the plan's bytes they
      # save), against the last compile's time. Agreed inputs: every process decides
      # alike.
      state.forgone_s += state.window_s * slots.saved_share(state.sites, plan, shrunk)
      if new != list(plan) or state.forgone_s >= state.compile_s:
        for k, slot in shrunk.items():
          new[k] = slot
          state.shrinks[k] += 1
    else:
      state.forgone_s = 0.0   # nothing pending (sizes rose again)
    self._adopt(state, tuple(new), args, kwargs)
    if RAW in state.plan:
      state.windows_since_probe += 1
      state.remeasure = state.windows_since_probe >= state.probe_every

  def _run(self, state: _State, plan, args, kwargs):
    """One run of the program of `plan`: (outputs, used sizes, decode statuses) per
    site, maxed over the devices and processes."""
    program, built = self._checked(state, plan, args, kwargs)
    start = time.perf_counter()
    out = self._call(program, args, kwargs)
    jax.block_until_ready(out)
    step_s = time.perf_counter() - start
    if built:   # built for this step: its trace, compile and one step
      state.own_compile_s = program.build_s + step_s
    else:
      state.own_window_s += step_s
      state.own_window_n += 1
      if state.next is not None and state.ahead_base_s is not None:
        state.ahead_cost_s += max(0.0, step_s - state.ahead_base_s)
    table = self._exchange(state, plan, _ffi.mailbox_take(self._ledger))
    n = len(state.sites)
    state.window_s, state.compile_s = (t * CLOCK_UNIT_S for t in table[2 * n:2 * n + 2])
    # every process holds the plan built ahead when none reported it missing
    state.next_ready = state.next is not None and table[2 * n + 2] == 0
    used = [table[2 * k] if 2 * k < len(table) else -1 for k in range(n)]
    bad = [table[2 * k + 1] if 2 * k + 1 < len(table) else -1 for k in range(n)]
    state.used = used
    return out, used, bad

  def _exchange(self, state: _State, plan, table: list) -> list:
    """The mailbox tables of every process (per site: used size, decode failures),
    then their clocks (the window's steps, the last compile; CLOCK_UNIT_S) and
    whether the plan compiling ahead is missing (1), held (0) or failed to build
    (2), maxed elementwise (the processes where it failed: `state.next_failed`);
    raises on every process when their sites or plans differ (they would move
    different collectives)."""
    n = len(state.sites or ())
    mine = np.full(5 + 2 * n, -1, np.int32)
    mine[0] = exchange_lib.fingerprint(state.sites or [], plan)
    mine[1] = n
    t = np.asarray(table[:2 * n], np.int32)
    mine[2:2 + t.size] = t
    mine[2 + 2 * n:4 + 2 * n] = [min(round(t / CLOCK_UNIT_S), 2**31 - 1)
                                 for t in (state.own_window_s, state.own_compile_s)]
    key = state.next_key
    mine[4 + 2 * n] = (0 if state.next is None else 2 if state.programs.failed(key)
                       else int(not state.programs.ready(key)))
    blobs = self._exchanges.blobs(mine)
    every = [mine] if blobs is None else [np.frombuffer(b, np.int32) for b in blobs]
    if blobs is not None:
      exchange_lib.check_same(self.__name__, every)
    if state.next is not None:
      state.next_failed = [p for p, e in enumerate(every) if e[4 + 2 * n] == 2]
    return np.max(np.stack(every), axis=0)[2:].tolist()


def jit(fun: Callable, *, compare_raw: bool = True, compile_ahead: bool = True,
        **jit_kwargs) -> Planned:
  """`jax.jit` with planned compressed collectives: no per-call agreement, no switch.

  Every compressed collective inside `fun` (at any depth: shard_map, grad, scan,
  vmap, remat, buckets) moves a static slot from a plan instead of the slot
  ladder: encode, cut to the planned slot, one XLA collective, decode. The first
  3 calls with given argument shapes measure (exact results, raw words on the
  wire; `is_planned` tells when they are done) and plan from the sizes they saw;
  later calls run the planned program and validate it after the step
  (one host read, plus one exchange between processes); a step whose rows did not
  fit is re-run with a grown plan, so results are always those of codec="raw".

  Args:
    fun: the step function, as for `jax.jit`.
    compare_raw: every so often, time up to 16 steps of the plan against 16 of raw
      words (which need no validation) and run the faster until the next
      comparison (`comparisons()`; docs/planned.md, "Planned or raw"). Results are
      those of codec="raw" either way. False: always the plan.
    compile_ahead: compile a new plan's program on a background thread while the
      steps go on with the program they run (the current plan, or the measuring
      program after an overflow), and switch every process to it at the same step
      once all hold it (docs/planned.md, "Compiling ahead"). `fun` is then traced on
      that thread, under the caller's thread-local jax settings (context managers
      such as `jax.default_device`); where those cannot be carried over, the
      program is built on the caller's thread when needed instead. False: every
      program is built when a step first needs it.
    **jit_kwargs: `jax.jit`'s keyword arguments. Donated arguments
      (donate_argnums / donate_argnames) are donated by the steps that cannot run
      again: the measuring steps (the first calls, re-runs, probes) and steps of raw
      words (the plan has no compressed site, or the comparison chose raw words).
      A step of a plan with a compressed site keeps them, for the re-run an
      overflow needs: its new state goes to fresh buffers, so the state is held
      twice during the step, and XLA:CPU reads it once more (docs/planned.md,
      "Contract"). A caller must treat donated arguments as consumed either way.

  Returns:
    A callable like `jax.jit(fun)`, with `.lower`, `.is_planned()`, `.site_stats()`,
    `.comparisons()`, `.building()`, `.save_plans(path)` and `.load_plans(path)`.
  """
  return Planned(fun, jit_kwargs, compare_raw, compile_ahead)
