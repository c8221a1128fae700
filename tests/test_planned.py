"""zipccl_jax.jit: the planned transport (static slots, validated after the step).

Every test compares raw words with codec="raw" (the oracle), and checks what the
compiled program holds: no conditional, no agreement, one collective per call site.
"""
import functools
import json
import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from tests.gate_clock import phase_clock
from tests.reference import assert_bits_equal
from zipccl_jax._src import ffi as zffi
from zipccl_jax._src import planned_slots
from zipccl_jax._src.planned_sites import RAW, Trace, fits

BF16 = np.dtype(ml_dtypes.bfloat16)
N = 8
RING = [(i, (i + 1) % N) for i in range(N)]
MEASURE_STEPS = planned_slots.MEASURE_STEPS


@pytest.fixture(autouse=True)
def _one_measuring_step(monkeypatch):
  """The tests script the planner step by step from the plan of one measuring step;
  `test_the_first_plan_measures_several_steps` runs the default (MEASURE_STEPS). Plans take effect
  at the next step, built when it needs them (compiling ahead: test_planned_ahead.py)."""
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", 1)
  monkeypatch.setattr(zc, "jit", functools.partial(zc.jit, compile_ahead=False))


def _five(mesh, **kw):
  """A step with all five collectives on x (bf16 [N*64, 1024]) and their outputs."""
  kw = dict(policy="always", **kw)

  def body(v):
    return (zc.compressed_all_gather(v, "x", tiled=True, **kw),
            zc.compressed_all_to_all(v, "x", 1, 1, tiled=True, **kw),
            zc.compressed_ppermute(v, "x", RING, **kw),
            zc.compressed_psum_scatter(v, "x", scatter_dimension=1, tiled=True, **kw),
            zc.compressed_psum(v, "x", **kw))

  return lambda x: jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                                 out_specs=(P("x"), P("x"), P("x"), P("x"), P()))(x)


def _gauss(seed, shape=(N * 64, 1024)):
  return (np.random.default_rng(seed).standard_normal(shape) * 0.02).astype(BF16)


def _random_bits(seed, shape=(N * 64, 1024)):
  w = np.random.default_rng(seed).integers(0, 1 << 16, size=shape, dtype=np.uint16)
  w[(w & 0x7F80) == 0x7F80] = 0   # no NaN/inf: sums stay comparable word for word
  return w.view(BF16)


def _assert_all_equal(got, want, what):
  for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
    assert_bits_equal(np.asarray(a), np.asarray(b), f"{what} output {i}")


# A site's signature as transport.py traces it (transport, codec, dtype, rows shape,
# chunk, check decode), for the tests that script sites and sizes
_SIGNATURE = ("an all_gather", "entropy", "bfloat16", (1, 4096), (), False, 7)


def _compiled(f, *args) -> str:
  return f.lower(*args).compile().as_text()


def test_planned_steps_equal_raw_with_no_conditional_and_no_agreement(mesh8):
  f = zc.jit(_five(mesh8))
  raw = jax.jit(_five(mesh8, codec="raw"))
  x = _gauss(0)
  for step in range(3):   # measure, then planned twice
    _assert_all_equal(f(x), raw(x), f"step {step}")
  sites = f.site_stats()
  # all_gather, all_to_all, ppermute, psum_scatter, psum's two transports
  assert len(sites) == 6
  # the rows each site puts on the links (8 devices): 7 peers, 7 of 8 rows, 1 peer
  assert [s.signature[-1] for s in sites] == [7, 7, 1, 7, 7, 7]
  assert all(s.slot_bytes is not None and s.used_bytes <= s.slot_bytes < s.raw_bytes for s in sites)
  assert all(s.replans == 0 for s in sites)
  text = _compiled(f, x)
  assert "conditional(" not in text
  # one collective per transport: the data's, no agreement (the ladder adds one per transport)
  ops = zc.hlo_wire_bytes(text).ops
  ladder_ops = zc.hlo_wire_bytes(_compiled(jax.jit(_five(mesh8)), x)).ops
  n_planned = len(ops)
  assert not [o for o in ops if o.operand_bytes == 24], "an agreement all-gather is left"
  assert n_planned < len(ladder_ops)
  # the sites' slots are what moves: an all-gather of the planned slot
  gather = sites[0]
  assert any(o.opcode == "all-gather" and o.operand_bytes == gather.slot_bytes for o in ops)
  # a slot is the multiple of 128 bytes at or above used x (1 + HEADROOM), not the
  # ladder's next rung (the steps ran the same x: one used size per site)
  aligned = lambda b: math.ceil(b / 128) * 128
  assert [s.slot_bytes for s in sites] == [
      aligned(s.used_bytes * (1 + planned_slots.HEADROOM)) for s in sites]


def test_slots_are_any_multiple_of_128_within_the_ladder():
  rungs = (1024, 2048, 4096)
  assert planned_slots.slot_for(10, rungs, 0.02) == 1408    # 1280 B x 1.02, rounded up to 128
  assert planned_slots.slot_for(2, rungs, 0.02) == 1024     # below the first rung: the first
  assert planned_slots.slot_for(31, rungs, 0.05) == 4096    # the headroom capped at the top rung
  assert planned_slots.slot_for(32, rungs, 0.02) == 4096    # the top rung holds the used size
  assert planned_slots.slot_for(33, rungs, 0.0) == RAW      # above the ladder
  assert planned_slots.slot_for(-1, rungs, 0.02) == RAW     # never ran
  assert planned_slots.slot_for(10, (), 0.02) == RAW        # nothing compresses
  assert [fits(s, rungs) for s in (1408, 1024, 4096)] == [True] * 3
  # not a multiple of 128, below the codec's smallest encoding, above the ladder, raw
  assert [fits(s, rungs) for s in (1400, 896, 4224, RAW)] == [False] * 4
  assert not fits(1024, ())


def test_the_measuring_program_moves_all_to_all_words_by_permutes(mesh8):
  """The first call waits for the measuring program's compile: on CPU its all-to-all
  transports move raw words by N - 1 permutes (no kernel), not by lax's all-to-all
  (a slice kernel per peer), as the ladder's raw rung does; its stats count the N - 1
  rows the permutes hand to XLA."""
  def body(v):
    return zc.compressed_psum_scatter(v, "x", scatter_dimension=1, tiled=True,
                                      policy="always", stats=True)

  f = zc.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=(P("x"), P())))
  x = _gauss(12)
  text = _compiled(f, x)   # before the first call: the measuring program
  assert "all-to-all" not in text and text.count("collective-permute-start") + \
      text.count("collective-permute(") >= N - 1
  y, measuring = f(x)
  raw_row = 64 * 1024 * 2 // N
  assert measuring.slot_sizes == ((raw_row,),) and measuring.slots == (((N - 1) * raw_row,),)
  _assert_all_equal(y, jax.jit(jax.shard_map(
      lambda v: zc.compressed_psum_scatter(v, "x", scatter_dimension=1, tiled=True, codec="raw"),
      mesh=mesh8, in_specs=P("x"), out_specs=P("x")))(x), "measuring step")


def test_in_program_stats_report_the_planned_slot(mesh8):
  def body(v):
    return zc.compressed_all_gather(v, "x", tiled=True, to="invarying", policy="always",
                                    stats=True)

  f = zc.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=(P(), P())))
  x = _gauss(11)
  _, measuring = f(x)   # the measuring program moves raw words: the raw rung alone
  assert measuring.slot_sizes == ((64 * 1024 * 2,),) and int(measuring.rung[0]) == 0
  assert bool(measuring.raw_rung)
  _, planned = f(x)
  slot = f.site_stats()[0].slot_bytes
  assert planned.slot_sizes == ((slot, 64 * 1024 * 2),) and int(planned.rung[0]) == 0
  assert not bool(planned.raw_rung)
  assert int(planned.wire_bytes) == slot and int(planned.slot_bytes[0]) == slot


def test_a_step_that_does_not_fit_is_replanned_and_rerun_exactly(mesh8):
  """Mid-run loss of compressibility: the rows outgrow their slots, the step's outputs
  are discarded and it runs again with grown plans; results equal codec="raw"."""
  f = zc.jit(_five(mesh8))
  raw = jax.jit(_five(mesh8, codec="raw"))
  x = _gauss(1)
  f(x)
  f(x)
  before = [s.slot_bytes for s in f.site_stats()]
  y = _gauss(2)
  y[N * 32:] = _random_bits(3)[N * 32:]   # half of the devices' data stops compressing
  _assert_all_equal(f(y), raw(y), "after losing compressibility")
  after = f.site_stats()
  assert any(s.replans for s in after)
  assert all(a.slot_bytes is None or b is None or a.slot_bytes >= b for a, b in zip(after, before))
  _assert_all_equal(f(y), raw(y), "next step")   # the grown plan holds
  assert [s.replans for s in f.site_stats()] == [s.replans for s in after]
  _assert_all_equal(f(x), raw(x), "compressible again")


def test_plans_shrink_after_a_window_that_needs_less(mesh8, monkeypatch):
  """Sizes that fall (data growing more compressible) shrink the plan after a window
  of SHRINK_WINDOW fitting steps, with no re-run, once they pay for their compile
  (the break-even rule, tested on scripted clocks below); results equal
  codec="raw" before, at and after the change."""
  from zipccl_jax._src import planned
  monkeypatch.setattr(planned, "SHRINK_WINDOW", 3)
  kw = dict(policy="always")
  body = lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw)
  f = zc.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  raw = jax.jit(jax.shard_map(lambda v: zc.compressed_all_gather(v, "x", tiled=True,
                                                                codec="raw", **kw),
                              mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  wide = _gauss(1) * np.asarray(1e3, BF16)   # the same rows, spread over more exponents
  wide[:, ::2] = _gauss(4)[:, ::2] * np.asarray(1e-3, BF16)
  narrow = _gauss(1)
  _assert_all_equal(f(wide), raw(wide), "measured")
  first = f.site_stats()[0]
  monkeypatch.setattr(planned_slots, "saved_share", lambda *a: 0.0)            # never pays
  for i in range(3):
    _assert_all_equal(f(narrow), raw(narrow), f"narrow step {i}")
  assert f.site_stats()[0].slot_bytes == first.slot_bytes and f.site_stats()[0].shrinks == 0
  monkeypatch.setattr(planned_slots, "saved_share", lambda *a: float("inf"))   # pays at once
  for i in range(3):
    _assert_all_equal(f(narrow), raw(narrow), f"narrow step {3 + i}")
  shrunk = f.site_stats()[0]
  assert shrunk.shrinks == 1 and shrunk.replans == 0
  assert shrunk.slot_bytes < first.slot_bytes, (first, shrunk)
  _assert_all_equal(f(narrow), raw(narrow), "on the shrunk plan")
  _assert_all_equal(f(wide), raw(wide), "outgrowing it again: re-planned and re-run")
  assert f.site_stats()[0].replans == 1


def test_grad_scan_remat_vmap_and_buckets_inside(mesh8):
  def make(codec):
    kw = dict(codec=codec, policy="always")

    def loss(w, v):
      def body(c, wl):
        g = zc.compressed_all_gather(wl, "x", tiled=True, **kw)
        return c + jnp.sum(jnp.sin(g.astype(jnp.float32))[:v.shape[0]] * v.astype(jnp.float32)), None
      c0 = jax.lax.pcast(jnp.float32(0), ("x",), to="varying")
      return jax.lax.scan(jax.checkpoint(body), c0, w.reshape(2, -1, w.shape[-1]))[0]

    def inner(w, v):
      g = jax.grad(loss)(w, v)
      p = zc.compressed_psum({"a": g, "b": g[:3] * 2}, "x", **kw)   # one bucket
      vm = jax.vmap(lambda r: zc.compressed_ppermute(r, "x", RING, **kw))(v.reshape(2, -1, v.shape[-1]))
      return g, p, vm

    return lambda w, v: jax.shard_map(inner, mesh=mesh8, in_specs=(P("x"), P("x")),
                                      out_specs=(P("x"), P(), P(None, "x")))(w, v)

  w, v = _gauss(4, (N * 64, 512)), _gauss(5, (N * 64, 512))
  f, raw = zc.jit(make("zipccl")), jax.jit(make("raw"))
  for step in range(2):
    _assert_all_equal(f(w, v), raw(w, v), f"step {step}")
  assert "conditional(" not in _compiled(f, w, v)
  assert sum(s.slot_bytes is not None for s in f.site_stats()) >= 4


def test_plans_save_and_load(mesh8, tmp_path):
  x = _gauss(6)
  f = zc.jit(_five(mesh8))
  f(x)
  path = tmp_path / "plans.json"
  f.save_plans(str(path))
  g = zc.jit(_five(mesh8))
  assert g.load_plans(str(path)) == 1
  # the first call runs the loaded plan: the program it lowers has no raw-only sites
  text = g.lower(x).as_text()
  assert text.count("zipccl_zipccl_decode") + text.count("zipccl_entropy_decode") >= 6
  _assert_all_equal(g(x), jax.jit(_five(mesh8, codec="raw"))(x), "loaded plan")
  assert [s.slot_bytes for s in g.site_stats()] == [s.slot_bytes for s in f.site_stats()]
  path.write_text("{not json")
  with pytest.raises(ValueError, match=r"cannot load plans from .*plans.json"):
    g.load_plans(str(path))
  # a file of another version (its sites' signatures differ) is refused, not misread
  path.write_text(json.dumps({"version": 1, "function": "f", "plans": []}))
  with pytest.raises(ValueError, match=r"plans.json.*version must be 2, got 1"):
    g.load_plans(str(path))


def test_donated_arguments_are_kept_only_where_a_rerun_may_need_them(mesh8, monkeypatch):
  """donate_argnums: the measuring step and the steps of raw words (the comparison
  chose them, or nothing compresses) consume the donated argument, as jax.jit does;
  a step of a plan with a compressed site keeps it (an overflow runs it again), and
  an overflow's re-run (the measuring program) then consumes it. Every step equals
  codec="raw"."""
  from zipccl_jax._src import planned_gate as g
  monkeypatch.setattr(g, "PAIRS", 2)
  monkeypatch.setattr(g, "FIRST_COMPARE", 1)
  want = jax.jit(_five(mesh8, codec="raw"))(_gauss(8))
  f = zc.jit(_five(mesh8), donate_argnums=0)
  f._clock = phase_clock(f, {g.PLANNED: 2.0, g.RAW: 1.0})   # pylint: disable=protected-access
  sharded = jax.sharding.NamedSharding(mesh8, P("x"))   # as the step takes it: no copy
  consumed = []
  for i in range(7):   # measure, 1 planned, 2 pairs, then raw words
    x = jax.device_put(_gauss(8), sharded)
    _assert_all_equal(f(x), want, f"step {i}")
    consumed.append(x.is_deleted())
  assert consumed == [True, False, False, True, False, True, True]
  state = f._state_of((), {})   # pylint: disable=protected-access
  state.plan = tuple(rungs[0] for _, rungs, _ in state.sites)   # too small: it re-runs
  state.gate.chosen = g.PLANNED
  x = jax.device_put(_gauss(8), sharded)
  _assert_all_equal(f(x), want, "overflow and re-run")
  assert x.is_deleted() and sum(s.replans for s in f.site_stats()) > 0
  h = zc.jit(_five(mesh8, codec="raw"), donate_argnums=0)   # nothing compresses
  for i in range(2):
    x = jax.device_put(_gauss(8), sharded)
    _assert_all_equal(h(x), want, f"raw plan step {i}")
    assert x.is_deleted()


def test_corruption_that_fits_its_slot_raises(mesh8, monkeypatch):
  """A decode failure that no overflow explains is a corrupted wire: the step raises
  (never a wrong answer)."""
  f = zc.jit(_five(mesh8))
  x = _gauss(7)
  f(x)
  real = zffi.mailbox_take

  def corrupt(ledger):
    t = real(ledger)
    return [v if i % 2 == 0 else 1 for i, v in enumerate(t)]   # every site reports a bad row

  monkeypatch.setattr(zffi, "mailbox_take", corrupt)
  with pytest.raises(RuntimeError, match=r"failed to decode although they fit their slots"):
    f(x)


def _case_bodies(text: str) -> list:
  """The regions of every stablehlo.case op of an MLIR text (by brace depth)."""
  out = []
  for m in re.finditer(r'"stablehlo\.case"\(', text):
    i = text.index("({", m.end())
    depth, j = 0, i
    while True:
      depth += {"{": 1, "}": -1}.get(text[j], 0)
      j += 1
      if depth == 0:
        break
    out.append(text[i:j])
  return out


def test_cuda_export_has_no_conditional(mesh8):
  """The planned program lowered for CUDA (on this CPU machine): no case/if, the
  collectives and custom calls only."""
  f = zc.jit(_five(mesh8))
  x = _gauss(8)
  f(x)
  state = next(iter(f._states.values()))   # pylint: disable=protected-access
  prog = f._jitted(state.plan, Trace(0, state.plan))   # pylint: disable=protected-access
  targets = ["zipccl_zipccl_encode", "zipccl_zipccl_decode", "zipccl_entropy_encode",
             "zipccl_entropy_decode", "zipccl_mailbox", "zipccl_used_max", "zipccl_row_prefix",
             "zipccl_bitcast_copy", "zipccl_row_split", "zipccl_row_join", "zipccl_row_sum"]
  exp = jax.export.export(prog, platforms=["cuda"], disabled_checks=[
      jax.export.DisabledSafetyCheck.custom_call(t) for t in targets])(x)
  text = exp.mlir_module()
  # lax.platform_dependent lowers to cases over the platform index (constant branches,
  # folded by XLA); none holds a collective, as every ladder's switch does
  assert not re.findall(r"stablehlo\.if\b", text)
  for body in _case_bodies(text):
    assert not re.findall(r"stablehlo\.(all_gather|all_to_all|collective_permute|all_reduce)", body)
  assert "zipccl_mailbox" in text and "zipccl_agree" not in text
  # the CPU program's collectives, one transport per call site (traced on a CPU mesh,
  # the all-to-all sites keep their CPU form: N - 1 permutes): 5 sites, psum two
  n_ops = sum(text.count(f"stablehlo.{op}") for op in ("all_gather", "collective_permute", "all_to_all"))
  assert n_ops == 1 + 7 + 1 + 7 + (7 + 1)
  # XLA may merge identical transports: psum_scatter's and psum's all-to-all move
  # the same encoded rows of x (each site still decodes and records its own)
  assert 1 + 7 + 1 + 7 + 1 <= len(zc.hlo_wire_bytes(_compiled(f, x)).ops) <= n_ops


def test_mailbox_records_several_values_and_refuses_bad_operands():
  """zipccl_mailbox (ffi/mailbox.h): value i's max goes to slot + i, x passes through;
  bad operands are errors naming the target, and nothing is recorded."""
  from zipccl_jax._src import planned_sites
  ledger = 987654
  x = jnp.arange(6, dtype=jnp.float32)
  rec = jax.jit(lambda v, a, b: planned_sites.record(v, [a, b], ledger, 4))
  out = rec(x, jnp.array([3, 9, 1], jnp.int32), jnp.array([-1, 0], jnp.int32))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
  assert list(zffi.mailbox_take(ledger)) == [-1, -1, -1, -1, 9, 0]
  assert list(zffi.mailbox_take(ledger)) == []   # taken: emptied
  # column 2 of an encoder's stats rows s32[R, 4] (floored at 0), value 1 whole;
  # batched under vmap (a leading axis), the worst of every batch member
  stats = jnp.array([[7, 70, -5, 1], [8, 80, -3, 2]], jnp.int32)
  jax.jit(lambda v, a, b: planned_sites.record(v, [a, b], ledger, 0, column=2))(x, stats, jnp.array([4], jnp.int32))
  assert list(zffi.mailbox_take(ledger)) == [0, 4]
  batched = jnp.stack([stats, stats.at[1, 2].set(33)])
  jax.jit(jax.vmap(lambda v, a: planned_sites.record(v, [a], ledger, 1, column=2)))(jnp.stack([x, x]), batched)
  assert list(zffi.mailbox_take(ledger)) == [-1, 33]

  def call(*values, slot=0, column=-1):
    return jax.jit(lambda v: jax.ffi.ffi_call("zipccl_mailbox", jax.ShapeDtypeStruct(v.shape, v.dtype))(
        v, *values, ledger=np.int64(ledger), slot=np.int64(slot), column=np.int64(column)))(x)

  with pytest.raises(Exception, match="zipccl_mailbox: expected at least one value"):
    call()
  with pytest.raises(Exception, match="zipccl_mailbox: value 1 must be a non-empty s32 array"):
    call(jnp.ones(2, jnp.int32), jnp.ones(2, jnp.float32))
  with pytest.raises(Exception, match="zipccl_mailbox: value 0 must be a non-empty s32 array"):
    call(jnp.ones(0, jnp.int32))
  with pytest.raises(Exception, match=r"zipccl_mailbox: slots \[-1, 0\) must lie in"):
    call(jnp.ones(2, jnp.int32), slot=-1)
  with pytest.raises(Exception, match="zipccl_mailbox: column 4 must be -1, -2 or below value 0's last dimension 4"):
    call(stats, column=4)
  assert list(zffi.mailbox_take(ledger)) == []


def test_window_headroom_estimates_noise_and_trend():
  """`window_target` on sizes of one site over a window: the headroom above the
  window's maximum is the largest of WINDOW_HEADROOM, half the site's own, the sizes'
  sd over the maximum and twice the rise of the second half's mean over the first's."""
  from zipccl_jax._src import planned_slots
  target = planned_slots.window_target
  assert target([100] * 25, 0.02) == (100, planned_slots.WINDOW_HEADROOM)   # settled: the floor
  assert target([100] * 25, 0.10) == (100, 0.05)                       # own headroom halves
  top, h = target([96, 104] * 12, 0.0)                                 # noise: 1 sd / max
  assert top == 104 and h == pytest.approx(4 / 104)
  rise = lambda first, second: 2 * (second / first - 1)   # per window, from its halves' means
  top, h = target([100 + i // 5 for i in range(25)], 0.0)              # a steady rise: twice it
  assert top == 104 and h == pytest.approx(2 * rise(1209 / 12, 1341 / 13))
  # one low first step and one high last step: halves, not ends (2 x 110/90 would be 44%)
  top, h = target([90] + [100] * 23 + [110], 0.0)
  assert top == 110 and h == pytest.approx(2 * rise(1190 / 12, 1310 / 13))
  assert target([100] * 25, 0.9)[1] == planned_slots.MAX_HEADROOM


def test_replan_headroom_grows_and_slots_follow_the_window(monkeypatch):
  """The planning policy on scripted sizes (units of 128 B; one site, 128-byte rungs):
  an overflow re-plans with a headroom of at least the excess seen (and twice the
  last); after a window, a rising site keeps its slot while it has room, a falling
  one shrinks, one close to its slot grows before it overflows (with twice the
  window's rise as headroom), and a site that settles sheds that headroom by half per
  window down to WINDOW_HEADROOM."""
  from zipccl_jax._src import planned
  monkeypatch.setattr(planned, "SHRINK_WINDOW", 3)
  rungs, raw_row = tuple(128 * u for u in range(1, 200)), 200 * 128
  windows = [[112, 113, 114],   # rising, with room: kept
             [100, 95, 90],     # falling: shrinks
             [100, 102, 104],   # close to the slot: grows
             [104] * 3, [104] * 3, [104] * 3, [104] * 3]   # settled: halving to the floor
  sizes = iter([100,            # measure
                110, 110]       # overflow, and the measuring re-run's true size
               + sum(windows, []))
  f = zc.jit(lambda v: v)

  def run(state, plan, args, kwargs):
    state.sites = [(_SIGNATURE, rungs, raw_row)]
    return args[0], [next(sizes)], [0]

  monkeypatch.setattr(f, "_run", run)
  x = jnp.zeros(3)
  slot = lambda: f._state_for((x,), {}).plan[0] // 128   # pylint: disable=protected-access
  f(x)
  assert slot() == 102                                   # 100 x (1 + HEADROOM)
  f(x)
  headroom = 110 / 102 - 1                               # the excess seen: 7.8% > 2 x 2%
  assert slot() == 119 == math.ceil(110 * (1 + headroom))
  got = []
  for w in windows:
    for _ in w:
      f(x)
    got.append(slot())
  # kept (114 x (1 + 2 x 2.7% rise) -> 121 > 119, with over half its headroom left);
  # 100 x (1 + sd 4.1%) -> 105; 104 x (1 + 2 x 6% rise) -> 117; 104 x 1.06, 1.03,
  # 1.015, then the floor 1.01: unchanged
  assert got == [119, 105, 117, 111, 108, 106, 106], got
  assert [(s.replans, s.shrinks, s.grows) for s in f.site_stats()] == [(1, 4, 1)]


def test_sites_planned_raw_are_measured_again(mesh8, monkeypatch):
  """A site incompressible when measured is planned raw; once the data compresses, a
  probe step (the measuring program, after a window) gives it a slot. Every step
  equals codec="raw"."""
  from zipccl_jax._src import planned
  monkeypatch.setattr(planned, "SHRINK_WINDOW", 2)
  kw = dict(policy="always")
  body = lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw)
  f = zc.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  raw = jax.jit(jax.shard_map(lambda v: zc.compressed_all_gather(v, "x", tiled=True,
                                                                codec="raw", **kw),
                              mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  noise, data = _random_bits(5), _gauss(6)
  _assert_all_equal(f(noise), raw(noise), "measured incompressible")
  assert f.site_stats()[0].slot_bytes is None
  for i in range(3):   # a window of 2 fitting steps, then the probe
    _assert_all_equal(f(data), raw(data), f"step {i}")
  slot = f.site_stats()[0].slot_bytes
  assert slot is not None and slot < f.site_stats()[0].raw_bytes
  _assert_all_equal(f(data), raw(data), "on the new plan")
  assert f.site_stats()[0].replans == 0


def test_a_plan_of_raw_sites_is_not_validated(mesh8, monkeypatch):
  """Raw sites cannot overflow or fail to decode: once every site is planned raw
  (codec="raw", or data that did not compress), steps read no mailbox and make no
  exchange, as jax.jit; the probe of the raw sites after a window still measures."""
  from zipccl_jax._src import planned
  monkeypatch.setattr(planned, "SHRINK_WINDOW", 2)
  body = lambda v: zc.compressed_all_gather(v, "x", tiled=True, policy="always")
  f = zc.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  raw = jax.jit(jax.shard_map(lambda v: zc.compressed_all_gather(v, "x", tiled=True, codec="raw"),
                              mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  runs = []
  real_run = f._run   # pylint: disable=protected-access

  def counted(state, plan, args, kwargs):
    runs.append(plan)
    return real_run(state, plan, args, kwargs)

  monkeypatch.setattr(f, "_run", counted)
  noise = _random_bits(5)
  _assert_all_equal(f(noise), raw(noise), "measured incompressible")
  assert runs == [None] and f.site_stats()[0].slot_bytes is None
  for i in range(2):   # a window of 2 steps on the raw plan: not validated
    _assert_all_equal(f(noise), raw(noise), f"raw step {i}")
  assert runs == [None]
  _assert_all_equal(f(noise), raw(noise), "the probe")   # measures again
  assert runs == [None, None] and f.site_stats()[0].slot_bytes is None


def test_raw_sites_compile_to_the_program_of_codec_raw(mesh8):
  """Sites planned raw (data that does not compress) move their words as codec="raw"
  does, not by a ladder's raw rung (permutes and copy custom calls): the program
  compiles to the same operations as jax.jit's under codec="raw". (Not psum: its sums
  of random words compress.)"""
  def four(**kw):
    kw = dict(policy="always", **kw)
    body = lambda v: (zc.compressed_all_gather(v, "x", tiled=True, **kw),
                      zc.compressed_all_to_all(v, "x", 1, 1, tiled=True, **kw),
                      zc.compressed_ppermute(v, "x", RING, **kw),
                      zc.compressed_psum_scatter(v, "x", scatter_dimension=1, tiled=True, **kw))
    return jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=(P("x"),) * 4)

  f, raw = zc.jit(four()), jax.jit(four(codec="raw"))
  noise = _random_bits(9)
  for step in range(3):
    _assert_all_equal(f(noise), raw(noise), f"step {step}")
  assert all(s.slot_bytes is None for s in f.site_stats())
  opcodes = lambda text: sorted(re.findall(r"= \S+ ([\w\-]+)\(", text))
  assert opcodes(_compiled(f, noise)) == opcodes(_compiled(raw, noise))


def test_a_replan_also_grows_the_sites_short_of_headroom(monkeypatch):
  """A re-plan compiles a new program anyway: the sites that still fit but are left
  with less than their headroom grow in it too (early in training many sites drift
  upwards together), so they cost no compile, or re-run, of their own later."""
  from zipccl_jax._src import planned_slots
  rungs, raw_row = tuple(128 * u for u in range(1, 200)), 200 * 128
  sizes = iter([[100, 100, 100],   # measure
                [110, 101, 99],    # site 0 overflows, site 1 still fits but is short
                [110, 101, 99]])   # the measuring re-run's true sizes
  f = zc.jit(lambda v: v)

  def run(state, plan, args, kwargs):
    state.sites = [(_SIGNATURE, rungs, raw_row) for k in range(3)]
    return args[0], next(sizes), [0, 0, 0]

  monkeypatch.setattr(f, "_run", run)
  x = jnp.zeros(3)
  want = lambda units, h: planned_slots.slot_for(units, rungs, h)
  f(x)
  first = f._state_for((x,), {}).plan   # pylint: disable=protected-access
  assert first == (want(100, planned_slots.HEADROOM),) * 3
  f(x)
  plan = f._state_for((x,), {}).plan   # pylint: disable=protected-access
  assert plan[0] > first[0]                                   # re-planned
  assert plan[1] == want(101, planned_slots.HEADROOM) > first[1]    # grown alongside
  assert plan[2] == first[2]                                  # room left: kept
  assert [(s.replans, s.grows) for s in f.site_stats()] == [(1, 0), (0, 1), (0, 0)]


def test_the_first_plan_measures_several_steps(monkeypatch):
  """The first MEASURE_STEPS calls run the measuring program; the first plan takes
  each site's largest size with the headroom `window_target` gives their spread and
  trend (at least HEADROOM): a steady site 2% above its size, a rising one above its
  largest by twice its rise over a window."""
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", MEASURE_STEPS)
  assert MEASURE_STEPS == 3
  rungs, raw_row = tuple(128 * u for u in range(1, 200)), 200 * 128
  sizes = iter([[100, 100], [100, 103], [100, 106], [100, 106]])
  runs = []
  f = zc.jit(lambda v: v)

  def run(state, plan, args, kwargs):
    state.sites = [(_SIGNATURE, rungs, raw_row) for _ in range(2)]
    runs.append(plan)
    return args[0], next(sizes), [0, 0]

  monkeypatch.setattr(f, "_run", run)
  x = jnp.zeros(3)
  state = lambda: f._state_for((x,), {})   # pylint: disable=protected-access
  for _ in range(2):
    f(x)
    assert state().plan is None and not f.is_planned(x)
  f(x)
  assert f.is_planned(x)
  # window_target: twice the rise of the second half's mean over the first's, that
  # rise doubled to a whole window
  headroom = 2 * 2 * ((103 + 106) / 2 / 100 - 1)
  assert state().plan == (102 * 128, math.ceil(106 * (1 + headroom)) * 128)
  f(x)
  assert runs == [None, None, None, state().plan]


def test_a_shrink_saves_the_bytes_its_site_puts_on_the_wire():
  """`saved_share` weighs each site by the rows it puts on the links (its signature's
  last field): a site of 7 wire rows (an all_gather over 8 devices) and one of 1 (a
  ppermute), both on 1280-byte slots: halving the first saves 7/16 of the bytes, the
  second 1/16; a raw site weighs its raw row."""
  from zipccl_jax._src import planned_slots
  rungs = tuple(128 * u for u in range(1, 20))
  sites = [(_SIGNATURE[:-1] + (7,), rungs, 2560), (_SIGNATURE[:-1] + (1,), rungs, 2560)]
  assert planned_slots.saved_share(sites, (1280, 1280), {0: 640}) == 7 * 640 / (8 * 1280)
  assert planned_slots.saved_share(sites, (1280, 1280), {1: 640}) == 640 / (8 * 1280)
  assert planned_slots.saved_share(sites, (1280, -1), {0: 640}) == 7 * 640 / (7 * 1280 + 2560)


def test_shrinks_wait_until_they_pay_for_their_compile_unless_a_grow_compiles(monkeypatch):
  """A window's shrinks wait until the step time they would have saved (each window:
  its steps' time x the share of the plan's bytes they save) reaches the last
  compile's time; a window that also grows a site compiles anyway, and its shrinks
  go with it. The clocks are the agreed ones `_run` leaves in the state."""
  from zipccl_jax._src import planned
  monkeypatch.setattr(planned, "SHRINK_WINDOW", 2)
  rungs, raw_row = tuple(128 * u for u in range(1, 200)), 200 * 128
  sizes = iter([[100, 100],                          # measure: slots 102, 102
                [80, 100], [80, 100],                # site 0 falls: saves 21 of 204 units:
                [80, 100], [80, 100],                # 10 s x 0.103 a window, pays after two
                [60, 102], [60, 102]])               # site 1 at its slot grows, site 0 goes along
  f = zc.jit(lambda v: v)

  def run(state, plan, args, kwargs):
    state.sites = [(_SIGNATURE, rungs, raw_row) for _ in range(2)]
    state.window_s, state.compile_s = 10.0, 2.0
    return args[0], next(sizes), [0, 0]

  monkeypatch.setattr(f, "_run", run)
  x = jnp.zeros(3)
  state = lambda: f._state_for((x,), {})   # pylint: disable=protected-access
  for _ in range(3):
    f(x)
  assert state().plan == (102 * 128, 102 * 128)
  assert state().forgone_s == pytest.approx(10 * 21 / 204)
  for _ in range(2):
    f(x)
  assert state().plan == (81 * 128, 102 * 128) and state().forgone_s == 0
  for _ in range(2):
    f(x)
  assert state().plan == (61 * 128, 104 * 128)
  assert [(s.shrinks, s.grows) for s in f.site_stats()] == [(2, 0), (0, 1)]
