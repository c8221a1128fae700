"""tune_host_allocator: opt-in glibc tuning for XLA:CPU's per-call buffers."""
import platform

import jax.numpy as jnp
import numpy as np
import pytest

import zipccl_jax as zc


def test_rejects_bad_threshold():
  for bad in (0, -5, 1.5, True, "1"):
    with pytest.raises(ValueError, match="mmap_threshold"):
      zc.tune_host_allocator(bad)
  for bad in (0, -1, 2.0, False, "1"):
    with pytest.raises(ValueError, match="arenas"):
      zc.tune_host_allocator(arenas=bad)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc-only")
def test_glibc_accepts_and_codec_still_exact():
  assert zc.tune_host_allocator(1 << 30) is True
  assert zc.tune_host_allocator(1 << 30, arenas=None) is True
  x = jnp.asarray(np.random.default_rng(0).standard_normal(1 << 20), jnp.bfloat16)
  for _ in range(3):  # reuses heap buffers across calls
    y = zc.decode(zc.encode(x))
    assert np.array_equal(np.asarray(y).view(np.uint16), np.asarray(x).view(np.uint16))
