"""compressed_pcast (the data-parallel pattern) and reductions of invariant values."""
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from tests.reference import assert_bits_equal
from zipccl_jax._src.collectives import buckets

BF16 = np.dtype(ml_dtypes.bfloat16)


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {"w": (rng.standard_normal((512, 256)) * 0.02).astype(BF16),
          "b": (rng.standard_normal(256) * 0.01).astype(np.float32),
          "tiny": np.ones(3, BF16)}


def _loss(p, x):
  h = jnp.tanh(x.astype(jnp.float32) @ p["w"].astype(jnp.float32) + p["b"])
  return jnp.mean(h ** 2) * jnp.sum(p["tiny"].astype(jnp.float32))


def _smap(mesh, f, out=P()):
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("x")), out_specs=out))


def test_grad_through_compressed_pcast_is_the_compressed_psum_of_local_grads(mesh8):
  params = _params()
  x = np.random.default_rng(1).standard_normal((8 * 16, 512)).astype(BF16)

  def via_pcast(p, x):
    return jax.grad(lambda q: _loss(zc.compressed_pcast(q, "x", policy="always"), x))(p)

  def local_then_psum(p, x):
    # local gradients: the params made varying by a varying zero (no psum in the transpose)
    z = jax.lax.pcast(jnp.float32(0), "x", to="varying")
    local = jax.tree.map(lambda v: (v.astype(jnp.float32) + z).astype(v.dtype), p)
    return zc.compressed_psum(jax.grad(_loss)(local, x), "x", policy="always")

  got = _smap(mesh8, via_pcast)(params, x)
  want = _smap(mesh8, local_then_psum)(params, x)
  raw = _smap(mesh8, lambda p, x: jax.grad(
      lambda q: _loss(zc.compressed_pcast(q, "x", codec="raw"), x))(p))(params, x)
  for k in params:
    assert_bits_equal(np.asarray(got[k]), np.asarray(want[k]), k)
    assert_bits_equal(np.asarray(got[k]), np.asarray(raw[k]), f"{k} vs raw")
  # no gradient-sized all-reduce: the sum is the compressed transports'
  text = _smap(mesh8, via_pcast).lower(params, x).compile().as_text()
  assert not [o for o in zc.hlo_wire_bytes(text).ops if o.opcode.startswith("all-reduce")]


def test_compressed_pcast_forward_and_jvp_move_nothing(mesh8):
  w = _params()["w"]
  f = jax.jit(jax.shard_map(lambda p: jax.jvp(lambda q: zc.compressed_pcast(q, "x"), (p,), (2 * p,)),
                            mesh=mesh8, in_specs=P(), out_specs=P("x")))
  y, t = f(w)
  assert_bits_equal(np.asarray(y)[:512], w, "primal")
  assert_bits_equal(np.asarray(t)[:512], (2 * w.astype(np.float32)).astype(BF16), "tangent")
  assert not zc.hlo_wire_bytes(f.lower(w).compile().as_text()).ops


def test_compressed_pcast_other_targets_and_errors():
  with pytest.raises(NameError, match="compressed_pcast: axis_name 'x' is not a bound mesh axis"):
    zc.compressed_pcast(jnp.ones(4), "x")
  with pytest.raises(ValueError, match="compressed_pcast: policy"):
    zc.compressed_pcast(jnp.ones(4), "x", policy="sometimes")


def test_psum_of_an_invariant_value_is_lax_psum_and_warns_once(mesh8, monkeypatch):
  monkeypatch.setattr(buckets, "_warned_invariant", False)
  w = _params()["w"]
  x = np.zeros((8, 512), BF16)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    f = _smap(mesh8, lambda p, _: zc.compressed_psum({"a": p, "b": p[:2]}, "x", policy="always"))
    got = f(w, x)
    _smap(mesh8, lambda p, _: zc.compressed_psum(p, "x", policy="always"))(w, x)
  msgs = [str(c.message) for c in caught if "already invariant" in str(c.message)]
  assert len(msgs) == 1 and "compressed_pcast" in msgs[0]
  want = _smap(mesh8, lambda p, _: jax.lax.psum({"a": p, "b": p[:2]}, "x"))(w, x)
  for k in ("a", "b"):
    assert_bits_equal(np.asarray(got[k]), np.asarray(want[k]), k)
  # the program is lax's (no compressed transport of a value every device already holds)
  ops = lambda g: sorted((o.opcode, o.operand_bytes) for o in zc.hlo_wire_bytes(
      g.lower(w, x).compile().as_text()).ops)
  assert ops(f) == ops(_smap(mesh8, lambda p, _: jax.lax.psum({"a": p, "b": p[:2]}, "x")))


def test_compressed_pcast_of_other_types_is_lax_pcast():
  """to="reduced", and a reduced value cast to varying, are lax.pcast's own casts."""
  from jax.sharding import AxisType, NamedSharding
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x = jax.device_put(jnp.ones((8, 16), jnp.float32), NamedSharding(mesh, P()))

  def body(v):
    r = zc.compressed_pcast(v, "x", to="reduced")
    return zc.compressed_pcast(r, "x", to="varying")

  y = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("x")))(x)
  want = jax.jit(jax.shard_map(
      lambda v: jax.lax.pcast(jax.lax.pcast(v, "x", to="reduced"), "x", to="varying"),
      mesh=mesh, in_specs=P(), out_specs=P("x")))(x)
  np.testing.assert_array_equal(np.asarray(y).view(np.uint32), np.asarray(want).view(np.uint32))
