"""What `zipccl_jax.jit` keeps per argument signature (`State`: the sites, the plan in
force and the one compiling ahead, the window of sizes, the clocks, the programs) and
what it reports per call site (`SiteStats`). planned.py drives both."""
from __future__ import annotations

import dataclasses

from zipccl_jax._src import planned_gate as gate_lib
from zipccl_jax._src import planned_programs as programs_lib
from zipccl_jax._src.planned_slots import HEADROOM


@dataclasses.dataclass
class SiteStats:
  """One call site of a `zipccl_jax.jit` function (`Planned.site_stats`).

  Attributes:
    site: index in trace order.
    signature: (collective, codec, dtype, rows shape, chunk, check decode, rows on the
      wire: `planned_sites.wire_rows`) of the site.
    slot_bytes: the planned slot per row (None: raw), of the newest plan: the one the
      calls run, or the one compiling ahead that they will.
    used_bytes: the largest used size of a row in the last step (over all processes).
    raw_bytes: the raw row size.
    replans: how often the site's plan grew after a step did not fit it.
    shrinks: how often it shrank after a window of steps that needed less.
    grows: how often it grew after a window of steps that came close to its slot
      (before any step overflowed).
  """
  site: int
  signature: tuple
  slot_bytes: int | None
  used_bytes: int | None
  raw_bytes: int
  replans: int
  shrinks: int = 0
  grows: int = 0


class State:
  """Per argument signature: the sites, the plan, the compiled programs."""

  def __init__(self):
    self.sites: list | None = None
    self.plan: tuple | None = None
    self.used: list | None = None
    self.replans: list | None = None
    self.shrinks: list | None = None
    self.grows: list | None = None
    self.headroom: list | None = None   # per site: the headroom of its next (re-)plan
    self.window: list = []   # per step since the plan changed: the used sizes per site
    # sites planned raw (incompressible when measured) are measured again, by one
    # step of the measuring program, after probe_every windows (doubling while a
    # probe finds none that compresses)
    self.remeasure = False
    self.probe_every = 1
    self.windows_since_probe = 0
    self.programs = programs_lib.Programs()
    self.layout: tuple = ()   # the last call's argument layout (planned_programs.signature)
    self.checked: set = set()   # plans whose program the processes compared (`_checked`)
    # A plan compiling ahead (planned_programs.py), whether every process holds its
    # program and the processes where its build failed (both agreed in the step's
    # exchange); the steps meanwhile run `plan`,
    # or the measuring program (plan None). ahead_base_s: a step's own time before
    # the compile started, ahead_cost_s what the steps since took beyond it (the
    # compile's cost to the steps: `_switch`); None: not measured (the steps
    # meanwhile run another program). cost_measured: own_compile_s is such a cost.
    self.next: tuple | None = None
    self.next_key = None   # its program's key in `programs`
    self.next_ready = False
    self.next_failed: list = []
    self.ahead_base_s: float | None = None
    self.ahead_cost_s = 0.0
    self.cost_measured = False
    # seconds: this process's clocks, and the largest over the processes (agreed in
    # the step's exchange, in CLOCK_UNIT_S), from which every process decides alike
    self.own_window_s = 0.0
    self.own_window_n = 0    # the steps own_window_s sums
    self.own_compile_s = 0.0
    self.compile_s = 0.0   # the first run of the last new program (trace, compile, one step)
    self.window_s = 0.0    # the steps of the current window, call to validated outputs
    self.forgone_s = 0.0   # the step time the pending shrinks would have saved
    self.gate = gate_lib.Gate()   # planned or raw words, timed (planned_gate.py)
    self.fast = None   # the jax.jit of the raw words the last step ran (`Planned._fast_step`)

  def count_sites(self) -> int:
    """The number of sites, with the per-site counters (re-plans, shrinks, grows,
    headroom) sized to it (fresh after a trace that found other sites)."""
    n = len(self.sites)
    if self.replans is None or len(self.replans) != n:
      self.replans, self.shrinks, self.grows, self.headroom = [0] * n, [0] * n, [0] * n, [HEADROOM] * n
    return n

  def new_window(self) -> None:
    """Starts a window of sizes (`Planned._replan_from_window`)."""
    self.window = []
    self.window_s = self.own_window_s = 0.0
    self.own_window_n = 0

  def new_plan(self, plan: tuple) -> None:
    """Takes `plan`, with a window of its own and no shrink pending."""
    if plan != self.plan:
      self.forgone_s = 0.0
    self.plan = plan
    self.new_window()
