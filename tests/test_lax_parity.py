"""Drop-in parity of the compressed collectives with jax.lax, on 8 simulated CPU devices.

* Leaves no codec takes (integers, bool, fp8, Python scalars) go through the plain
  lax collective: the same bytes, dtype and shape as lax, for all five collectives,
  alone or inside a pytree next to compressed leaves.
* Forward-mode autodiff (jax.jvp, jax.jacfwd, jvp of grad) works: the tangent of a
  collective is the same compressed collective applied to the tangent; reverse mode
  still runs the compressed transposed collective.
* NaN payloads: the compressed gathers keep every NaN's bits, while lax on XLA:CPU
  canonicalises bf16 NaNs (docs/design.md, "Collectives: semantics").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc

from tests.reference import BF16, F32, assert_bits_equal, gaussian

N = 8
ALWAYS = dict(policy="always")
RING = [(i, (i + 1) % N) for i in range(N)]


def smap(mesh, f, in_specs=P("x"), out_specs=P("x")):
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def assert_bytes_equal(got, want, what=""):
  """Same dtype, shape and bytes (any dtype: bool, ints, fp8 included)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  g, w = got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)
  bad = np.flatnonzero(g != w)
  if bad.size:
    raise AssertionError(f"{what}: {bad.size} bytes differ; first at byte {bad[0]}: "
                         f"got {g[bad[0]]:#04x}, want {w[bad[0]]:#04x}")


def calls(ag, rs, ps, a2a, pp):
  """The five collectives with lax's signatures, as name -> f(v) (one compile per body)."""
  return {"all_gather": lambda v: ag(v, "x", axis=1, tiled=True),
          "psum_scatter": lambda v: rs(v, "x", scatter_dimension=1, tiled=True),
          "psum": lambda v: ps(v, "x"),
          "all_to_all": lambda v: a2a(v, "x", 1, 0, tiled=True),
          "ppermute": lambda v: pp(v, "x", RING)}


def body(fns, names):
  return lambda v: tuple(fns[k](v) for k in names)


LAX = calls(lax.all_gather, lax.psum_scatter, lax.psum, lax.all_to_all, lax.ppermute)
NAMES = tuple(LAX)


def zc_calls(**opts):
  return calls(lambda v, a, **k: zc.compressed_all_gather(v, a, **k, **opts),
               lambda v, a, **k: zc.compressed_psum_scatter(v, a, **k, **opts),
               lambda v, a: zc.compressed_psum(v, a, **opts),
               lambda v, a, s, c, **k: zc.compressed_all_to_all(v, a, s, c, **k, **opts),
               lambda v, a, p: zc.compressed_ppermute(v, a, p, **opts))


# ---- dtypes no codec takes: the plain lax collective ----------------------------------------

PASS_THROUGH = [np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.bool_),
                np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]


def _values(dtype, shape, seed=0):
  rng = np.random.default_rng(seed)
  if dtype == np.bool_:
    return rng.random(shape) < 0.3
  if dtype.kind in "iu":
    return rng.integers(0, 50, shape).astype(dtype)
  return rng.normal(size=shape).astype(dtype)   # fp8: small normal values, no overflow


@pytest.mark.parametrize("dtype", PASS_THROUGH, ids=lambda d: d.name)
def test_other_dtypes_take_the_lax_collective(mesh8, dtype):
  x = jnp.asarray(_values(dtype, (N * 2, N * 4)))
  names = NAMES
  if dtype == np.bool_:  # lax.psum_scatter refuses bool ("add does not accept dtype bool"): so do we
    names = tuple(k for k in NAMES if k != "psum_scatter")
    for fns in (LAX, zc_calls(**ALWAYS)):
      with pytest.raises(TypeError, match="bool"):
        smap(mesh8, body(fns, ("psum_scatter",)), out_specs=(P("x"),))(x)
  specs = tuple(P() if k == "psum" else P("x") for k in names)
  want = smap(mesh8, body(LAX, names), out_specs=specs)(x)
  got = smap(mesh8, body(zc_calls(**ALWAYS), names), out_specs=specs)(x)
  for name, g, w in zip(names, got, want):
    assert_bytes_equal(g, w, f"{name} {dtype.name}")


def test_pytree_with_a_step_counter(mesh8):
  """An int32 step counter next to bf16 gradients: counter as lax, gradients compressed."""
  # rows of 2048 elements per peer: large enough that the ladder has rungs below raw
  g = jnp.asarray(gaussian((N * 4, 4096), BF16, seed=2))
  step = jnp.arange(N, dtype=jnp.int32)

  def f(grads, steps):
    tree = {"g": grads, "step": steps[0], "done": steps[0] > 3}
    out, st = zc.compressed_psum(tree, "x", stats=True, **ALWAYS)
    ref = {"g": zc.compressed_psum(grads, "x", codec="raw"), "step": lax.psum(steps[0], "x"),
           "done": lax.psum(steps[0] > 3, "x")}
    return out, ref, st

  run = jax.shard_map(f, mesh=mesh8, in_specs=(P("x"), P("x")), out_specs=(P(), P(), P()))
  out, ref, st = jax.jit(run)(g, step)
  assert_bits_equal(out["g"], ref["g"], "gradients")
  assert_bytes_equal(out["step"], ref["step"], "step")
  assert_bytes_equal(out["done"], ref["done"], "done (bool: lax.psum counts, as int32)")
  assert int(out["step"]) == sum(range(N))
  # stats: the gradient leaf was compressed, the counter went through lax (codec None)
  assert (st["g"].compressed, st["g"].codec) == (True, zc.AUTO_CODEC)
  assert (st["step"].compressed, st["step"].codec, st["done"].codec) == (False, None, None)


@pytest.mark.parametrize("scalar", [1, 2.5, True], ids=["int", "float", "bool"])
def test_python_scalar_psum_is_the_axis_size_idiom(mesh8, scalar):
  """compressed_psum(1, "x") is the axis size, as lax.psum(1, "x")."""
  x = jnp.zeros((N, 4), jnp.float32)
  got = smap(mesh8, lambda v: zc.compressed_psum(scalar, "x"), out_specs=P())(x)
  want = smap(mesh8, lambda v: lax.psum(scalar, "x"), out_specs=P())(x)
  assert_bytes_equal(got, want, f"psum({scalar!r})")
  assert got == N * scalar


def test_python_scalar_outside_jit_is_lax_too(mesh8):
  """Eager shard_map (no jit): lax folds psum of a constant to size * x."""
  f = jax.shard_map(lambda v: (zc.compressed_psum(1, "x"), lax.psum(1, "x")), mesh=mesh8,
                    in_specs=P("x"), out_specs=(P(), P()))
  a, b = f(jnp.zeros((N,), jnp.float32))
  assert int(a) == int(b) == N


# ---- forward-mode autodiff ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [BF16, F32], ids=lambda d: d.name)
def test_jvp_is_the_collective_of_the_tangent(mesh8, dtype):
  """jax.jvp: the primal and the tangent are the compressed collective of x and of t."""
  x = jnp.asarray(gaussian((N * 4, 512), dtype, seed=3))
  t = jnp.asarray(gaussian((N * 4, 512), dtype, seed=4, scale=1e-3))
  fns = zc_calls(**ALWAYS)

  def jvps(v, w):
    out = {}
    for name, f in fns.items():
      y, ty = jax.jvp(f, (v,), (w,))
      out[name] = (y, ty, f(v), f(w))
    return out

  specs = {k: (P() if k == "psum" else P("x"),) * 4 for k in fns}
  got = jax.jit(jax.shard_map(jvps, mesh=mesh8, in_specs=(P("x"), P("x")),
                              out_specs=specs))(x, t)
  for name, (y, ty, fy, ft) in got.items():
    assert_bits_equal(y, fy, f"{name} primal")
    assert_bits_equal(ty, ft, f"{name} tangent")


def test_jvp_outside_jit_and_jacfwd(mesh8):
  """jax.jvp / jax.jacfwd applied to the jitted shard_map (the usual way to call them)."""
  x = jnp.asarray(gaussian((N * 2, 256), F32, seed=5))
  t = jnp.asarray(gaussian((N * 2, 256), F32, seed=6))
  f = smap(mesh8, lambda v: zc.compressed_all_gather(v, "x", tiled=True, **ALWAYS))
  g = smap(mesh8, lambda v: lax.all_gather(v, "x", tiled=True))
  y, ty = jax.jvp(f, (x,), (t,))
  y2, ty2 = jax.jvp(g, (x,), (t,))
  assert_bits_equal(y, y2, "primal")
  assert_bits_equal(ty, ty2, "tangent")
  small = jnp.asarray(gaussian((N, 2), F32, seed=7))
  h = smap(mesh8, lambda v: zc.compressed_psum(v, "x"), out_specs=P())
  jac = jax.jacfwd(h)(small)                 # d psum / dx: ones where the columns match
  jac_lax = jax.jacfwd(smap(mesh8, lambda v: lax.psum(v, "x"), out_specs=P()))(small)
  assert_bits_equal(jac, jac_lax, "jacfwd of psum")
  assert float(jnp.sum(jac)) == 2 * N


def test_second_order_forward_mode_through_every_collective(mesh8):
  """jacfwd of jacfwd and a jvp of a jvp go through every compressed collective, as
  through lax's: of f(v) = sin(C(v)) * C(v), the second derivatives are bit-equal to
  the same function with codec="raw" (the same rank-order sums) and, for the
  collectives that move data without summing it, to lax. (jit outside the
  jacfwds; docs/sharp-bits.md has the one case that differs.)"""
  x = jnp.asarray(gaussian((N, N), F32, seed=11))
  t = jnp.asarray(gaussian((N, N), F32, seed=12))
  fns = {"zipccl": zc_calls(**ALWAYS), "raw": zc_calls(codec="raw", **ALWAYS), "lax": LAX}

  def second(kind, name):
    c = fns[kind][name]
    f = jax.shard_map(lambda v: jnp.sin(c(v)) * c(v), mesh=mesh8, in_specs=P("x"),
                      out_specs=P() if name == "psum" else P("x"))
    hess = jax.jit(jax.jacfwd(jax.jacfwd(f)))(x)
    jvp2 = jax.jit(lambda u: jax.jvp(lambda w: jax.jvp(f, (w,), (t,))[1], (u,), (t,))[1])(x)
    return hess, jvp2

  for name in LAX:
    got = second("zipccl", name)
    for ref in ("raw",) + (() if name in ("psum", "psum_scatter") else ("lax",)):
      want = second(ref, name)
      assert_bits_equal(got[0], want[0], f"{name}: jacfwd(jacfwd) vs {ref}")
      assert_bits_equal(got[1], want[1], f"{name}: jvp of jvp vs {ref}")


def test_reverse_mode_still_compressed_and_hvp(mesh8):
  """grad keeps the compressed transposed collective (bit-equal to codec="raw", and an
  all-to-all of uint8 rows in the HLO: on CPU N - 1 collective permutes); jvp of grad
  (Hessian-vector product) works."""
  x = jnp.asarray(gaussian((N * 4, 512), F32, seed=8))
  t = jnp.asarray(gaussian((N * 4, 512), F32, seed=9))

  def loss(codec):
    return lambda u: jnp.sum(jnp.sin(zc.compressed_all_gather(u, "x", tiled=True, codec=codec,
                                                              **ALWAYS)))

  def grads(v, w):
    return (jax.grad(loss("zipccl"))(v), jax.grad(loss("raw"))(v),
            jax.jvp(jax.grad(loss("zipccl")), (v,), (w,))[1],
            jax.jvp(jax.grad(loss("raw")), (v,), (w,))[1])

  f = jax.jit(jax.shard_map(grads, mesh=mesh8, in_specs=(P("x"), P("x")),
                            out_specs=(P("x"),) * 4))
  g, g_raw, hvp, hvp_raw = f(x, t)
  assert_bits_equal(g, g_raw, "grad")
  assert_bits_equal(hvp, hvp_raw, "hvp")
  grad_only = jax.jit(jax.shard_map(lambda v: jax.grad(loss("zipccl"))(v), mesh=mesh8,
                                    in_specs=P("x"), out_specs=P("x")))
  ops = zc.hlo_wire_bytes(grad_only.lower(x).compile().as_text()).ops
  raw = N * 4 * 512 * 4   # the cotangent block of one device, as uint32 words
  # the all-to-all transport's smallest rung: on CPU N - 1 permutes of compressed rows
  # (row_ops.a2a_slot), fewer bytes than the N - 1 raw rows
  sent = sum(o.operand_bytes for o in ops if o.opcode == "collective-permute" and o.path == "common")
  assert 0 < sent < raw * (N - 1) // N, [(o.opcode, o.path, o.operand_bytes) for o in ops]


# ---- NaN payloads: kept, where lax on CPU canonicalises -------------------------------------


def test_nan_payloads_are_kept(mesh8):
  """The compressed gathers return every NaN's exact bits; lax on XLA:CPU does not for bf16.

  XLA:CPU moves a bf16 collective as f32 and converts back, which turns every bf16 NaN
  into the canonical quiet NaN of its sign (0x7fc1, 0x7f81 -> 0x7fc0; 0xffc3 -> 0xffc0).
  The library moves bits and keeps them (docs/design.md, "Collectives: semantics"): its result is
  the lax op applied to the uint16 words.
  """
  words = np.array([0x7fc1, 0x7f81, 0xffc3, 0x7fff, 0xffa5, 0x7fc0, 0x3f80, 0x8000], np.uint16)
  x = jnp.asarray(np.resize(words, (N * 2, 64)).view(BF16))
  ops = ("all_gather", "all_to_all", "ppermute")
  zipccl = zc_calls(**ALWAYS)

  def run(v):
    u = lax.bitcast_convert_type(v, jnp.uint16)
    return {k: (zipccl[k](v), LAX[k](u), LAX[k](v)) for k in ops}

  got = smap(mesh8, run, out_specs={k: (P("x"),) * 3 for k in ops})(x)
  for name, (kept, bits, plain) in got.items():
    assert_bits_equal(kept, np.asarray(bits).view(BF16), f"{name}: payloads kept")
    lax_nans = {w for w in np.asarray(plain).view(np.uint16).reshape(-1).tolist()
                if w & 0x7f80 == 0x7f80 and w & 0x7f}
    if jax.default_backend() == "cpu":   # documents lax's behaviour on XLA:CPU
      assert lax_nans == {0x7fc0, 0xffc0}, f"{name}: lax gave {sorted(map(hex, lax_nans))}"


# ---- autodiff through jit, checkpoint and scan -----------------------------------------------

WRAPS = {
    "plain": lambda f: f,
    "jit": jax.jit,
    "checkpoint": jax.checkpoint,
    "scan": lambda f: (lambda v: lax.scan(lambda c, _: (c, f(v)), 0.0, None, length=1)[1][0]),
}


def test_grad_through_jit_checkpoint_and_scan(mesh8):
  """jax.grad of a loss whose collective sits inside an inner jax.jit, jax.checkpoint
  (remat) or lax.scan, for all five collectives: JAX traces the collective's JVP
  rule into a jaxpr there and transposes it later (before: "Transpose rule for
  'custom_vjp_call' not implemented"). The gradient is bit-equal to the plain one
  and to codec="raw"'s; jax.jvp through the same wrappers gives the collective of
  the tangent; jax.vmap of the checkpointed grad equals the grad row by row."""
  x = jnp.asarray(gaussian((N * 4, 256), F32, seed=11))
  t = jnp.asarray(gaussian((N * 4, 256), F32, seed=12))
  names = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")

  def loss(name, codec, wrap):
    op = zc_calls(codec=codec, **ALWAYS)[name]
    inner = WRAPS[wrap](lambda v: jnp.sum(jnp.sin(op(v))))
    return lambda v: lax.psum(inner(v), "x")

  def grads(v, w):
    out = {}
    for name in names:
      for wrap in WRAPS:
        out[name, wrap] = jax.grad(loss(name, "zipccl", wrap))(v)
        out[name, wrap, "jvp"] = jax.jvp(loss(name, "zipccl", wrap), (v,), (w,))[1]
      out[name, "raw"] = jax.grad(loss(name, "raw", "checkpoint"))(v)
    return out

  keys = [(n, w) for n in names for w in WRAPS] + [(n, w, "jvp") for n in names for w in WRAPS] + \
      [(n, "raw") for n in names]
  specs = {k: (P() if len(k) == 3 else P("x")) for k in keys}
  got = jax.jit(jax.shard_map(grads, mesh=mesh8, in_specs=(P("x"), P("x")),
                              out_specs=specs))(x, t)
  for name in names:
    for wrap in WRAPS:
      assert_bits_equal(got[name, wrap], got[name, "plain"], f"grad {name} {wrap}")
      assert_bits_equal(got[name, wrap, "jvp"], got[name, "plain", "jvp"], f"jvp {name} {wrap}")
    assert_bits_equal(got[name, "raw"], got[name, "plain"], f"grad {name} raw")

  # vmap of grad of a checkpointed collective: batched forward and batched transpose.
  xs = jnp.stack([x, t])
  per = jax.jit(jax.shard_map(
      lambda vs: jax.vmap(jax.grad(loss("all_gather", "zipccl", "checkpoint")))(vs),
      mesh=mesh8, in_specs=P(None, "x"), out_specs=P(None, "x")))(xs)
  one = jax.jit(jax.shard_map(jax.grad(loss("all_gather", "zipccl", "plain")), mesh=mesh8,
                              in_specs=P("x"), out_specs=P("x")))
  assert_bits_equal(per[0], one(x), "vmap grad row 0")
  assert_bits_equal(per[1], one(t), "vmap grad row 1")


def test_vmap_over_each_collective_and_its_grad(mesh8):
  """jax.vmap over every compressed collective on rows that take the slot ladder
  (bf16, 4 x 2048 per member): each batch member's result is bit-equal to the
  collective of that member alone, forward and under grad (inside jax.checkpoint
  and after a psum of the loss, where the tangent is a linear_call whose callee JAX
  batches). Before: the ladder's custom calls had no batching ("vmap is only
  supported for the ffi_call primitive when vmap_method is ..."); the tests only
  met rows too small to compress."""
  xs = jnp.asarray(gaussian((3, N * 4, 2048), BF16, seed=21))
  names = ("all_gather", "psum_scatter", "psum", "all_to_all", "ppermute")
  ops = zc_calls(**ALWAYS)

  def body(vs):
    out = {}
    for name in names:
      op = ops[name]
      loss = lambda v, op=op: lax.psum(jax.checkpoint(lambda u: jnp.sum(jnp.sin(op(u).astype(F32))))(v), "x")
      out[name, "vmap"] = jax.vmap(op)(vs)[None]
      out[name, "each"] = jnp.stack([op(vs[i]) for i in range(vs.shape[0])])[None]
      out[name, "grad"] = jax.vmap(jax.grad(loss))(vs)[None]
      out[name, "grad each"] = jnp.stack([jax.grad(loss)(vs[i]) for i in range(vs.shape[0])])[None]
    return out

  got = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P(None, "x"), out_specs=P("x")))(xs)
  assert zc.codec_ladder("zipccl", BF16, 4 * 2048)   # these rows do take compressed rungs
  for name in names:
    assert_bits_equal(got[name, "vmap"], got[name, "each"], f"vmap {name}")
    assert_bits_equal(got[name, "grad"], got[name, "grad each"], f"vmap grad {name}")


# ---- JAX's reduced / unreduced types -----------------------------------------------------------

def test_reduced_and_unreduced_types_take_lax():
  """Values typed unreduced (a sum pending over the axis) or reduced go to lax's own
  collective: psum / psum_scatter of an unreduced value equal lax's bit for bit,
  all_gather(to="reduced") is lax's, and the collectives lax refuses an unreduced
  value for raise lax's error (ValueError)."""
  from jax.sharding import AxisType, NamedSharding
  mesh = jax.make_mesh((N,), ("x",), axis_types=(AxisType.Explicit,))
  x = jax.device_put(jnp.asarray(gaussian((N * 4, 256), BF16, seed=13)), NamedSharding(mesh, P("x")))
  unreduced = lambda v: lax.pcast(v, "x", to="unreduced")

  def both(zc_f, lax_f, out_specs):
    run = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=out_specs))(x)
    return run(zc_f), run(lax_f)

  got, want = both(lambda v: zc.compressed_psum(unreduced(v), "x", **ALWAYS),
                   lambda v: lax.psum(unreduced(v), "x"), P())
  assert_bits_equal(got, want, "psum of unreduced")
  got, want = both(
      lambda v: zc.compressed_psum_scatter(unreduced(v), "x", scatter_dimension=1, tiled=True,
                                           **ALWAYS),
      lambda v: lax.psum_scatter(unreduced(v), "x", scatter_dimension=1, tiled=True), P("x"))
  assert_bits_equal(got, want, "psum_scatter of unreduced")
  got, want = both(lambda v: zc.compressed_all_gather(v, "x", tiled=True, to="reduced", **ALWAYS),
                   lambda v: lax.all_gather(v, "x", tiled=True, to="reduced"), P(reduced={"x"}))
  assert_bits_equal(got, want, "all_gather to reduced")
  assert "x" in str(jax.typeof(got))
  ring = [(i, (i + 1) % N) for i in range(N)]
  for f in (lambda v: zc.compressed_ppermute(unreduced(v), "x", ring, **ALWAYS),
            lambda v: zc.compressed_all_gather(unreduced(v), "x", tiled=True, **ALWAYS),
            lambda v: zc.compressed_all_to_all(unreduced(v), "x", 1, 0, tiled=True, **ALWAYS)):
    with pytest.raises(ValueError, match="unreduced"):
      jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(x)
