"""zipccl_row_sum: the reductions' ordered sum as one custom call on CPU backends.

Checked word for word against the XLA chain of adds it replaces (`ordered_sum_xla`,
compiled by XLA:CPU) and against the numpy reference that sums in the same order,
for every dtype, peer counts 1..9, special values (NaNs, infinities, signed zeros,
subnormals), partial sums that fall into the subnormal range, random words, leading
dimensions and jax.vmap; bad operands are errors naming the target.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference import (BF16, F16, F32, assert_bits_equal, gaussian, ordered_sum,
                             random_bits, sprinkle_specials, uint)
from zipccl_jax._src import transport

DTYPES = [BF16, F16, F32]


def _both(recv):
  dtype = recv.dtype
  fast = jax.jit(lambda r: transport.ordered_sum(r, dtype))(jnp.asarray(recv))
  chain = jax.jit(lambda r: transport.ordered_sum_xla(r, dtype))(jnp.asarray(recv))
  return np.asarray(fast), np.asarray(chain)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 8, 9])
def test_equals_the_chain_of_adds_and_the_reference(dtype, n):
  recv = np.stack([sprinkle_specials(gaussian((300,), dtype, seed=s), seed=s + 1, count=2)
                   for s in range(n)])
  fast, chain = _both(recv)
  assert fast.dtype == np.dtype(dtype) and fast.shape == (300,)
  assert_bits_equal(fast, chain, f"{np.dtype(dtype).name} N={n} vs XLA")
  assert_bits_equal(fast, ordered_sum(list(recv), dtype), f"{np.dtype(dtype).name} N={n} vs numpy")


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_words(dtype):
  rng = np.random.default_rng(3)
  recv = random_bits((5, 4096), dtype, rng)
  fast, chain = _both(recv)
  assert_bits_equal(fast, chain, "random words")
  assert_bits_equal(fast, ordered_sum(list(recv), dtype), "random words vs numpy")


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_subnormal_inputs_and_partial_sums_flush_to_signed_zero(dtype):
  """XLA:CPU flushes float32 subnormals: inputs and every partial sum."""
  tiny = np.float32(2.0**-126)
  rows = np.array([[tiny * 1.5, -tiny * 1.5, tiny * 2, 0.0, tiny / 4, 1.0],
                   [-tiny, tiny, -tiny * 1.5, -0.0, tiny / 8, tiny / 2],
                   [tiny / 2, -tiny / 4, tiny, 0.0, -tiny, 3.0]], np.float32).astype(dtype)
  fast, chain = _both(rows)
  assert_bits_equal(fast, chain, "subnormals vs XLA")
  assert_bits_equal(fast, ordered_sum(list(rows), dtype), "subnormals vs numpy")
  # (1.5 - 1 + 0.5) tiny: the first partial sum 0.5 tiny flushes to +0, + 0.5 tiny flushes
  assert fast.view(uint(dtype))[0] == 0


def test_f16_subnormals_widen_exactly():
  """Every float16 subnormal (and both zeros) plus -0: itself."""
  w = np.concatenate([np.arange(0, 1024), np.arange(0x8000, 0x8000 + 1024)]).astype(np.uint16)
  recv = np.stack([w.view(F16), np.full(w.size, -0.0, F16)])
  fast, chain = _both(recv)
  np.testing.assert_array_equal(fast.view(np.uint16), chain.view(np.uint16))
  np.testing.assert_array_equal(fast.view(np.uint16), w)


def test_leading_dimensions_and_vmap():
  recv = gaussian((4, 3, 6, 7), BF16, seed=5)         # vmapped over 4: [N=3, 6, 7] each
  got = jax.jit(jax.vmap(lambda r: transport.ordered_sum(r, r.dtype)))(jnp.asarray(recv))
  want = np.stack([ordered_sum(list(r), BF16) for r in recv])
  assert_bits_equal(np.asarray(got), want, "vmap")


def test_bad_operands_are_errors_naming_the_target():
  transport.ordered_sum(jnp.zeros((2, 3), jnp.float32), jnp.float32)   # registers the targets

  def call(x, out):
    return jax.jit(lambda v: jax.ffi.ffi_call("zipccl_row_sum", out, vmap_method="broadcast_all")(v))(x)

  with pytest.raises(Exception, match="zipccl_row_sum: x must be bfloat16, float16 or float32"):
    call(jnp.zeros((2, 3), jnp.int32), jax.ShapeDtypeStruct((3,), jnp.float32))
  with pytest.raises(Exception, match="zipccl_row_sum: y must be float32"):
    call(jnp.zeros((2, 3), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.float32))
  with pytest.raises(Exception, match="zipccl_row_sum: x must have N >= 1"):
    call(jnp.zeros((0, 3), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.float32))
  with pytest.raises(Exception, match="zipccl_row_sum: x must be \\[..., N, M\\]"):
    call(jnp.zeros((3,), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32))
