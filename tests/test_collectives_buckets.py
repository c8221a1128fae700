"""Pytrees through the compressed collectives: small leaves packed into buckets
that share a transport give the bits of every leaf alone (and of lax / numpy), in
the forward and backward passes, on 8 simulated CPU devices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from tests.jaxtest import smap
from tests.reference import (BF16, F16, F32, assert_bits_equal, assert_same_or_both_nan, gaussian,
                             sprinkle_specials)

N = 8
ALWAYS = dict(policy="always")



def _trace(mesh, f, x):
  return jax.eval_shape(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")), x)


# ---- buckets: small leaves of a pytree share a transport --------------------------------


def _bucket_tree():
  """Leaves of three dtypes and odd shapes, specials included, an int counter and an
  empty array: every leaf's first dimension splits over the 8 devices in 8 rows."""
  t = {"w": sprinkle_specials(gaussian((N * 8, 24), BF16, 31), seed=3),
       "b": sprinkle_specials(gaussian((N * 8, 5), BF16, 32), seed=4),
       "h": sprinkle_specials(gaussian((N * 8, 3, 8), F16, 33), seed=5),
       "s": sprinkle_specials(gaussian((N * 16, 8), F32, 34), seed=6),
       "v": sprinkle_specials(gaussian((N * 8, 40), BF16, 35), seed=7),
       "step": np.arange(N * 8, dtype=np.int32).reshape(N * 8, 1),
       "empty": np.zeros((N * 8, 0), BF16)}
  return t


def _bucket_ops(kw):
  """The five collectives on a pytree, with non-trivial axes where they have them."""
  perm = [(i, (i + 3) % N) for i in range(N)]
  return {
      "all_gather": (lambda t: zc.compressed_all_gather(t, "x", axis=1, tiled=True, **kw),
                     lambda t: jax.tree_util.tree_map(
                         lambda v: lax.all_gather(v, "x", axis=1, tiled=True), t)),
      "all_gather_stacked": (lambda t: zc.compressed_all_gather(t, "x", axis=0, **kw),
                             lambda t: jax.tree_util.tree_map(
                                 lambda v: lax.all_gather(v, "x", axis=0), t)),
      "psum_scatter": (lambda t: zc.compressed_psum_scatter(t, "x", tiled=True, **kw), None),
      "psum": (lambda t: zc.compressed_psum(t, "x", **kw), None),
      "all_to_all": (lambda t: zc.compressed_all_to_all(t, "x", 0, 0, tiled=True, **kw),
                     lambda t: jax.tree_util.tree_map(
                         lambda v: lax.all_to_all(v, "x", 0, 0, tiled=True), t)),
      "ppermute": (lambda t: zc.compressed_ppermute(t, "x", perm, **kw),
                   lambda t: jax.tree_util.tree_map(lambda v: lax.ppermute(v, "x", perm), t)),
  }


def test_buckets_give_the_bits_of_leaf_by_leaf(mesh8):
  """Packed (the default) == every leaf alone, word for word, for all five
  collectives and every leaf (alone is checked against numpy in
  test_collectives.py); gathers, all_to_all and permute also equal lax (but for NaN
  payloads, which lax canonicalises), psum_scatter / psum equal codec="raw" (the
  rank-ordered sum is element-wise)."""
  tree = _bucket_tree()
  spec = jax.tree_util.tree_map(lambda _: P("x"), tree)
  for name, (op, twin) in _bucket_ops(ALWAYS).items():
    out = P() if name == "psum" else P("x")
    run = lambda f: smap(mesh8, (spec,), jax.tree_util.tree_map(lambda _: out, tree))(f)(tree)
    packed = run(op)
    alone = run(_bucket_ops(dict(ALWAYS, bucket_bytes=0))[name][0])
    raw = run(_bucket_ops(dict(codec="raw"))[name][0])
    # (lax rejects the empty leaf in some of these ops: it is compared with alone only)
    nonempty = {k: v for k, v in tree.items() if v.size}
    want = raw if twin is None else smap(
        mesh8, (jax.tree_util.tree_map(lambda _: P("x"), nonempty),),
        jax.tree_util.tree_map(lambda _: out, nonempty))(twin)(nonempty)
    for k in tree:
      assert packed[k].dtype == tree[k].dtype, (name, k)
      assert_bits_equal(np.asarray(packed[k]), np.asarray(alone[k]), f"{name} {k} packed/alone")
      if k in want and twin is None:
        assert_bits_equal(np.asarray(packed[k]), np.asarray(want[k]), f"{name} {k} vs raw")
      elif k in want:    # lax on XLA:CPU canonicalises bf16 NaN payloads; ours keep them
        assert_same_or_both_nan(np.asarray(packed[k]), np.asarray(want[k]), f"{name} {k} vs lax")


def _conditionals(mesh, f, tree, out):
  spec = jax.tree_util.tree_map(lambda _: P("x"), tree)
  text = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(spec,), out_specs=jax.tree_util.tree_map(
      lambda _: out, tree))).lower(tree).compile().as_text()
  return zc.hlo_wire_bytes(text)


def test_buckets_pack_small_leaves_into_one_transport(mesh8):
  """12 bf16 leaves of 4 KiB per device: one ladder (switch) with the default
  bucket, two with a limit of 6 leaves' bytes, twelve alone; and policy="auto"
  compresses the packed 48 KiB rows... only when they reach its 64 KiB row rule."""
  tree = {f"l{i:02d}": jax.ShapeDtypeStruct((N * 64, 32), jnp.bfloat16) for i in range(12)}
  gather = lambda kw: (lambda t: zc.compressed_all_gather(t, "x", tiled=True, **kw))
  count = lambda kw: len(_conditionals(mesh8, gather(kw), tree, P("x")).conditionals)
  assert count(ALWAYS) == 1
  assert count(dict(ALWAYS, bucket_bytes=6 * 4096)) == 2
  assert count(dict(ALWAYS, bucket_bytes=6 * 4096 - 1)) == 3    # 5 + 5 + 2 leaves
  assert count(dict(ALWAYS, bucket_bytes=0)) == 12
  assert count(dict(ALWAYS, stats=False, bucket_bytes=4096)) == 12   # a leaf of the limit: alone
  # policy="auto" (no calibration): 4 KiB rows alone are not compressed; 12 of them
  # packed are a 48 KiB row (< 64 KiB): not either; 20 leaves are 80 KiB: compressed.
  assert count({}) == 0 and count(dict(bucket_bytes=0)) == 0
  tree = {f"l{i:02d}": jax.ShapeDtypeStruct((N * 64, 32), jnp.bfloat16) for i in range(20)}
  assert count({}) == 1


def test_bucket_groups_fill_in_leaf_order_per_dtype():
  from zipccl_jax._src.collectives import buckets as C
  item = lambda n, dt: C.Item(np.zeros(n, dt), None)
  items = list(enumerate([item(10, BF16), item(4, F32), item(30, BF16), item(2, BF16),
                          item(100, BF16), item(4, F32), item(1, BF16)]))
  # limit 64 bytes: bf16 leaves of 20, 60, 4, 200 (alone), 2 bytes; f32 of 16, 16.
  # 20 + 60 > 64 starts a bucket at leaf 2; 60 + 4 = 64 fits; + 2 does not.
  assert C._bucket_groups(items, 64) == [[0], [1, 5], [2, 3], [4], [6]]
  assert C._bucket_groups(items, 66) == [[0], [1, 5], [2, 3, 6], [4]]
  assert C._bucket_groups(items, 0) == [[i] for i in range(7)]


def test_buckets_gradients_equal_leaf_by_leaf(mesh8):
  """jax.grad through packed collectives: the same bits as leaf by leaf."""
  tree = {k: v for k, v in _bucket_tree().items() if k not in ("step", "empty")}
  spec = jax.tree_util.tree_map(lambda _: P("x"), tree)

  def loss(op):
    def f(t):
      y = op(t)
      return sum(jnp.sum(v.astype(jnp.float32) * (1.0 + jnp.arange(v.size, dtype=jnp.float32)
                                                  .reshape(v.shape) / 97.0))
                 for v in jax.tree_util.tree_leaves(y))
    return f

  for name, (op, _) in _bucket_ops(ALWAYS).items():
    alone_op = _bucket_ops(dict(ALWAYS, bucket_bytes=0))[name][0]
    g = lambda o: smap(mesh8, (spec,), spec)(jax.grad(loss(o)))(tree)
    packed, alone = g(op), g(alone_op)
    for k in tree:
      assert_bits_equal(np.asarray(packed[k]), np.asarray(alone[k]), f"grad {name} {k}")
    # forward mode: the tangent goes through the same (bucketed) collective
    out = P() if name == "psum" else P("x")
    jvp = lambda o: smap(mesh8, (spec,), jax.tree_util.tree_map(lambda _: out, tree))(
        lambda t: jax.jvp(o, (t,), (jax.tree_util.tree_map(lambda v: v * 2, t),))[1])(tree)
    packed, alone = jvp(op), jvp(alone_op)
    for k in tree:
      assert_bits_equal(np.asarray(packed[k]), np.asarray(alone[k]), f"jvp {name} {k}")


def test_buckets_gradients_without_vma_checks(mesh8):
  """check_vma=False: psum's cotangent is summed again (bucketed too)."""
  tree = {"a": gaussian((N * 8, 16), BF16, 41), "b": gaussian((N * 8, 3), BF16, 42)}
  spec = jax.tree_util.tree_map(lambda _: P("x"), tree)
  loss = lambda kw: lambda t: sum(jnp.sum(v.astype(jnp.float32) ** 2) for v in
                                  jax.tree_util.tree_leaves(zc.compressed_psum(t, "x", **kw)))
  g = lambda kw: smap(mesh8, (spec,), spec, check_vma=False)(jax.grad(loss(kw)))(tree)
  packed, alone = g(ALWAYS), g(dict(ALWAYS, bucket_bytes=0))
  for k in tree:
    assert_bits_equal(np.asarray(packed[k]), np.asarray(alone[k]), f"grad psum {k}, no vma")


@pytest.mark.parametrize("value, err, match", [
    (-1, ValueError, "bucket_bytes must be >= 0"),
    ("4M", TypeError, "bucket_bytes must be an int"),
    (True, TypeError, "bucket_bytes must be an int"),
])
def test_bucket_bytes_validation(mesh8, value, err, match):
  x = jax.ShapeDtypeStruct((16, 8), jnp.bfloat16)
  for call in (lambda v: zc.compressed_psum(v, "x", bucket_bytes=value),
               lambda v: zc.compressed_all_gather(v, "x", bucket_bytes=value),
               lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, bucket_bytes=value),
               lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, bucket_bytes=value),
               lambda v: zc.compressed_ppermute(v, "x", [(0, 1)], bucket_bytes=value)):
    with pytest.raises(err, match=match):
      _trace(mesh8, call, x)


@pytest.mark.parametrize("codec", ["zipccl", "raw"])
def test_empty_leaf_moves_nothing_and_has_lax_shape(mesh8, codec):
  """An empty leaf alone: lax's result shape and dtype (jax.eval_shape of the lax
  op), zero wire bytes in the stats and no collective in the compiled program
  (jax >= 0.11 rejects an empty all-gather; jaxlib 0.11.2 crashed on an empty raw
  transport), for all five collectives, and its gradient is empty too."""
  x = np.zeros((N * 8, 0), BF16)
  perm = [(i, (i + 1) % N) for i in range(N)]
  kw = dict(codec=codec, policy="always")
  ops = {
      "all_gather": (lambda v, **k: zc.compressed_all_gather(v, "x", axis=1, tiled=True, **k),
                     lambda v: lax.all_gather(v, "x", axis=1, tiled=True), P("x")),
      "psum_scatter": (lambda v, **k: zc.compressed_psum_scatter(v, "x", tiled=True, **k),
                       lambda v: lax.psum_scatter(v, "x", tiled=True), P("x")),
      "psum": (lambda v, **k: zc.compressed_psum(v, "x", **k), lambda v: lax.psum(v, "x"), P()),
      "all_to_all": (lambda v, **k: zc.compressed_all_to_all(v, "x", 0, 1, tiled=True, **k),
                     lambda v: lax.all_to_all(v, "x", 0, 1, tiled=True), P("x")),
      "ppermute": (lambda v, **k: zc.compressed_ppermute(v, "x", perm, **k),
                   lambda v: lax.ppermute(v, "x", perm), P("x")),
  }
  for name, (op, twin, out) in ops.items():
    f = smap(mesh8, (P("x"),), (out, P()))(lambda v: op(v, stats=True, **kw))
    want = jax.eval_shape(smap(mesh8, (P("x"),), out)(twin), x)
    y, st = f(x)
    assert y.shape == want.shape and y.dtype == want.dtype, (name, y.shape, want.shape)
    assert int(np.max(st.wire_bytes)) == 0, name
    text = jax.jit(f).lower(x).compile().as_text()
    assert not any(c in text for c in ("all-gather", "all-to-all", "collective-permute",
                                       "all-reduce", "custom-call")), name
    g = jax.grad(lambda v: jnp.sum(smap(mesh8, (P("x"),), out)(lambda u: op(u, **kw))(v)
                                   .astype(jnp.float32)))(x)
    assert g.shape == x.shape and g.dtype == x.dtype, name
