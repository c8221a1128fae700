"""zipccl_row_unpack: a bucket's rows cut back into its leaves' rows by one custom call.

Checked against numpy slicing for every dtype the buckets carry (words of 1, 2 and 4
bytes), leading dimensions, padding past the last leaf, empty pieces and jax.vmap;
bad shapes are errors naming the target; a bucketed collective of many leaves
compiles no slice per leaf.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import row_ops


def _expected(x, widths):
  offs = np.concatenate([[0], np.cumsum(widths)]).astype(int)
  return [x[..., a:b] for a, b in zip(offs[:-1], offs[1:])]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("shape", [(37,), (3, 41), (2, 3, 29)])
def test_unpack_equals_slices(dtype, shape):
  rng = np.random.default_rng(0)
  x = rng.integers(0, np.iinfo(dtype).max, size=shape, dtype=dtype)
  total = shape[-1]
  widths = [5, 0, 11, 1, total - 20]                 # an empty piece, 3 words of padding
  got = jax.jit(lambda v: row_ops.unpack(v, widths))(jnp.asarray(x))
  for g, w in zip(got, _expected(x, widths)):
    assert g.dtype == x.dtype and g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g), w)


def test_unpack_under_vmap():
  x = np.arange(4 * 3 * 20, dtype=np.uint16).reshape(4, 3, 20)
  widths = [7, 13]
  got = jax.jit(jax.vmap(lambda v: row_ops.unpack(v, widths)))(jnp.asarray(x))
  for g, w in zip(got, _expected(x, widths)):
    np.testing.assert_array_equal(np.asarray(g), w)


def test_bad_shapes_are_errors_naming_the_target():
  x = jnp.zeros((2, 10), jnp.uint16)

  def call(outs):
    return jax.jit(lambda v: jax.ffi.ffi_call("zipccl_row_unpack", outs,
                                              vmap_method="broadcast_all")(v))(x)

  row_ops.unpack(x, [10])   # registers the targets
  with pytest.raises(Exception, match="zipccl_row_unpack: the results' widths add up to 11"):
    call([jax.ShapeDtypeStruct((2, 6), jnp.uint16), jax.ShapeDtypeStruct((2, 5), jnp.uint16)])
  with pytest.raises(Exception, match="zipccl_row_unpack: result 0 must have x's leading"):
    call([jax.ShapeDtypeStruct((3, 4), jnp.uint16)])
  with pytest.raises(Exception, match="zipccl_row_unpack: result 0 must have x's leading"):
    call([jax.ShapeDtypeStruct((2, 4), jnp.uint32)])


def test_a_bucket_of_many_leaves_compiles_no_slice_per_leaf(mesh8):
  """A bucketed psum of 64 leaves: the leaves come out of one unpack call per
  collective, not one XLA slice each (each would be a kernel for XLA:CPU to compile)."""
  leaves = [jnp.zeros((8 * (64 + 8 * i),), jnp.bfloat16) for i in range(64)]
  f = jax.jit(jax.shard_map(lambda g: zc.compressed_psum(g, "x", policy="always"), mesh=mesh8,
                            in_specs=P("x"), out_specs=P()))
  text = f.lower(leaves).compile().as_text()
  assert text.count('custom_call_target="zipccl_row_unpack"') >= 1
  assert len(re.findall(r"= \S+ slice\(", text)) < 64
  got = f(leaves)
  assert all(g.shape == (l.shape[0] // 8,) for g, l in zip(got, leaves))
