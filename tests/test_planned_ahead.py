"""zipccl_jax.jit compiling new plans ahead (planned_programs.py): the steps go on with
the program they run while the next plan compiles on the worker thread, and take it
at the first step after every process holds it; every step equals codec="raw"."""
import threading

import jax
import numpy as np
import pytest

import zipccl_jax as zc
from tests.test_planned import _assert_all_equal, _five, _gauss, _random_bits, N
from zipccl_jax._src import planned, planned_programs, planned_sites, planned_slots


@pytest.fixture(autouse=True)
def _one_measuring_step(monkeypatch):
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", 1)


class _HeldBuilds:
  """Holds every build on the worker thread until `release()`: the test decides when a
  plan compiled ahead is ready."""

  def __init__(self, monkeypatch):
    self.gate = threading.Event()
    self.ahead = []   # the plans built on the worker thread
    build = planned.Planned._build

    def held(wrapper, plan, args, kwargs):
      if threading.current_thread() is not threading.main_thread():
        self.ahead.append(plan)
        assert self.gate.wait(120), "the test never released the build"
      return build(wrapper, plan, args, kwargs)

    monkeypatch.setattr(planned.Planned, "_build", held)

  def release(self, f, state):
    """Lets the held builds run, and waits until the plan compiling ahead is built."""
    self.gate.set()
    for _ in range(6000):
      if state.programs.ready(state.next_key):
        return
      threading.Event().wait(0.01)
    raise AssertionError("the plan compiled ahead never became ready")


def _state(f):
  return next(iter(f._states.values()))   # pylint: disable=protected-access


def test_the_first_plan_compiles_ahead_while_the_steps_measure(mesh8, monkeypatch):
  """After the measuring step the plan compiles ahead; the steps meanwhile run the
  measuring program (raw words, exact), and the step after the build is seen ready
  in a step's exchange takes the plan."""
  held = _HeldBuilds(monkeypatch)
  f = zc.jit(_five(mesh8))
  raw = jax.jit(_five(mesh8, codec="raw"))
  x = _gauss(0)
  _assert_all_equal(f(x), raw(x), "measuring step")
  state = _state(f)
  assert state.next is not None and not f.is_planned(x)
  assert [s.slot_bytes is not None for s in f.site_stats()] == [True] * 6   # the newest plan
  for step in range(3):   # the build is held: the steps keep measuring
    _assert_all_equal(f(x), raw(x), f"held step {step}")
    assert not f.is_planned(x) and not state.next_ready and f.building()
  held.release(f, state)
  assert not f.building()
  _assert_all_equal(f(x), raw(x), "the step that sees the build ready")
  assert state.next_ready and not f.is_planned(x)
  _assert_all_equal(f(x), raw(x), "the first planned step")
  assert f.is_planned(x) and state.next is None and held.ahead[0] == state.plan
  # with the plan, the raw-words program of the gate's comparisons builds ahead too
  layout = planned_programs.signature((x,), {}, ())[1]
  assert ((planned_sites.RAW,) * 6, layout) in state.programs
  assert "conditional(" not in f.compiled(x).as_text()


def test_an_overflow_measures_while_the_grown_plan_compiles_ahead(mesh8, monkeypatch):
  """A step that outgrows its slots re-runs exactly; the grown plan compiles ahead
  while the steps run the measuring program, exact throughout, then takes over."""
  f = zc.jit(_five(mesh8))
  raw = jax.jit(_five(mesh8, codec="raw"))
  x = _gauss(1)
  f(x)
  state = _state(f)
  state.programs.get(state.next_key, lambda: None)   # wait for the first plan
  while not f.is_planned(x):
    f(x)
  f(x)
  held = _HeldBuilds(monkeypatch)
  first = state.plan
  y = _gauss(2)
  y[N * 32:] = _random_bits(3)[N * 32:]   # half of the devices' data stops compressing
  _assert_all_equal(f(y), raw(y), "the step that overflowed, re-run")
  assert state.plan is None and state.next is not None and any(s.replans for s in f.site_stats())
  _assert_all_equal(f(y), raw(y), "a measuring step while the grown plan is held")
  held.release(f, state)
  for step in range(3):
    _assert_all_equal(f(y), raw(y), f"step {step} after the release")
  assert f.is_planned(y) and state.plan != first and held.ahead[0] == state.plan


def test_the_callers_thread_local_configuration_goes_with_the_build(mesh8, monkeypatch):
  """A thread-local jax setting (a context manager) holds for the build ahead too, and
  the steps are exact; where the worker cannot take it (a JAX that does not say
  what it is), the plan is built on the caller's thread when a step takes it
  (programs_lib._ContextDiffers)."""
  raw = jax.jit(_five(mesh8, codec="raw"))
  x = _gauss(4)
  for settings in ("taken", "unknown"):
    if settings == "unknown":
      monkeypatch.setattr(planned_programs.compat, "thread_local_config", lambda: None)
    f = zc.jit(_five(mesh8))
    with jax.default_matmul_precision("highest"), jax.default_device(jax.devices()[0]):
      f(x)
      state = _state(f)
      future = state.programs._ahead[state.next_key]   # pylint: disable=protected-access
      if settings == "taken":
        assert future.result().sites
      else:
        with pytest.raises(planned_programs._ContextDiffers):   # pylint: disable=protected-access
          future.result()
      while not f.is_planned(x):
        _assert_all_equal(f(x), raw(x), f"measuring ({settings})")
      _assert_all_equal(f(x), raw(x), f"planned ({settings})")


def test_an_error_in_a_build_ahead_raises_on_the_callers_thread(mesh8):
  """A trace that fails on the worker thread raises at the step that takes its plan,
  with its own message."""
  body = _five(mesh8)

  def fun(x):
    trace = planned_sites.active()
    if trace is not None and trace.plan is not None:
      raise ValueError("the planned trace fails")
    return body(x)

  f = zc.jit(fun)
  x = _gauss(5)
  f(x)
  with pytest.raises(ValueError, match="the planned trace fails"):
    for _ in range(1000):
      f(x)


def test_programs_key_on_the_arguments_layout():
  """A program is compiled for its arguments' shardings (committed arrays only) and
  weak types: `signature`'s layout tells them apart, and `spec` keeps what a compile
  needs; its key (a state's) holds shapes, dtypes and the static arguments."""
  import jax.numpy as jnp
  a = jnp.ones(4)
  b = jax.device_put(np.ones(4, np.float32), jax.devices()[0])
  assert not a.committed and b.committed
  key = lambda *call: planned_programs.signature(*call)[0]
  layout = lambda *call: planned_programs.signature(*call)[1]
  assert layout((a,), {}, ()) != layout((b,), {}, ())
  assert key((a,), {}, ()) == key((b,), {}, ())
  assert layout((a, 3), {}, (1,)) == layout((a, 4), {}, (1,))   # static arguments are not
  assert key((a, 3), {}, (1,)) != key((a, 4), {}, (1,))         # but key the state
  assert layout((a,), {"k": 1.0}, ()) == ((False, False), None)
  assert key((a,), {"k": 1.0}, ())[1] == (((4,), np.dtype(np.float32)), ((), float))
  assert key((jnp.ones(4, jnp.bfloat16),), {}, ()) != key((a,), {}, ())
  assert planned_programs.spec(a).sharding is None
  assert planned_programs.spec(b).sharding == b.sharding
  assert planned_programs.spec(jnp.float32(2) * 1).weak_type is False
  assert planned_programs.spec(2.0) == 2.0


def test_a_function_with_no_site_compiles_once_and_measures_once(mesh8, monkeypatch):
  """With no compressed call site (codec="raw"), the measuring program is the empty
  plan's program: the first step measures and plans (), no build follows, and the
  next steps run unwaited with no exchange, equal to jax.jit's."""
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", 3)
  builds, runs = [], []
  build, run = planned.Planned._build, planned.Planned._run
  monkeypatch.setattr(planned.Planned, "_build",
                      lambda w, plan, *a: builds.append(plan) or build(w, plan, *a))
  monkeypatch.setattr(planned.Planned, "_run",
                      lambda w, state, plan, *a: runs.append(plan) or run(w, state, plan, *a))
  f = zc.jit(_five(mesh8, codec="raw"), donate_argnums=0)
  raw = jax.jit(_five(mesh8, codec="raw"))
  for step in range(4):
    x = _gauss(step)
    want = raw(x)
    _assert_all_equal(f(jax.device_put(x)), want, f"step {step}")
    assert f.is_planned(x) and _state(f).plan == ()
  assert builds == [None] and runs == [None] and not f.building()
  assert f.site_stats() == []
