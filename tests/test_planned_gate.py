"""zipccl_jax.jit's timed comparison of its plan with raw words (planned_gate.py):
the gate on scripted step times, and the wrapper on a scripted clock, every step
equal to codec="raw"."""
import functools

import jax
import pytest

import zipccl_jax as zc
from tests.gate_clock import phase_clock
from tests.test_planned import _assert_all_equal, _five, _gauss
from zipccl_jax._src import planned_slots


@pytest.fixture(autouse=True)
def _one_measuring_step(monkeypatch):
  """The wrapper's steps are scripted from the plan of one measuring step. Plans take effect
  at the next step, built when it needs them (compiling ahead: test_planned_ahead.py)."""
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", 1)
  monkeypatch.setattr(zc, "jit", functools.partial(zc.jit, compile_ahead=False))


def test_the_gate_times_both_programs_and_keeps_the_faster(monkeypatch):
  """planned_gate.Gate on scripted step times: after FIRST_COMPARE steps of the
  chosen program, PAIRS pairs (a step of the plan, a step of raw words), or
  EARLY_PAIRS when every pair agrees in sign or their median favours the program
  running; the first pair and pairs whose plan
  changed are left out; the gap doubles while the decision holds and starts again
  when it flips."""
  from zipccl_jax._src import planned_gate as g
  monkeypatch.setattr(g, "PAIRS", 3)
  monkeypatch.setattr(g, "FIRST_COMPARE", 2)
  monkeypatch.setattr(g, "MAX_COMPARE", 4)
  P, R = g.PLANNED, g.RAW

  def steps(gate, n, cost, plan=lambda i: ("plan",)):
    got = []
    for i in range(n):
      p = gate.next()
      if gate.phase is not None and gate.timed(cost[p], plan(i) if p == P else ("raw",)):
        gate.decide([gate.mine()])
      got.append(p)
    return got

  gate, cost = g.Gate(), {P: 2.0, R: 1.0}
  assert steps(gate, 8, cost) == [P, P] + [P, R] * 3
  assert gate.comparisons == [g.Comparison(8, 2.0, 1.0, 1.0, R)] and gate.every == 2
  assert steps(gate, 8, cost) == [R, R] + [P, R] * 3           # the same: the gap doubles
  assert gate.comparisons[-1].chosen == R and gate.every == 4
  cost[P] = 0.5
  assert steps(gate, 10, cost) == [R] * 4 + [P, R] * 3         # flips: the gap starts again
  assert gate.comparisons[-1] == g.Comparison(26, 0.5, 1.0, -0.5, P) and gate.every == 2
  # a plan that changes in every pair: no valid pair, no decision, compared again soon
  other = g.Gate()
  steps(other, 8, {P: 2.0, R: 1.0}, plan=lambda i: ("plan", i))
  assert other.comparisons == [] and other.chosen == P and other.phase is None
  # processes: the mean of their paired differences decides; ties go to raw words
  assert g.Gate().decide([(1.0, 2.0, 1.0, 0.0), (-3.0, 1.0, 4.0, 0.0)]) == P
  assert g.Gate().decide([(0.0, 1.0, 1.0, 0.0)]) == R
  # the early checkpoint (EARLY_PAIRS pairs): stops when every process's every pair
  # agrees in sign, else the comparison goes on to PAIRS pairs
  monkeypatch.setattr(g, "EARLY_PAIRS", 2)
  gate, cost = g.Gate(), {P: 2.0, R: 1.0}
  assert steps(gate, 6, cost) == [P, P] + [P, R] * 2
  assert gate.comparisons == [g.Comparison(6, 2.0, 1.0, 1.0, R)]
  def noisy(chosen):
    gate = g.Gate(chosen=chosen)
    gate.times = [(2.0, ("plan",)), (1.0, ("raw",)), (2.0, ("plan",)), (1.0, ("raw",))]
    return gate

  # or when the pairs' median (the mean over processes) favours the program running
  # now: keeping it needs less evidence than a flip
  split = [(1.0, 2.0, 1.0, 1.0), (-1.0, 1.0, 2.0, -1.0)]   # mean 0: raw words (ties)
  gate = noisy(P)
  assert gate.decide(split) is None and gate.comparisons == []
  gate = noisy(R)
  assert gate.decide(split) == R and gate.comparisons == [g.Comparison(0, 1.5, 1.5, 0.0, R)]
  assert noisy(P).decide([(-0.5, 1.0, 1.5, 0.0), (-0.5, 1.0, 1.5, 0.0)]) == P
  assert noisy(R).decide([(-0.5, 1.0, 1.5, 0.0), (-0.5, 1.0, 1.5, 0.0)]) is None
  assert noisy(R).decide([(float("nan"),) * 3 + (0.0,)]) is None   # no valid pair yet


def test_the_plan_gives_way_to_raw_words_when_they_are_faster(mesh8, monkeypatch):
  """zipccl_jax.jit(compare_raw=True) on a clock under which raw words are faster:
  the steps after the comparison run raw words, unvalidated; when the plan becomes
  faster, the next comparison times it (the plan it left, compiled once) and goes
  back to it. Every step equals codec="raw"; compare_raw=False never compares."""
  from zipccl_jax._src import planned_gate as g
  monkeypatch.setattr(g, "PAIRS", 2)
  monkeypatch.setattr(g, "FIRST_COMPARE", 1)
  x = _gauss(7)
  f, raw = zc.jit(_five(mesh8)), jax.jit(_five(mesh8, codec="raw"))
  want = raw(x)
  runs, real_run = [], f._run   # pylint: disable=protected-access

  def counted(state, plan, args, kwargs):
    runs.append(plan is not None)
    return real_run(state, plan, args, kwargs)

  cost = {g.PLANNED: 2.0, g.RAW: 1.0}
  monkeypatch.setattr(f, "_run", counted)
  f._clock = phase_clock(f, cost)   # pylint: disable=protected-access
  for i in range(7):   # measure, 1 planned, 2 pairs, 1 raw
    _assert_all_equal(f(x), want, f"step {i}")
  assert f.comparisons() == [g.Comparison(5, 2.0, 1.0, 1.0, g.RAW)]
  assert runs == [False, True, True, True]     # raw steps: no mailbox, no exchange
  cost[g.PLANNED] = 0.5
  for i in range(4):   # 2 pairs
    _assert_all_equal(f(x), want, f"step {7 + i}")
  assert [c.chosen for c in f.comparisons()] == [g.RAW, g.PLANNED]
  assert runs[4:] == [True, True]
  _assert_all_equal(f(x), want, "planned again")
  assert runs[-1] is True and f.site_stats()[0].slot_bytes < f.site_stats()[0].raw_bytes
  h = zc.jit(_five(mesh8), compare_raw=False)
  for _ in range(6):
    h(x)
  assert h.comparisons() == []
  with pytest.raises(TypeError, match="compare_raw must be a bool"):
    zc.jit(_five(mesh8), compare_raw=1)
