"""Compressed collectives against jax.lax and numpy, on 8 simulated CPU devices.

Gathers, all-to-alls and permutes must equal the lax op bit for bit (compared as
uint16/uint32 words); reductions must equal a numpy sum in rank order with
float32 accumulation (XLA:CPU flushes subnormals, emulated here) and equal
codec="raw" bit for bit. Arrays are small and each test compiles one function
that runs many collectives, to keep the suite fast on 2 cores.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from tests.jaxtest import smap
from tests.reference import (BF16, DTYPES, F16, F32, assert_bits_equal, assert_same_or_both_nan,
                             bad_block, gaussian, ordered_sum, sprinkle_specials, uint)

N = 8
ALWAYS = dict(policy="always")



# ---- validation --------------------------------------------------------------------------


def _trace(mesh, f, x):
  return jax.eval_shape(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")), x)


@pytest.mark.parametrize("call, match", [
    (lambda x: zc.compressed_psum({"a": object()}, "x"), "x must be an array"),
    (lambda x: zc.compressed_all_gather(x, "x", axis=5), "axis=5 is out of range"),
    (lambda x: zc.compressed_all_gather(x, "nope"), "axis_name 'nope' is not a bound"),
    (lambda x: zc.compressed_all_gather(x, ()), "axis_name must name"),
    (lambda x: zc.compressed_all_gather(x, ("x", "x")), "repeated axes"),
    (lambda x: zc.compressed_all_gather(x, "x", codec="zstd"), "codec must be"),
    (lambda x: zc.compressed_all_gather(x, "x", policy="sometimes"), "policy must be"),
    (lambda x: zc.compressed_all_gather(x, "x", escape_capacity=128), "escape_capacity"),
    (lambda x: zc.compressed_all_gather(x, "x", stats=1), "stats must be a bool"),
    (lambda x: zc.compressed_psum_scatter(x, "x", scatter_dimension=2), "scatter_dimension=2"),
    (lambda x: zc.compressed_psum_scatter(x, "x", tiled=False), "must equal the size"),
    (lambda x: zc.compressed_psum_scatter(x[:, :3], "x", scatter_dimension=1, tiled=True),
     "must be divisible"),
    (lambda x: zc.compressed_all_to_all(x, "x", 0, 3), "concat_axis=3"),
    (lambda x: zc.compressed_all_to_all(x, "x", 1.0, 0), "split_axis must be an int"),
    (lambda x: zc.compressed_ppermute(x, "x", [(0, 8)]), "out of range"),
    (lambda x: zc.compressed_ppermute(x, "x", [(0, 1), (0, 2)]), "must not repeat"),
    (lambda x: zc.compressed_ppermute(x, "x", [0, 1]), "perm must be a sequence"),
])
def test_validation_names_the_argument(mesh8, call, match):
  x = jax.ShapeDtypeStruct((16, 8), jnp.bfloat16)
  with pytest.raises((TypeError, ValueError, NameError), match=match):   # NameError: lax's, for axes
    _trace(mesh8, call, x)


def test_outside_shard_map_is_a_clear_error():
  with pytest.raises(NameError, match="not a bound mesh axis"):   # lax raises NameError too
    zc.compressed_psum(jnp.ones(4, jnp.bfloat16), "x")


# ---- gather / all_to_all / ppermute: bit-identical to lax -------------------------------------

PERM = [(0, 3), (1, 0), (2, 7), (5, 1), (7, 2)]   # partial: 4 and 6 receive nothing


def _gather_family(x, x3, kw):
  b = lambda v: lax.bitcast_convert_type(v, uint(v.dtype))
  ours = (
      zc.compressed_all_gather(x, "x", **kw),
      zc.compressed_all_gather(x, "x", axis=1, tiled=True, **kw),
      zc.compressed_all_gather(x, "x", axis=-1, **kw),
      zc.compressed_all_gather(x, "x", to="invarying", **kw),
      zc.compressed_all_to_all(x, "x", 1, 0, tiled=True, **kw),
      zc.compressed_all_to_all(x3, "x", 1, 2, **kw),
      zc.compressed_all_to_all(x3, "x", 2, 0, **kw) if x3.shape[2] == N else x3,
      zc.compressed_ppermute(x, "x", PERM, **kw),
  )
  theirs = (
      lax.all_gather(b(x), "x"),
      lax.all_gather(b(x), "x", axis=1, tiled=True),
      lax.all_gather(b(x), "x", axis=-1),
      lax.all_gather(b(x), "x", to="invarying"),
      lax.all_to_all(b(x), "x", 1, 0, tiled=True),
      lax.all_to_all(b(x3), "x", 1, 2),
      lax.all_to_all(b(x3), "x", 2, 0) if x3.shape[2] == N else b(x3),
      lax.ppermute(b(x), "x", PERM),
  )
  return ours, theirs


_GATHER_NAMES = ["all_gather", "all_gather tiled axis=1", "all_gather axis=-1",
                 "all_gather to=invarying", "all_to_all tiled", "all_to_all 1->2",
                 "all_to_all 2->0", "ppermute partial"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gather_family_bit_identical(mesh8, dtype):
  x = sprinkle_specials(gaussian((N * 16, 256), dtype, seed=3))
  x3 = x.reshape(N * 16, N, 32)
  outs = tuple([P("x")] * 3 + [P()] + [P("x")] * 4)
  f = smap(mesh8, (P("x"), P("x")), (outs, outs))(
      lambda x, x3: _gather_family(x, x3, ALWAYS))
  ours, theirs = f(x, x3)
  for name, a, b in zip(_GATHER_NAMES, ours, theirs):
    assert a.dtype == dtype, name
    assert_bits_equal(np.asarray(a), np.asarray(b).view(dtype), name)


def test_gather_family_eager_and_codecs(mesh8):
  """Eager shard_map (no jit), and codec="raw" / None / policy="never" agree."""
  x = gaussian((N * 4, 64), BF16, seed=4)
  spec = P("x")
  for kw in (ALWAYS, dict(codec="raw"), dict(codec=None), dict(policy="never")):
    ag = jax.shard_map(lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw),
                       mesh=mesh8, in_specs=spec, out_specs=spec)(x)
    assert ag.shape == (N * N * 4, 64) and ag.dtype == BF16
    assert_bits_equal(np.asarray(ag), np.tile(x, (N, 1)), f"eager all_gather {kw}")
    pp = jax.shard_map(lambda v: zc.compressed_ppermute(v, "x", PERM, **kw),
                       mesh=mesh8, in_specs=spec, out_specs=spec)(x)
    want = np.zeros_like(x)
    for s, d in PERM:
      want[d * 4:(d + 1) * 4] = x[s * 4:(s + 1) * 4]
    assert_bits_equal(np.asarray(pp), want, f"eager ppermute {kw}")


def test_pytree_inputs(mesh8):
  tree = {"w": gaussian((N * 8, 32), BF16, 1), "b": gaussian((N * 4,), F32, 2)}
  f = smap(mesh8, (P("x"),), P())(lambda t: zc.compressed_psum(t, "x", **ALWAYS))
  g = smap(mesh8, (P("x"),), P())(lambda t: zc.compressed_psum(t, "x", codec="raw"))
  got, want = f(tree), g(tree)
  assert set(got) == {"w", "b"}
  for k in tree:
    assert got[k].shape == (8, 32) if k == "w" else (4,)
    assert_bits_equal(np.asarray(got[k]), np.asarray(want[k]), k)


# ---- reductions: rank-ordered float32 sum -------------------------------------------------


def _blocks(x):
  return np.split(np.asarray(x), N, axis=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_reductions_rank_ordered(mesh8, dtype):
  x = gaussian((N * 16, 256), dtype, seed=5, scale=3.0)
  x3 = x.reshape(N * 16, N, 32)

  def body(x, x3):
    ours = (zc.compressed_psum_scatter(x, "x", scatter_dimension=1, tiled=True, **ALWAYS),
            zc.compressed_psum_scatter(x3, "x", scatter_dimension=1, **ALWAYS),
            zc.compressed_psum(x, "x", **ALWAYS))
    raw = (zc.compressed_psum_scatter(x, "x", scatter_dimension=1, tiled=True, codec="raw"),
           zc.compressed_psum_scatter(x3, "x", scatter_dimension=1, codec="raw"),
           zc.compressed_psum(x, "x", codec="raw"))
    lx = (lax.psum_scatter(x, "x", scatter_dimension=1, tiled=True),
          lax.psum_scatter(x3, "x", scatter_dimension=1), lax.psum(x, "x"))
    return ours, raw, lx

  specs = (P("x"), P("x"), P())
  ours, raw, lx = smap(mesh8, (P("x"), P("x")), (specs, specs, specs))(body)(x, x3)
  blocks, blocks3 = _blocks(x), _blocks(x3)
  want_rs = np.concatenate(
      [ordered_sum([b[:, j * 32:(j + 1) * 32] for b in blocks], dtype) for j in range(N)])
  want_rs3 = np.concatenate([ordered_sum([b[:, j] for b in blocks3], dtype) for j in range(N)])
  want_ps = ordered_sum(blocks, dtype)
  for name, got, r, want, l in zip(("psum_scatter tiled", "psum_scatter", "psum"),
                                   ours, raw, (want_rs, want_rs3, want_ps), lx):
    assert got.dtype == dtype and got.shape == want.shape, name
    assert_bits_equal(np.asarray(got), want, f"{name} vs numpy rank-ordered sum")
    assert_bits_equal(np.asarray(got), np.asarray(r), f"{name} vs codec='raw'")
    tol = {BF16: 2e-2, F16: 2e-3, F32: 1e-5}[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(l, np.float32),
                               rtol=tol, atol=tol * 8, err_msg=f"{name} vs lax")


def test_reductions_are_deterministic(mesh8):
  x = gaussian((N * 8, 512), BF16, seed=6)
  f = smap(mesh8, (P("x"),), P())(lambda v: zc.compressed_psum(v, "x", **ALWAYS))
  a, b = np.asarray(f(x)), np.asarray(f(x))
  assert_bits_equal(a, b, "run-to-run")


# ---- overflow on one device -----------------------------------------------------------------


def _all_five(x, kw):
  """Every collective once with stats; results and fell_back flags per device."""
  outs = (
      zc.compressed_all_gather(x, "x", tiled=True, to="invarying", stats=True, **kw),
      zc.compressed_all_to_all(x, "x", 1, 1, tiled=True, stats=True, **kw),
      zc.compressed_ppermute(x, "x", [(i, (i + 1) % N) for i in range(N)], stats=True, **kw),
      zc.compressed_psum_scatter(x, "x", scatter_dimension=1, tiled=True, stats=True, **kw),
      zc.compressed_psum(x, "x", stats=True, **kw),
  )
  ys = tuple(o[0] for o in outs)
  # Every participant reports its own flag (re-typed varying) so the test sees all 8.
  flags = jnp.stack([lax.pcast(o[1].fell_back, "x", to="varying") for o in outs])[None]
  escapes = jnp.stack([o[1].escape_count for o in outs])
  return ys, flags, escapes


def _all_five_reference(x, dtype):
  blocks = _blocks(x)
  a2a = [np.concatenate([np.split(blocks[s], N, axis=1)[d] for s in range(N)], axis=1)
         for d in range(N)]
  pp = [blocks[(d - 1) % N] for d in range(N)]
  rs = [ordered_sum([np.split(b, N, axis=1)[d] for b in blocks], dtype) for d in range(N)]
  return (np.asarray(x), np.concatenate(a2a), np.concatenate(pp), np.concatenate(rs),
          ordered_sum(blocks, dtype))


@pytest.fixture(scope="module")
def all_five_fn(mesh8):
  ys = (P(), P("x"), P("x"), P("x"), P())
  return functools.lru_cache(None)(lambda kw=(): smap(mesh8, (P("x"),), (ys, P("x"), P()))(
      lambda x: _all_five(x, dict(kw))))


@pytest.mark.parametrize("dtype", [BF16, F32], ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["random_bits", "outliers", "zeros", None])
def test_overflow_on_one_device_is_exact(all_five_fn, dtype, kind):
  rows, cols = 16, 2048   # all_to_all rows of 4096 elements: large enough for a ladder
  x = gaussian((N * rows, cols), dtype, seed=11)
  if kind is not None:
    x[5 * rows:6 * rows] = bad_block((rows, cols), dtype, kind)
  # the window codec: its escape count is what overflows here
  ys, flags, escapes = all_five_fn((("policy", "always"), ("codec", "zipccl")))(x)
  flags = np.asarray(flags)
  assert (flags == flags[:1]).all(), f"participants disagree on the fallback: {flags}"
  expect_fallback = kind in ("random_bits", "outliers")
  names = ("all_gather", "all_to_all", "ppermute", "psum_scatter", "psum")
  for name, flag in zip(names, flags[0]):
    assert bool(flag) == expect_fallback, f"{name}: fell_back={flag} for {kind}"
  assert int(np.asarray(escapes)[0]) > 0
  want = _all_five_reference(x, dtype)
  for name, got, w in zip(names, ys, want):
    if name in ("psum_scatter", "psum"):
      assert_same_or_both_nan(np.asarray(got), w, f"{name} with {kind} on device 5")
    else:
      assert_bits_equal(np.asarray(got), w, f"{name} with {kind} on device 5")


def test_stats_fields(mesh8):
  x = gaussian((N * 64, 512), BF16, seed=12)   # 32K elements per device
  f = smap(mesh8, (P("x"),), P())(
      lambda v: zc.compressed_all_gather(v, "x", tiled=True, stats=True, codec="zipccl",
                                         **ALWAYS)[1])
  s = f(x)
  assert isinstance(s, zc.CollectiveStats)
  n = 64 * 512
  assert s.collective == "all_gather" and s.compressed and s.raw_bytes == 2 * n
  assert s.elements == N * n
  assert not bool(s.fell_back) and not bool(s.raw_rung)
  # the slot is the ladder's first rung >= the largest used size of the 8 blocks
  used = max(int(zc.encode(jnp.asarray(b)).used_units) * 128 for b in _blocks(x))
  assert np.asarray(s.used_bytes).tolist() == [used]
  slot = int(np.asarray(s.slot_bytes)[0])
  assert used <= slot <= max(used * 1.02, used + 128)
  assert int(s.wire_bytes) == slot + s.agree_bytes
  assert 1.38 < float(s.ratio) < 1.45
  assert 0.01 < float(s.escape_rate) < 0.035
  # the escape counts summed over the participants equal what the encoder reports
  want = sum(int(zc.encode(jnp.asarray(b)).escape_count) for b in _blocks(x))
  assert int(s.escape_count) == want
  assert "ratio=" in s.summary() and "escape_rate=0.0" in s.summary()


# ---- 2-D mesh: compress over one axis ---------------------------------------------------------


PERM_AB = [(i, (i + 3) % 8) for i in range(5)]


def test_2d_mesh_one_axis_compressed(mesh4x2):
  """x varies over both axes; collectives run over "a" only (groups of 4), and over
  the tuple ("a", "b"). A bad block on one device makes only its "a" group fall back."""
  rows, cols = 8, 1024   # psum_scatter rows of 2048 elements: large enough for a ladder
  x = gaussian((8 * rows, cols), BF16, seed=13)
  bad = 5                                          # device (a=2, b=1)
  x[bad * rows:(bad + 1) * rows] = bad_block((rows, cols), BF16, "random_bits")
  spec = P(("a", "b"))

  def body(x):
    b = lambda v: lax.bitcast_convert_type(v, jnp.uint16)
    ag, s_ag = zc.compressed_all_gather(x, "a", tiled=True, to="invarying", stats=True,
                                        **ALWAYS)
    a2a = zc.compressed_all_to_all(x, "a", 1, 0, tiled=True, **ALWAYS)
    # Partial permutation over the tuple axis: linear indices 0, 1, 2 receive nothing.
    pp = zc.compressed_ppermute(x, ("a", "b"), PERM_AB, **ALWAYS)
    rs, s_rs = zc.compressed_psum_scatter(x, "a", scatter_dimension=1, tiled=True, stats=True,
                                          **ALWAYS)
    ps = zc.compressed_psum(x, "a", **ALWAYS)
    ps_raw = zc.compressed_psum(x, "a", codec="raw")
    ps_ab = zc.compressed_psum(x, ("a", "b"), **ALWAYS)
    ps_ab_raw = zc.compressed_psum(x, ("a", "b"), codec="raw")
    flags = jnp.stack([s_ag.fell_back, s_rs.fell_back])
    flags = lax.pcast(flags, "a", to="varying")[None]
    lx = (lax.all_gather(b(x), "a", tiled=True, to="invarying"),
          lax.all_to_all(b(x), "a", 1, 0, tiled=True),
          lax.ppermute(b(x), ("a", "b"), PERM_AB))
    return (ag, a2a, pp, rs, ps, ps_raw, ps_ab, ps_ab_raw, flags), lx

  out_specs = ((P("b"), spec, spec, spec, P("b"), P("b"), P(), P(), spec), (P("b"), spec, spec))
  (ag, a2a, pp, rs, ps, ps_raw, ps_ab, ps_ab_raw, flags), lx = smap(
      mesh4x2, (spec,), out_specs)(body)(x)
  for name, got, want in zip(("all_gather a", "all_to_all a", "ppermute (a,b)"), (ag, a2a, pp), lx):
    assert_bits_equal(np.asarray(got), np.asarray(want).view(BF16), name)
  assert_bits_equal(np.asarray(ps), np.asarray(ps_raw), "psum over a vs raw")
  assert_bits_equal(np.asarray(ps_ab), np.asarray(ps_ab_raw), "psum over (a,b) vs raw")
  # Reference for psum over "a": blocks with the same b, in a order (device = 2a + b).
  blocks = _blocks(x)
  for bcol in range(2):
    want = ordered_sum([blocks[2 * a + bcol] for a in range(4)], BF16)
    got = np.asarray(ps).reshape(2, rows, cols)[bcol]
    assert_same_or_both_nan(got, want, f"psum over a, b={bcol}")
  flags = np.asarray(flags).reshape(8, 2)          # device order (a, b) -> 2a + b
  assert flags[1::2].all(), "the b=1 group holds the bad block and must fall back"
  assert not flags[0::2].any(), "the b=0 group compresses fine and must not fall back"


# ---- gradients --------------------------------------------------------------------------


def _grads(x, w, kw, lax_twin):
  """Gradients of sum(op(x) * w) inside shard_map, for every collective."""
  perm = [(i, (i + 3) % N) for i in range(N)]
  if lax_twin:
    ops = (lambda v: lax.all_gather(v, "x", tiled=True),
           lambda v: lax.psum_scatter(v, "x", tiled=True),
           lambda v: lax.psum(v, "x"),
           lambda v: lax.all_to_all(v, "x", 1, 0, tiled=True),
           lambda v: lax.ppermute(v, "x", perm))
  else:
    ops = (lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw),
           lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, **kw),
           lambda v: zc.compressed_psum(v, "x", **kw),
           lambda v: zc.compressed_all_to_all(v, "x", 1, 0, tiled=True, **kw),
           lambda v: zc.compressed_ppermute(v, "x", perm, **kw))

  def grad_of(op, wk):
    return jax.grad(lambda v: jnp.sum(op(v).astype(jnp.float32) * wk))(x)

  rows = x.shape[0]
  return (grad_of(ops[0], w),
          grad_of(ops[1], w[:rows // N]),
          grad_of(ops[2], w[:rows]),
          grad_of(ops[3], w.reshape(rows * N, -1)[:, :x.shape[1] // N]),
          grad_of(ops[4], w[:rows]))


def test_gradients(mesh8):
  rows, cols = 16, 128
  x = gaussian((N * rows, cols), BF16, seed=21)
  w = gaussian((N * N * rows, cols), F32, seed=22)
  spec = (P("x"),) * 5
  run = lambda kw, twin: smap(mesh8, (P("x"), P("x")), spec)(
      lambda x, w: _grads(x, w, kw, twin))(x, w)
  ours, raw, lx = run(ALWAYS, False), run(dict(codec="raw"), False), run({}, True)
  names = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
  for name, a, r, l in zip(names, ours, raw, lx):
    assert a.dtype == BF16 and a.shape == x.shape, name
    assert_bits_equal(np.asarray(a), np.asarray(r), f"grad {name} vs codec='raw'")
    if name == "all_gather":
      # Its transpose is our psum_scatter: rank-ordered sum of the cotangents.
      cts = [np.asarray(wb).astype(BF16) for wb in _blocks(w)]
      want = np.concatenate([ordered_sum([c[d * rows:(d + 1) * rows] for c in cts], BF16)
                             for d in range(N)])
      assert_bits_equal(np.asarray(a), want, "grad all_gather vs rank-ordered reference")
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(l, np.float32),
                                 rtol=2e-2, atol=5e-2)
    else:
      assert_bits_equal(np.asarray(a), np.asarray(l), f"grad {name} vs lax")


def test_gradient_runs_compressed_collectives(mesh8):
  """The VJP of all_gather is a compressed psum_scatter: its HLO moves uint8 rows."""
  x = jax.ShapeDtypeStruct((N * 64, 512), jnp.bfloat16)

  def f(x):
    return jax.grad(lambda v: jnp.sum(
        zc.compressed_all_gather(v, "x", tiled=True, **ALWAYS).astype(jnp.float32) ** 2))(x)

  text = jax.jit(jax.shard_map(f, mesh=mesh8, in_specs=P("x"), out_specs=P("x"))) \
      .lower(x).compile().as_text()
  wb = zc.hlo_wire_bytes(text)
  opcodes = sorted({o.opcode for o in wb.ops})
  assert opcodes == ["all-gather", "collective-permute"], opcodes   # agreements: all-gathers
  raw = 2 * 64 * 512
  # forward: all-gather of one row; backward: the cotangent (8 blocks) goes out as
  # 8 rows over one all-to-all, on CPU N - 1 permutes of a row each (the own row
  # stays); each a switch over the slot ladder (uint8 rows, the raw words last)
  # after a 24-byte agreement all-gather.
  rungs = zc.codec_ladder(zc.AUTO_CODEC, BF16, 64 * 512)        # the default codec's
  a2a = zc.codec_ladder(zc.AUTO_CODEC, BF16, 64 * 512, all_to_all=True)
  by_op = {c.opcodes: c.branch_bytes for c in wb.conditionals}
  assert by_op[("all-gather",)] == rungs + (raw,)
  assert by_op[("collective-permute",)] == tuple((N - 1) * r for r in a2a) + ((N - 1) * raw,)
  assert wb.common == rungs[0] + (N - 1) * a2a[0] + 24 + 24
  assert wb.common < (raw + (N - 1) * raw) / 1.38


def test_check_vma_false(mesh8):
  """Without vma tracking JAX transposes psum to psum; we follow."""
  x = gaussian((N * 8, 64), F32, seed=23)

  def f(v, kw, twin):
    op = (lambda u: lax.psum(u, "x")) if twin else (
        lambda u: zc.compressed_psum(u, "x", **kw))
    return jax.grad(lambda u: jnp.sum(op(u) * u))(v)

  run = lambda kw, twin: jax.jit(jax.shard_map(
      functools.partial(f, kw=kw, twin=twin), mesh=mesh8, in_specs=P("x"), out_specs=P("x"),
      check_vma=False))(x)
  ours, lx = run(ALWAYS, False), run({}, True)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(lx), rtol=1e-5, atol=1e-5)


# ---- edge cases -------------------------------------------------------------------------


def test_edge_shapes_and_forced_fallback(mesh8):
  """Odd sizes (psum pads to N rows), scalars, empty arrays, and random bits on
  every device, which send every row on the raw rung: still exact."""
  odd = gaussian((N * 7, 3), BF16, seed=41)
  x = gaussian((N * 16, 1024), F16, seed=42)
  xr = bad_block((N * 16, 1024), F16, "random_bits", seed=43)

  def body(odd, x, xr):
    b = lambda v: lax.bitcast_convert_type(v, jnp.uint16)
    ps_odd = zc.compressed_psum(odd, "x", **ALWAYS)
    ag_scalar = zc.compressed_all_gather(odd[0, 0], "x", to="invarying", **ALWAYS)
    empty = zc.compressed_ppermute(x[:0], "x", PERM, **ALWAYS)
    ag0, s_ag0 = zc.compressed_all_gather(xr, "x", tiled=True, to="invarying", stats=True,
                                          **ALWAYS)
    rs0, s_rs0 = zc.compressed_psum_scatter(xr, "x", scatter_dimension=1, tiled=True,
                                            stats=True, **ALWAYS)
    rs_raw = zc.compressed_psum_scatter(xr, "x", scatter_dimension=1, tiled=True, codec="raw")
    g_inv = jax.grad(lambda v: jnp.sum(zc.compressed_all_gather(
        v, "x", tiled=True, to="invarying", **ALWAYS).astype(jnp.float32) ** 2))(x)
    g_lax = jax.grad(lambda v: jnp.sum(lax.all_gather(
        v, "x", tiled=True, to="invarying").astype(jnp.float32) ** 2))(x)
    return (ps_odd, ag_scalar, empty, ag0, b(lax.all_gather(xr, "x", tiled=True, to="invarying")),
            rs0, rs_raw, g_inv, g_lax, jnp.stack([s_ag0.fell_back, s_rs0.fell_back]))

  outs = (P(), P(), P("x"), P(), P(), P("x"), P("x"), P("x"), P("x"), P())
  (ps_odd, ag_scalar, empty, ag0, ag_lax, rs0, rs_raw, g_inv, g_lax, flags) = smap(
      mesh8, (P("x"), P("x"), P("x")), outs)(body)(odd, x, xr)
  assert ps_odd.shape == (7, 3)
  assert_bits_equal(np.asarray(ps_odd), ordered_sum(_blocks(odd), BF16), "psum of 7x3")
  assert_bits_equal(np.asarray(ag_scalar), odd[::7, 0], "all_gather of a scalar")
  assert empty.shape == (0, 1024)
  assert np.asarray(flags).tolist() == [True, True], "random bits must take the raw rung"
  assert_bits_equal(np.asarray(ag0), np.asarray(ag_lax).view(F16), "all_gather raw rung")
  assert_bits_equal(np.asarray(rs0), np.asarray(rs_raw), "psum_scatter raw rung vs raw")
  assert_bits_equal(np.asarray(g_inv), np.asarray(g_lax), "grad of all_gather to=invarying")


def test_backward_rows_have_their_ladder(mesh8):
  """The collective the VJP runs sizes its rows from the data too: its all-to-all
  switch has the ladder of the cotangent's rows."""
  x = jax.ShapeDtypeStruct((N * 64, 512), jnp.bfloat16)
  m = 64 * 512  # elements of one device's block = one row, forward and backward

  def f(v):
    return jax.grad(lambda u: jnp.sum(zc.compressed_all_gather(
        u, "x", tiled=True, **ALWAYS).astype(jnp.float32) ** 2))(v)

  text = jax.jit(jax.shard_map(f, mesh=mesh8, in_specs=P("x"), out_specs=P("x"))) \
      .lower(x).compile().as_text()
  rungs = zc.codec_ladder(zc.AUTO_CODEC, BF16, m)             # the default codec's ladder
  a2a = zc.codec_ladder(zc.AUTO_CODEC, BF16, m, all_to_all=True)
  by_op = {c.opcodes: c.branch_bytes for c in zc.hlo_wire_bytes(text).conditionals}
  assert by_op[("all-gather",)] == rungs + (2 * m,)
  # backward: the cotangent of the gathered array goes out as N rows of m elements
  # (on CPU N - 1 permutes of a row: the own row stays)
  assert by_op[("collective-permute",)] == tuple((N - 1) * r for r in a2a) + (2 * m * (N - 1),)


def test_backward_pass_on_the_raw_rung_is_exact(mesh8):
  """A backward pass whose rows take the raw rung (random-bit weights make the
  cotangent incompressible) is exact."""
  rows, cols = 16, 128
  x = gaussian((N * rows, cols), BF16, seed=31)
  w = gaussian((N * N * rows, cols), F32, seed=32)

  def grads(x, w, **kw):
    return jax.grad(lambda v: jnp.sum(
        zc.compressed_all_gather(v, "x", tiled=True, **kw).astype(jnp.float32) * w))(x)

  run = lambda **kw: np.asarray(smap(mesh8, (P("x"), P("x")), P("x"))(
      lambda x, w: grads(x, w, **kw))(x, w))
  assert_bits_equal(run(policy="always"), run(codec="raw"), "backward vs raw")
