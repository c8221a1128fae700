"""A scripted clock for `zipccl_jax.jit`'s comparison of its plan with raw words
(planned_gate.py), shared by test_planned.py and _diverge_worker.py."""


def phase_clock(f, cost: dict):
  """A clock for `f._clock` (a zipccl_jax.jit function) that advances by cost[program]
  at each read, the program being the one the comparison's current step runs
  ("planned" outside a comparison): a timed step then lasts cost[its program]."""
  now = [0.0]

  def clock():
    state = f._state_of((), {})   # pylint: disable=protected-access
    now[0] += cost[state.gate.phase or "planned"]
    return now[0]

  return clock
