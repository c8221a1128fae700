"""The slot ladder's fixed steps (zipccl_jax/_src/transport.py, row_ops.py,
agreement.py; ffi/transport.h): the rung's row prefix, the used size, the agreement
(largest used size, summed count, rungs too small, plan fingerprints), the raw
rung's bitcast copies, and the switch that takes the rung. Each is checked bit for
bit, with its errors on bad operands, and in the compiled programs that use it.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import agreement
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src import row_ops
from zipccl_jax._src import transport
from tests.jaxtest import smap
from tests.reference import BF16, F16, F32, assert_bits_equal, gaussian

N = 8


# ---- the rung's row prefix ----------------------------------------------------------------------


@pytest.mark.parametrize("shape, slot", [((1, 1024), 128), ((3, 640), 384), ((2, 2, 256), 256),
                                         ((1, 0), 0), ((4, 513), 1)])
def test_row_prefix_copies_exactly_the_slot(shape, slot):
  rng = np.random.default_rng(7)
  p = rng.integers(0, 256, size=shape, dtype=np.uint8)
  got = np.asarray(jax.jit(lambda a: row_ops.row_prefix(a, slot))(jnp.asarray(p)))
  assert got.shape == shape[:-1] + (slot,)
  assert np.array_equal(got, p[..., :slot])


def test_row_prefix_rejects_a_slot_longer_than_the_row():
  from zipccl_jax._src import ffi as zffi
  zffi.register()
  call = jax.ffi.ffi_call("zipccl_row_prefix", jax.ShapeDtypeStruct((2, 256), jnp.uint8))
  with pytest.raises(Exception, match=r"zipccl_row_prefix: slot must be \[2, S\] with S <= 128"):
    jax.block_until_ready(jax.jit(call)(jnp.zeros((2, 128), jnp.uint8)))


def test_gather_rungs_compile_no_slice_kernels(mesh8):
  # Every rung of an all-gather ladder cuts its slot with the custom call, not a
  # slice (XLA:CPU compiles each slice to a kernel: compile time; docs/design.md).
  x = gaussian((N * 64, 1024), BF16, seed=1)
  f = smap(mesh8, P("x"), P())(lambda a: zc.compressed_all_gather(a, "x", tiled=True, to="invarying",
                                                                   policy="always"))
  txt = f.lower(x).compile().as_text()
  rungs = len(zc.codec_ladder(zc.AUTO_CODEC, BF16, 64 * 1024))   # the default codec's
  assert txt.count('custom_call_target="zipccl_row_prefix"') == rungs
  assert not re.findall(r"= u8\[[^\]]*\]\S* slice\(", txt)    # no slice of a payload
  assert_bits_equal(f(x), x, "all_gather")


# ---- the ladder's fixed steps: used size, rung index, the raw rung's views ---------------------


def _target(name, out, **attrs):
  from zipccl_jax._src import ffi as zffi
  zffi.register()
  return jax.jit(lambda *a: jax.ffi.ffi_call(name, out)(*a, **attrs))


@pytest.mark.parametrize("rows", [0, 1, 3, 8])
def test_used_max_is_the_largest_used_size(rows):
  rng = np.random.default_rng(rows)
  st = rng.integers(-5, 1 << 20, size=(rows, 4), dtype=np.int32)
  got = int(jax.jit(row_ops.used_max)(jnp.asarray(st)))
  assert got == (int(st[:, 2].max(initial=0)) if rows else 0)
  # the target directly, with leading dimensions: the max over all of them
  st3 = rng.integers(0, 1000, size=(2, 3, 4), dtype=np.int32)
  got3 = _target("zipccl_used_max", jax.ShapeDtypeStruct((), jnp.int32))(jnp.asarray(st3))
  assert int(got3) == int(st3[..., 2].max())


def test_used_max_rejects_bad_operands():
  f = _target("zipccl_used_max", jax.ShapeDtypeStruct((), jnp.int32))
  with pytest.raises(Exception, match=r"zipccl_used_max: stats must be s32 \[\.\.\., 4\] .*last dimension 3"):
    jax.block_until_ready(f(jnp.zeros((2, 3), jnp.int32)))
  with pytest.raises(Exception, match=r"zipccl_used_max: stats must be s32 .*a scalar"):
    jax.block_until_ready(f(jnp.zeros((), jnp.int32)))
  g = _target("zipccl_used_max", jax.ShapeDtypeStruct((2,), jnp.int32))
  with pytest.raises(Exception, match=r"zipccl_used_max: out must be one s32, got 2 elements"):
    jax.block_until_ready(g(jnp.zeros((2, 4), jnp.int32)))


def _agree_rows(used, count=None, fps=None):
  used = np.asarray(used, np.int32)
  count = np.zeros_like(used) if count is None else np.asarray(count, np.int32)
  fps = np.zeros((len(used), len(agreement.FINGERPRINT_FIELDS)), np.int32) if fps is None else fps
  return jnp.asarray(np.concatenate([used[:, None], count[:, None], fps], axis=1))


@pytest.mark.parametrize("path", ["cpu", "default"])
def test_agree_is_max_sum_and_the_rungs_too_small(path, monkeypatch):
  """zipccl_agree (CPU) and the jnp ops of other backends: the largest used size, the
  summed count (saturated), the number of rungs too small for the used size."""
  if path == "default":   # what a GPU runs, here on the CPU
    monkeypatch.setattr(transport.lax, "platform_dependent",
                        lambda *a, cpu, default: default(*a))
  rungs = ladder_lib.ladder(128 * 40, 128 * 100)
  units = [r // 128 for r in rungs]
  f = jax.jit(lambda e: agreement.agree(e, rungs, "a test"))
  for agreed in sorted({0, 1, *units, *(u + 1 for u in units), *(u - 1 for u in units), 10**6}):
    got = np.asarray(f(_agree_rows([agreed, max(agreed - 5, 0), 0], [3, 4, 5])))
    assert got.tolist() == [agreed, 12, sum(1 for u in units if agreed > u)], agreed
  big = np.asarray(f(_agree_rows([1, 1], [2**31 - 1, 2**31 - 1])))
  assert big[1] == 2**31 - 1   # the count saturates
  assert np.asarray(jax.jit(lambda e: agreement.agree(e, (), "t"))(_agree_rows([7])))[2] == 0


def test_agree_fails_on_different_fingerprints():
  """Participants with different plans: the CPU handler fails the call naming the call
  and every field that differs."""
  rungs = ladder_lib.ladder(128 * 40, 128 * 100)
  fps = np.zeros((3, 4), np.int32)
  fps[2, 0] = 5   # codec
  fps[1, 2] = 9   # chunking
  f = jax.jit(lambda e: agreement.agree(e, rungs, "an all_gather"))
  with pytest.raises(Exception, match=r"participants of an all_gather planned different compressed "
                                      r"transports \(they differ in: codec and format version, "
                                      r"chunking\); no bytes were moved"):
    jax.block_until_ready(f(_agree_rows([1, 2, 3], fps=fps)))


def test_agree_default_path_takes_the_branch_that_moves_nothing(monkeypatch):
  monkeypatch.setattr(transport.lax, "platform_dependent", lambda *a, cpu, default: default(*a))
  rungs = ladder_lib.ladder(128 * 40, 128 * 100)
  fps = np.zeros((2, 4), np.int32)
  fps[1, 3] = 1
  got = np.asarray(jax.jit(lambda e: agreement.agree(e, rungs, "t"))(_agree_rows([1, 2], fps=fps)))
  assert got[2] == len(rungs) + 1


def test_agree_rejects_bad_operands():
  out = jax.ShapeDtypeStruct((3,), jnp.int32)
  call = lambda units, e, o=out: jax.block_until_ready(
      _target("zipccl_agree", o, units=np.asarray(units, np.int32), where="t")(e))
  with pytest.raises(Exception, match=r"zipccl_agree: units must ascend strictly, got units\[1\] = 5 >= units\[2\] = 5"):
    call([3, 5, 5], _agree_rows([4]))
  with pytest.raises(Exception, match=r"zipccl_agree: units must hold 1\.\.256 rung sizes, got 300"):
    call(np.arange(300), _agree_rows([4]))
  with pytest.raises(Exception, match=r"zipccl_agree: every must be s32 \[N, W\]"):
    call([3], jnp.zeros((2,), jnp.int32))
  with pytest.raises(Exception, match=r"zipccl_agree: out must be s32 \[3\], got 1 elements"):
    call([3], _agree_rows([4]), jax.ShapeDtypeStruct((), jnp.int32))


@pytest.mark.parametrize("src, dst, shape", [(BF16, np.uint16, None), (np.uint16, BF16, None),
                                             (F16, np.uint8, (6, 2 * 33)), (np.uint8, F32, (6, 8)),
                                             (F32, np.uint32, None), (BF16, np.uint8, (0, 0))])
def test_copy_as_keeps_every_bit(src, dst, shape):
  rng = np.random.default_rng(11)
  n = 0 if shape == (0, 0) else 6 * 33 if src != np.uint8 else 6 * 32
  x = rng.integers(0, 256, size=n * np.dtype(src).itemsize, dtype=np.uint8).view(src)
  x = x.reshape((6, -1) if n else (0, 3))
  if shape == (0, 0):
    shape = (0, 6)
  if src in (BF16, F16, F32):   # NaNs with distinct payloads, infinities, zeros, subnormals
    w = x.view(np.uint16 if np.dtype(src).itemsize == 2 else np.uint32).reshape(-1)
    specials = ([0x7FC1, 0xFF81, 0x7F80, 0x8000, 0x0001] if np.dtype(src).itemsize == 2 else
                [0x7FC00001, 0xFF800001, 0x7F800000, 0x80000000, 0x00000001])
    w[:min(len(w), 5)] = specials[:min(len(w), 5)]
  want_shape = x.shape if shape is None else shape
  got = np.asarray(jax.jit(lambda a: row_ops.copy_as(a, dst, shape))(jnp.asarray(x)))
  assert got.dtype == np.dtype(dst) and got.shape == tuple(want_shape)
  assert got.tobytes() == x.tobytes()
  # the other backends' path (XLA bitcasts), which a GPU runs: the same bytes
  other = np.asarray(jax.jit(lambda a: row_ops._bitcast(a, dst, tuple(want_shape)))(jnp.asarray(x)))  # pylint: disable=protected-access
  assert other.dtype == np.dtype(dst) and other.tobytes() == x.tobytes()


def test_copy_as_rejects_another_byte_size():
  with pytest.raises(ValueError, match=r"copy_as: uint8\[5\] does not hold the 8 bytes of bfloat16\[4\]"):
    row_ops.copy_as(jnp.zeros((4,), BF16), np.uint8, (5,))
  f = _target("zipccl_bitcast_copy", jax.ShapeDtypeStruct((3,), jnp.uint16))
  with pytest.raises(Exception, match=r"zipccl_bitcast_copy: y must have x's byte size 8, got 6 bytes"):
    jax.block_until_ready(f(jnp.zeros((4,), BF16)))


@pytest.mark.parametrize("name", ["all_gather", "ppermute"])
def test_ladder_fixed_steps_compile_to_custom_calls(mesh8, name):
  """The used size, the rung index and the raw rung's views are custom calls and the
  switch's index is not clamped: the gathers' and permutes' programs compile to no
  kernel of their own but the all-gather's skip mask (docs/design.md, "A rung costs
  no kernel on XLA:CPU")."""
  x = gaussian((N * 64, 1024), BF16, seed=2)
  ring = [(i, (i + 1) % N) for i in range(N)]
  call = {"all_gather": lambda a: zc.compressed_all_gather(a, "x", tiled=True, to="invarying",
                                                          policy="always"),
          "ppermute": lambda a: zc.compressed_ppermute(a, "x", ring, policy="always")}[name]
  f = smap(mesh8, P("x"), P() if name == "all_gather" else P("x"))(call)
  txt = f.lower(x).compile().as_text()
  for target in ("zipccl_used_max", "zipccl_agree", "zipccl_bitcast_copy"):
    assert f'custom_call_target="{target}"' in txt, target
  assert txt.count('custom_call_target="zipccl_bitcast_copy"') == 2      # the raw rung's two views
  assert not re.findall(r"\bclamp\(", txt)
  assert not re.findall(r"bitcast-convert\(", txt)
  want = x if name == "all_gather" else np.roll(x.reshape(N, -1, 1024), 1, axis=0).reshape(x.shape)
  assert_bits_equal(f(x), want, name)


def test_switch_in_range_without_the_unclamped_switch(monkeypatch, mesh8):
  """Where JAX's internal switch is missing or has another signature, lax.switch (with
  its clamp) runs the same branch: the same bits."""
  from zipccl_jax._src import compat
  x = gaussian((N * 16, 256), BF16, seed=4)
  call = lambda a: zc.compressed_all_gather(a, "x", tiled=True, to="invarying", policy="always")
  want = np.asarray(smap(mesh8, P("x"), P())(call)(x))
  monkeypatch.setattr(compat, "_unclamped_switch", lambda: None)
  f = smap(mesh8, P("x"), P())(call)
  assert re.findall(r"\bclamp\(", f.lower(x).compile().as_text())
  assert_bits_equal(f(x), want, "all_gather with lax.switch")
  assert_bits_equal(want, x, "all_gather")
