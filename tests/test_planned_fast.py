"""zipccl_jax.jit's steps of raw words through jax.jit's own dispatch
(`Planned._fast_step`): taken once two steps of one signature ran raw words, left
for the slow path on any other signature or kind of step, and every step equal to
jax.jit's word for word."""
import functools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zc
from tests.gate_clock import phase_clock
from tests.test_planned import _assert_all_equal, _five, _gauss
from zipccl_jax._src import planned_programs, planned_slots


@pytest.fixture(autouse=True)
def _one_measuring_step(monkeypatch):
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", 1)
  monkeypatch.setattr(zc, "jit", functools.partial(zc.jit, compile_ahead=False))


def _counted_signatures(monkeypatch) -> list:
  """Counts the wrapper's slow-path calls (each reads the arguments' signature)."""
  calls, real = [], planned_programs.signature
  monkeypatch.setattr(planned_programs, "signature",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  return calls


def _scaled(mesh):
  """all_to_all(x * s) with codec="raw": no compressed site, a plan of raw words; the
  output has x's shape and sharding, so a donated x is used."""
  def body(x, s):
    return zc.compressed_all_to_all(x * s, "x", 0, 0, tiled=True, codec="raw")
  return jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))


def test_raw_words_take_jax_jits_dispatch_for_one_signature(mesh8, monkeypatch):
  """codec="raw" (no compressed site): the first step measures, the second runs the
  empty plan and arms the fast path, the later ones skip the wrapper's signature.
  Another shape or a Python scalar for an array takes the slow path, never another
  program; donated arguments are donated on the fast path too."""
  calls = _counted_signatures(monkeypatch)
  f = zc.jit(_scaled(mesh8), donate_argnums=0)
  ref = jax.jit(_scaled(mesh8))
  x, y, s = _gauss(1), _gauss(2, (8 * 16, 256)), jnp.asarray(0.5, jnp.bfloat16)
  for i in range(5):
    _assert_all_equal(f(jnp.asarray(x), s), ref(x, s), f"step {i}")
  assert len(calls) == 2   # the measuring step and the step that armed the fast path
  # another shape: jax.jit would trace again, so the step takes the slow path
  _assert_all_equal(f(jnp.asarray(y), s), ref(y, s), "other shape")
  assert len(calls) == 3   # one slow call (the fast attempt traced nothing, ran nothing)
  # a weak-typed Python scalar where the program took a bf16 array: the slow path
  _assert_all_equal(f(jnp.asarray(x), 0.5), ref(x, 0.5), "python scalar")
  for i in range(4):
    _assert_all_equal(f(jnp.asarray(x), s), ref(x, s), f"again {i}")
  n, compiles = len(calls), []

  def listen(name, _, **kw):
    if "compile" in name:
      compiles.append(name)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    for i in range(3):
      _assert_all_equal(f(jnp.asarray(x), s), ref(x, s), f"fast again {i}")
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  # neither the slow path nor a trace or compile of jax.jit's: the program built
  # by the slow path's `.lower().compile()` is the one jax.jit's caches hold
  assert len(calls) == n and compiles == []
  # donation holds on the fast path (a plan of raw words donates, as jax.jit does)
  sharded = NamedSharding(mesh8, P("x"))
  g = zc.jit(_scaled(mesh8), donate_argnums=0)
  for i in range(4):   # measure, arm, fast, fast
    a = jax.device_put(x, sharded)
    _assert_all_equal(g(a, s), ref(x, s), f"donated {i}")
    assert a.is_deleted()


def test_raw_words_chosen_by_the_gate_take_the_fast_path(mesh8, monkeypatch):
  """A plan that compresses, after its comparison chose raw words: the steps until
  the next comparison go through jax.jit's dispatch (counted by the gate as the
  slow path counts them), the comparison itself through the slow path, on
  schedule; every step equals codec="raw"."""
  from zipccl_jax._src import planned_gate as g
  monkeypatch.setattr(g, "PAIRS", 2)
  monkeypatch.setattr(g, "EARLY_PAIRS", 2)
  monkeypatch.setattr(g, "FIRST_COMPARE", 1)
  calls = _counted_signatures(monkeypatch)
  x = _gauss(7)
  f, raw = zc.jit(_five(mesh8)), jax.jit(_five(mesh8, codec="raw"))
  want = raw(x)
  cost = {g.PLANNED: 2.0, g.RAW: 1.0}
  f._clock = phase_clock(f, cost)   # pylint: disable=protected-access
  for i in range(6):   # measure, 1 planned, 2 pairs: raw words chosen
    _assert_all_equal(f(x), want, f"step {i}")
  assert [c.chosen for c in f.comparisons()] == [g.RAW]
  gate = f._state_of((), {}).gate   # pylint: disable=protected-access
  assert gate.every == 1
  gate.every = 6   # a longer stretch of raw words before the next comparison
  before = len(calls)
  for i in range(6):
    _assert_all_equal(f(x), want, f"raw {i}")
  # the first raw step arms the fast path (the last step was the same signature's)
  assert len(calls) - before == 1 and gate.count == 6 and gate.k < 0
  cost[g.PLANNED] = 0.5
  for i in range(4):   # the comparison: 2 pairs, by the slow path
    _assert_all_equal(f(x), want, f"pair {i}")
  assert len(calls) - before == 5
  assert [c.chosen for c in f.comparisons()] == [g.RAW, g.PLANNED]
  _assert_all_equal(f(x), want, "planned again")   # validated: the slow path
  assert len(calls) - before == 6
