"""tune_host_allocator: opt-in glibc tuning for XLA:CPU's per-call buffers."""
import os
import platform
import subprocess
import sys
import warnings

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
  jnp.zeros(1).block_until_ready()   # the backend runs: the arena limit comes too late
  with pytest.warns(RuntimeWarning, match="before the first JAX computation"):
    assert zc.tune_host_allocator(1 << 30) is True
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # no arena limit asked: nothing to warn about
    assert zc.tune_host_allocator(1 << 30, arenas=None) is True
  x = jnp.asarray(np.random.default_rng(0).standard_normal(1 << 20), jnp.bfloat16)
  for _ in range(3):  # reuses heap buffers across calls
    y = zc.decode(zc.encode(x))
    assert np.array_equal(np.asarray(y).view(np.uint16), np.asarray(x).view(np.uint16))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc-only")
def test_called_before_the_backend_starts_it_does_not_warn():
  code = ("import warnings; warnings.simplefilter('error'); import jax, zipccl_jax as zc; "
          "assert zc.tune_host_allocator() is True; "
          "import jax.numpy as jnp; print(int(jnp.arange(3).sum()))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0 and r.stdout.strip() == "3", r.stderr[-2000:]
