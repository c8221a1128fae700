"""How a plan's slots follow the sizes its call sites use (planned.py; docs/planned.md,
"Following the sizes"): the first plan's headroom, a window's target, and what a
shrink saves. Sizes are in units of ladder.ALIGN (128) bytes as the mailbox records
them, slots in bytes; RAW (-1) is a site that moves raw words.
"""
from __future__ import annotations

import math

from zipccl_jax._src.ladder import ALIGN
from zipccl_jax._src.planned_sites import RAW

# A plan's slot is the first multiple of ALIGN >= used x (1 + HEADROOM). Row sizes
# move by ~0.3% (median) to ~2% (p99) from step to step on training tensors, so 2%
# above the used size needs re-plans rarely. A site that overflows proved more
# volatile (early training: MoE activations grew 16%, then 9% and 6% in 25 steps):
# its headroom doubles, and is at least the excess just seen, up to MAX_HEADROOM; it
# halves with each window the site then fits (`Planned._replan_from_window`).
HEADROOM = 0.02
MAX_HEADROOM = 0.25
# The first plan comes from MEASURE_STEPS steps of the measuring program (raw words
# on the wire), not one: one step's sizes say nothing of how they move, and early in
# training they drift (the examples' sites rose 2-4% in their first 20 steps, which
# one step plus HEADROOM missed: 7 re-runs in three 200-step runs). Three steps give
# the spread and a trend (the rise from the first step to the mean of the next two)
# that `window_target` turns into headroom: 2 re-runs in the same runs, for the same
# bytes within 1% (benchmarks/plan_replay.py).
MEASURE_STEPS = 3
# Sizes drift during training (gradients early on grow less compressible, later
# more), so after SHRINK_WINDOW steps without an overflow each site's slot follows
# the window's sizes (planned.py, `Planned._replan_from_window`): it grows before it overflows, or
# shrinks when that saves at least SHRINK_MIN of its raw row (no re-run; a new plan
# compiles once, and every plan stays cached). SHRINK_MIN bounds the compiles a site
# that settles costs.
SHRINK_WINDOW = 25
SHRINK_MIN = 0.01
# A shrink (a plan change that only saves bytes) compiles the whole step again: 4.5 s
# for the MoE example's step on one core, the time of 150 of its steps, while it
# saves a few % of the bytes for as long as the run goes on, which nobody knows.
# That is the ski-rental problem, and its break-even rule is used (`Planned._replan_from_window`):
# a window's shrinks wait until the step time they would have saved since they
# became due reaches the last compile's time, so the compiles shrinks cause cost at
# most twice what the best choice in hindsight costs (for a saving that holds
# steady). A step's saving is estimated as its time x the share of the plan's bytes
# the shrinks save: exact for a step the wire dominates, an upper bound otherwise.
# A window that grows a site (which heads off an overflow: a compile and a re-run)
# compiles anyway, and its shrinks go with it.
WINDOW_HEADROOM = 0.01   # the least headroom above a window's largest size (`window_target`)


def slot_for(used_units: int, rungs: tuple, headroom: float) -> int:
  """The slot for a used size: the first multiple of ALIGN >= used size x (1 +
  headroom), within the site's ladder (`planned_sites.fits`); near its top (a row
  that barely compresses) the top rung when it holds the used size; else RAW.

  Any multiple of ALIGN, not only the ladder's rungs: a planned program holds one
  slot, not a switch over the rungs, so rounding up to the next rung (0.5-2.5% on
  the rungs' 1-5% spacing) would be bytes on the wire for nothing."""
  # never ran (a trace the program did not keep), or no compressed slot at all
  if used_units < 0 or not rungs:
    return RAW
  used = used_units * ALIGN
  if used > rungs[-1]:
    return RAW
  want = math.ceil(used * (1 + headroom) / ALIGN) * ALIGN
  return max(rungs[0], min(want, rungs[-1]))


def window_target(sizes: list, headroom: float) -> tuple[int, float]:
  """(the window's largest size, the headroom of the slot that follows it) for one
  site's used sizes over a window of fitting steps, given the site's own headroom.

  The headroom above the window's maximum is at least
  - WINDOW_HEADROOM (the maximum of the window's steps already covers the sizes seen,
    which the first plan's HEADROOM, from one step, does not);
  - half the site's own: an overflow's doubled headroom estimates the sizes'
    volatility and fades by half with each window that fits;
  - the standard deviation of the window's sizes over its maximum: a next step
    above max + 1 sd is rare (~0.1% per step for normal sizes, whose maximum over 25
    steps lies ~2 sd above their mean);
  - twice the window's trend when it rose: the rise of the second half's mean over
    the first half's, doubled to a whole window (gradients grow less compressible for
    hundreds of steps: the slot covers the next window's rise twice). Means of
    halves, not the window's two ends: a difference of two single steps is mostly
    their noise (1.4 sd), which made noisy sites keep slots ~4% too large.
  At most MAX_HEADROOM."""
  top = max(sizes)
  mean = sum(sizes) / len(sizes)
  sd = (sum((u - mean) ** 2 for u in sizes) / len(sizes)) ** 0.5
  half = len(sizes) // 2
  trend = 0.0
  if half:
    first, second = sum(sizes[:half]) / half, sum(sizes[half:]) / (len(sizes) - half)
    trend = max(0.0, 2 * (second / max(first, 1) - 1))
  return top, min(MAX_HEADROOM, max(WINDOW_HEADROOM, headroom / 2, sd / max(top, 1), 2 * trend))


def saved_share(sites: list, plan: tuple, shrunk: dict) -> float:
  """The share of `plan`'s wire bytes the shrinks `shrunk` (site -> smaller slot)
  save; a site's bytes are its slot (its raw row when raw) x the rows it puts on
  the links (the last field of its signature: `planned_sites.wire_rows`)."""
  rows = [sig[-1] for sig, _, _ in sites]
  sent = sum(r * (raw_row if p == RAW else p) for r, p, (_, _, raw_row) in zip(rows, plan, sites))
  saved = sum(rows[k] * (plan[k] - slot) for k, slot in shrunk.items())
  return saved / max(sent, 1)
