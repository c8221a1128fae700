"""Planned or raw: the timed comparison `zipccl_jax.jit` makes between its plan and
raw words (docs/planned.md, "Planned or raw").

A planned step pays for its validation on the host: the host waits for the step's
outputs, reads the mailbox and, between processes, makes one exchange through the
coordinator (0.7-3 ms for 2-8 processes), and it cannot dispatch the next step while
it waits. A step whose plan has no compressed site validates nothing, returns as
from jax.jit and takes the donated arguments. So a plan whose compressed sites save
less wire time per step than validation costs is slower than raw words (a MoE step
over 1 Gbit/s: one compressed site saving ~0.4 ms against 1.5-3 ms of exchange).
What a plan saves depends on the link, the codecs' speed on this machine and the
data, none of which the wrapper can know without a calibration, so it measures both
and runs the faster until the next comparison.

A comparison is PAIRS pairs of steps, a step of the plan then a step of raw words,
so that both see the same load of a shared machine (a step's time varies by 10-20%
from step to step there, and drifts over tens of steps). Each of its steps waits
for its outputs, and its time is its own: from the call to the return (validated),
so the caller's work between steps does not count (under a benchmark that trains
several models in lockstep, the others' steps), and neither does the overlap of an
unwaited raw step with the caller's next work (a loop that reads its loss every step
has none). The first pair is left out (the raw program may compile in it), and so is
a pair whose plan step ran another plan than the pair before (a re-plan compiled).
Each process takes the median over its pairs of (plan step - raw step), and the
processes exchange it: the plan runs on if the mean over the processes is below
zero, else raw words (ties go to raw words, which need no validation). Every process
takes the same decision from the same exchanged numbers.

A comparison costs its steps of the slower program: 16 raw steps of a data-parallel
step over 1 Gbit/s were ~2 s (130 ms each). So it stops early, after EARLY_PAIRS
pairs, when every valid pair of every process has the same sign (a sign test: with
no difference, 7 pairs agree by chance with probability 2 / 2^7 = 1.6% on one
process), or when the median of the pairs so far (the mean over the processes)
favours the program that runs now: keeping it needs less evidence than a flip, since
a wrong keep costs what the steps differ by until the next comparison, while a flip
also restarts the schedule (more comparisons). The processes exchange their numbers
there too, so they stop alike. On a noisy step whose decision holds (the MoE
example's over 1 Gbit/s: steps varying by +-15%, nearly every comparison keeping
raw words) that halves the steps its comparisons take.

Schedule (steps of the function with given argument shapes): the first comparison
starts after FIRST_COMPARE steps of the first plan; while the decision stays the
same, the gap to the next comparison doubles, up to MAX_COMPARE; when it flips, the
gap starts again at FIRST_COMPARE (a wrong decision taken on a noisy machine is
undone soon). The plan timed after a stretch of raw words is the one it left: its
program is compiled and cached (a fresh plan from fresh sizes would compile anew at
each comparison: 4.5 s for the MoE example's step, the time of 150 of its steps), and
a row that outgrew it re-plans as on any planned step.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import NamedTuple

PLANNED = "planned"
RAW = "raw"

# 16 pairs (32 steps): the median of 15 paired differences, which one burst of load
# does not move.
PAIRS = 16
EARLY_PAIRS = 8      # the sign test's checkpoint (no early stop when >= PAIRS)
FIRST_COMPARE = 25   # the first comparison follows the first plan's window
MAX_COMPARE = 1600


class Comparison(NamedTuple):
  """One decision between the plan and raw words (`Planned.comparisons`).

  Attributes:
    step: the function's call (with these argument shapes) that ended the comparison.
    planned_s: seconds per planned step (median over the pairs, mean over processes).
    raw_s: seconds per raw step, alike.
    difference_s: planned - raw seconds per step, the median over the pairs (mean
      over processes): what decides (below zero: the plan). Its sign can differ from
      planned_s - raw_s's, the difference of two medians.
    chosen: PLANNED or RAW, what the steps run until the next comparison.
  """
  step: int
  planned_s: float
  raw_s: float
  difference_s: float
  chosen: str


@dataclasses.dataclass
class Gate:
  """The comparison's state for one argument signature (see the module docstring)."""
  chosen: str = PLANNED
  # steps of the chosen program before the next comparison (read when made: tests set it)
  every: int = dataclasses.field(default_factory=lambda: FIRST_COMPARE)
  count: int = 0                  # steps of the chosen program since the last decision
  k: int = -1                     # the step of the comparison in progress; -1: none
  times: list = dataclasses.field(default_factory=list)   # (seconds, program) per step
  steps: int = 0
  comparisons: list = dataclasses.field(default_factory=list)

  @property
  def phase(self) -> str | None:
    """The program of the comparison's current step (PLANNED, RAW), or None: the step
    is not timed."""
    return None if self.k < 0 else (PLANNED, RAW)[self.k % 2]

  def next(self) -> str:
    """The program of the next step: PLANNED or RAW."""
    self.steps += 1
    if self.k < 0:
      if self.count < self.every:
        self.count += 1
        return self.chosen
      self.k, self.times = 0, []
    else:
      self.k += 1
    return self.phase

  def raw_untimed_next(self) -> bool:
    """Whether `next` would return RAW outside a comparison: a step of the chosen raw
    words, not timed (`Planned._fast_step` may dispatch it)."""
    return self.chosen == RAW and self.k < 0 and self.count < self.every

  def timed(self, seconds: float, program) -> bool:
    """Records that the comparison's step took `seconds` (waited for) and ran
    `program` (its plan; None: the measuring program). True when the comparison is
    complete: the caller exchanges `mine()` among the processes and calls `decide`."""
    self.times.append((seconds, program))
    return len(self.times) in (2 * PAIRS, 2 * EARLY_PAIRS)

  def mine(self) -> tuple[float, float, float, float]:
    """This process's (median of plan - raw, median plan, median raw, sign) seconds
    per step over the comparison's valid pairs, sign = +1 / -1 when every pair's
    difference is positive / negative, else 0; NaN and 0 when no pair is valid."""
    planned, raw = self.times[0::2], self.times[1::2]
    pairs = [(planned[i][0], raw[i][0]) for i in range(1, len(raw))
             if planned[i][1] is not None and planned[i][1] == planned[i - 1][1]]
    if not pairs:
      return float("nan"), float("nan"), float("nan"), 0.0
    diffs = [p - r for p, r in pairs]
    sign = 1.0 if min(diffs) > 0 else -1.0 if max(diffs) < 0 else 0.0
    return (statistics.median(diffs), statistics.median(p for p, _ in pairs),
            statistics.median(r for _, r in pairs), sign)

  def decide(self, every: list) -> str | None:
    """The program to run until the next comparison, from every process's `mine()`;
    None at the early checkpoint when the processes' pairs neither all agree in sign
    nor favour the program that runs now (the comparison goes on). A comparison
    without a valid pair (the plan changed in every pair) keeps the current choice
    and compares again after FIRST_COMPARE steps."""
    diff, planned_s, raw_s = (statistics.fmean(float(t[i]) for t in every) for i in range(3))
    if EARLY_PAIRS < PAIRS and len(self.times) == 2 * EARLY_PAIRS:
      unanimous = {float(t[3]) for t in every} in ({1.0}, {-1.0})
      keeps = diff == diff and _faster(diff) == self.chosen   # diff NaN: no valid pair yet
      if not (unanimous or keeps):
        return None
    self.k, self.count = -1, 0
    if diff != diff:   # NaN: no valid pair anywhere
      self.every = FIRST_COMPARE
      return self.chosen
    chosen = _faster(diff)
    self.every = min(MAX_COMPARE, 2 * self.every) if chosen == self.chosen else FIRST_COMPARE
    self.chosen = chosen
    self.comparisons.append(Comparison(self.steps, planned_s, raw_s, diff, chosen))
    return chosen


def _faster(diff: float) -> str:
  """The program a paired difference (plan - raw seconds) favours; ties go to raw
  words, which need no validation."""
  return PLANNED if diff < 0 else RAW
