"""What a `zipccl_jax.jit` function reports about its plans, and how they are saved and
loaded (`Planned`'s public methods beside calling it; docs/planned.md, "Plans" and
"Stats")."""
from __future__ import annotations

from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src import planned_io
from zipccl_jax._src import planned_programs as programs_lib
from zipccl_jax._src.planned_sites import RAW
from zipccl_jax._src.planned_state import SiteStats, State as _State

_ALIGN = ladder_lib.ALIGN


class Reports:
  """`Planned`'s reports and plan files (a mixin: it reads the wrapper's states)."""

  def _state_of(self, args, kwargs) -> _State | None:
    """The state of these arguments; with none, the last one created (None: no call yet)."""
    if args or kwargs:
      return self._state_for(args, kwargs)
    return list(self._states.values())[-1] if self._states else None

  def site_stats(self, *args, **kwargs) -> list:
    """Per call site of the program for these arguments (the last one called, with
    none): its slot, the last step's largest used size and its re-plans."""
    state = self._state_of(args, kwargs)
    if state is None or state.sites is None:
      return []
    out, plan = [], self._plan_ahead(state)
    for k, (sig, _, raw_row) in enumerate(state.sites):
      slot = plan[k] if plan is not None else RAW
      used = state.used[k] if state.used is not None and k < len(state.used) else -1
      out.append(SiteStats(k, sig, None if slot == RAW else slot,
                           None if used < 0 else used * _ALIGN, raw_row,
                           state.replans[k] if state.replans else 0,
                           state.shrinks[k] if state.shrinks else 0,
                           state.grows[k] if state.grows else 0))
    return out

  def is_planned(self, *args, **kwargs) -> bool:
    """Whether calls with these arguments have a plan in force: the next runs the plan,
    or raw words, not the measuring program (which runs while the first plan, or the
    plan grown after an overflow, is compiling ahead)."""
    return self._state_for(args, kwargs).plan is not None

  def building(self) -> bool:
    """Whether a program of this function is compiling ahead now (queued or running
    on the worker thread), for any argument shapes. Such a build takes a core from
    whatever else the process runs, e.g. the other models of a benchmark that trains
    several in lockstep (examples/harness.py leaves their steps out of its medians)."""
    return any(s.programs.building() for s in self._states.values())

  def comparisons(self, *args, **kwargs) -> list:
    """The timed comparisons between the plan and raw words (`planned_gate.Comparison`)
    for these arguments (the last ones called, with none), oldest first."""
    state = self._state_of(args, kwargs)
    return [] if state is None else list(state.gate.comparisons)

  def save_plans(self, path: str) -> None:
    """Writes every plan made so far (JSON, docs/planned.md "Plans"), so that a
    restart with `load_plans` starts planned; written atomically."""
    planned_io.save(path, self.__name__,
                    [(programs_lib.key_text(k), s.sites, plan)
                     for k, s in self._states.items()
                     if (plan := self._plan_ahead(s)) is not None and s.sites is not None])

  def load_plans(self, path: str) -> int:
    """Reads plans written by `save_plans`; each is used by the first call with the
    same argument shapes whose traced sites match it (else that call measures).
    Returns how many plans were read. ValueError naming the file when malformed."""
    loaded = planned_io.load(path)
    self._loaded.update(loaded)
    return len(loaded)
