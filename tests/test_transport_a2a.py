"""All-to-all rungs on CPU as N - 1 collective permutes (zipccl_jax/_src/transport.py
`a2a_slot`): the "zipccl_row_split" / "zipccl_row_join" FFI targets (ffi/transport_cpu.cc)
on every `me`, their errors on bad operands, the compiled program (no slice,
concatenate or other kernel in a compressed rung), and psum_scatter / all_to_all /
psum over 2, 4 and 8 devices and a 2-axis mesh compared word for word with
codec="raw" and with lax, with the stats' bytes equal to the compiled HLO's.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import ffi as zffi
from zipccl_jax._src import row_ops
from tests.reference import BF16, F32, assert_bits_equal, gaussian, ordered_sum

ALWAYS = dict(policy="always")


def _split(payload, me, slot, pieces=None):
  zffi.register()
  n = payload.shape[0]
  pieces = n - 1 if pieces is None else pieces
  out = [jax.ShapeDtypeStruct((slot,), jnp.uint8)] * pieces
  return jax.jit(jax.ffi.ffi_call("zipccl_row_split", out))(payload, me)


def _join(payload, me, pieces, out_shape=None):
  zffi.register()
  n, _ = payload.shape
  slot = pieces[0].shape[0] if pieces else 0
  out = jax.ShapeDtypeStruct(out_shape or (n, slot), jnp.uint8)
  return jax.jit(jax.ffi.ffi_call("zipccl_row_join", out))(payload, me, *pieces)


# ---- the FFI targets ------------------------------------------------------------------------------


@pytest.mark.parametrize("n, length, slot", [(2, 256, 128), (3, 640, 384), (8, 1024, 1024),
                                             (5, 129, 1), (4, 256, 0)])
def test_split_and_join_on_every_me(n, length, slot):
  rng = np.random.default_rng(n * 1000 + slot)
  p = rng.integers(0, 256, size=(n, length), dtype=np.uint8)
  for me in range(n):
    pieces = _split(jnp.asarray(p), jnp.int32(me), slot)
    assert len(pieces) == n - 1
    for k, q in enumerate(pieces, 1):
      assert np.array_equal(np.asarray(q), p[(me + k) % n, :slot]), (me, k)
    # join: piece k - 1 came from peer (me - k) mod N; the own row is the payload's
    recv = [jnp.asarray(rng.integers(0, 256, size=(slot,), dtype=np.uint8)) for _ in range(n - 1)]
    got = np.asarray(_join(jnp.asarray(p), jnp.int32(me), recv))
    want = np.empty((n, slot), np.uint8)
    want[me] = p[me, :slot]
    for k, q in enumerate(recv, 1):
      want[(me - k) % n] = np.asarray(q)
    assert np.array_equal(got, want), me


def test_split_permute_join_is_the_all_to_all(mesh8):
  """join(ppermute_k(split(p))) gives exactly lax.all_to_all(p[:, :S]) on every device."""
  rng = np.random.default_rng(3)
  p = rng.integers(0, 256, size=(8 * 8, 1000), dtype=np.uint8)
  for slot in (896, 1000, 0):
    f = jax.jit(jax.shard_map(lambda a, s=slot: (row_ops.a2a_slot(a, s, "x"),
                                                 lax.all_to_all(a[:, :s], "x", 0, 0, tiled=True)),
                              mesh=mesh8, in_specs=P("x"), out_specs=(P("x"), P("x"))))
    got, want = f(p)
    assert np.array_equal(np.asarray(got), np.asarray(want)), slot


BAD_SPLIT = [
    # (payload shape, me, slot, pieces, message)
    ((8,), 0, 4, 7, r"zipccl_row_split: payload must be u8 \[N, L\] \(one row per peer\), got rank 1"),
    ((1, 16), 0, 4, 1, r"zipccl_row_split: payload must have N >= 2 rows \(peers\), got 1"),
    ((4, 16), 0, 4, 2, r"zipccl_row_split: expected N - 1 = 3 rows u8 \[S\], got 2"),
    ((4, 16), 0, 32, 3, r"zipccl_row_split: result 0 must be u8 \[S\] with S <= 16, got \[32\]"),
    ((4, 16), 4, 4, 3, r"zipccl_row_split: me must be in \[0, 4\), got 4"),
    ((4, 16), -1, 4, 3, r"zipccl_row_split: me must be in \[0, 4\), got -1"),
]


@pytest.mark.parametrize("shape, me, slot, pieces, match", BAD_SPLIT)
def test_split_rejects_bad_operands(shape, me, slot, pieces, match):
  with pytest.raises(Exception, match=match):
    jax.block_until_ready(_split(jnp.zeros(shape, jnp.uint8), jnp.int32(me), slot, pieces))


def test_split_rejects_pieces_of_different_sizes_and_a_bad_me():
  zffi.register()
  out = [jax.ShapeDtypeStruct((4,), jnp.uint8), jax.ShapeDtypeStruct((8,), jnp.uint8)]
  call = jax.jit(jax.ffi.ffi_call("zipccl_row_split", out))
  with pytest.raises(Exception, match=r"zipccl_row_split: result 1 must be u8 \[4\] like result 0, got \[8\]"):
    jax.block_until_ready(call(jnp.zeros((3, 16), jnp.uint8), jnp.int32(0)))
  out = [jax.ShapeDtypeStruct((4,), jnp.uint8)] * 2
  call = jax.jit(jax.ffi.ffi_call("zipccl_row_split", out))
  with pytest.raises(Exception, match=r"zipccl_row_split: me must be one s32 \(this device's index\), got 2"):
    jax.block_until_ready(call(jnp.zeros((3, 16), jnp.uint8), jnp.zeros((2,), jnp.int32)))


def test_join_rejects_bad_operands():
  p = jnp.zeros((3, 16), jnp.uint8)
  q = jnp.zeros((8,), jnp.uint8)
  with pytest.raises(Exception, match=r"zipccl_row_join: expected N - 1 = 2 rows u8 \[S\], got 1"):
    jax.block_until_ready(_join(p, jnp.int32(0), [q]))
  with pytest.raises(Exception, match=r"zipccl_row_join: operand 1 must be u8 \[8\] like operand 0, got \[4\]"):
    jax.block_until_ready(_join(p, jnp.int32(0), [q, jnp.zeros((4,), jnp.uint8)]))
  with pytest.raises(Exception, match=r"zipccl_row_join: operand 0 must be u8 \[S\] with S <= 16, got \[32\]"):
    big = jnp.zeros((32,), jnp.uint8)
    jax.block_until_ready(_join(p, jnp.int32(0), [big, big]))
  with pytest.raises(Exception, match=r"zipccl_row_join: me must be in \[0, 3\), got 3"):
    jax.block_until_ready(_join(p, jnp.int32(3), [q, q]))
  with pytest.raises(Exception, match=r"zipccl_row_join: out must be u8 \[3, 8\], got \[3, 4\]"):
    jax.block_until_ready(_join(p, jnp.int32(1), [q, q], out_shape=(3, 4)))


# ---- the compiled program -------------------------------------------------------------------------


def _computations(text):
  """{name: [(opcode, line)]} of a compiled HLO module."""
  comps, cur = {}, None
  for line in text.splitlines():
    m = re.match(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$", line)
    if m:
      cur = comps.setdefault(m.group(1), [])
      continue
    m = re.match(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(?:\(.*?\)|\S+)\s+([\w\-]+)\(", line)
    if cur is not None and m:
      cur.append((m.group(1), line))
  return comps


@pytest.mark.parametrize("codec", ["zipccl", "entropy"])
@pytest.mark.parametrize("name", ["psum_scatter", "all_to_all"])
def test_a2a_rungs_compile_to_custom_calls_and_permutes_only(mesh8, codec, name):
  """Every compressed rung of an all-to-all ladder is split, N - 1 permutes, join and
  the decoder: no slice, concatenate or fusion (a kernel XLA:CPU would compile per
  rung). The raw rung moves its words by the same N - 1 permutes (every branch
  issues the same collectives: groups of a larger mesh on different rungs meet in
  XLA:CPU's collective-permute rendezvous)."""
  x = gaussian((8 * 64, 1024), BF16, seed=11)
  call = {"psum_scatter": lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec=codec, **ALWAYS),
          "all_to_all": lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, codec=codec,
                                                           **ALWAYS)}[name]
  f = jax.jit(jax.shard_map(call, mesh=mesh8, in_specs=P("x"), out_specs=P("x")))
  text = f.lower(x).compile().as_text()
  comps = _computations(text)
  (cond,) = [line for ops in comps.values() for op, line in ops if op == "conditional"]
  branches = re.findall(r"%([\w.\-]+)", re.search(r"branch_computations=\{([^}]*)\}", cond).group(1))
  m = 64 * 1024 // 8
  rungs = zc.codec_ladder(codec, BF16, m, all_to_all=True)
  # the rungs, the raw rung, and the plan-mismatch branch (moves nothing)
  assert len(branches) == len(rungs) + 2
  assert not [op for op, _ in comps[branches[-1]] if op in ("collective-permute", "all-to-all")]
  branches = branches[:-1]
  allowed = {"parameter", "get-tuple-element", "tuple", "custom-call", "collective-permute", "bitcast",
             "partition-id"}
  for b in branches[:-1]:
    ops = [op for op, _ in comps[b]]
    assert set(ops) <= allowed, (b, sorted(set(ops) - allowed))
    assert ops.count("collective-permute") == 7
    targets = re.findall(r'custom_call_target="(\w+)"', "\n".join(line for _, line in comps[b]))
    assert targets == ["zipccl_row_split", "zipccl_row_join", f"zipccl_{codec}_decode"], targets
  pairs = lambda b: [re.search(r"source_target_pairs=(\{[^ ]*\}),", line).group(1)
                     for op, line in comps[b] if op == "collective-permute"]
  raw_ops = [op for op, _ in comps[branches[-1]]]
  assert "all-to-all" not in raw_ops and raw_ops.count("collective-permute") == 7
  assert all(pairs(b) == pairs(branches[0]) for b in branches)
  assert_bits_equal(f(x), jax.jit(jax.shard_map(
      lambda v: {"psum_scatter": zc.compressed_psum_scatter(v, "x", tiled=True, codec="raw"),
                 "all_to_all": zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, codec="raw")}[name],
      mesh=mesh8, in_specs=P("x"), out_specs=P("x")))(x), name)


# ---- results over 2, 4, 8 devices and a 2-axis mesh --------------------------------------------


def _mixed(shape, dtype, seed):
  """Gaussian values with specials every 97 elements: +-0, +-inf, NaNs with distinct
  payloads, subnormals."""
  x = gaussian(shape, dtype, seed=seed)
  flat = x.reshape(-1)
  word = {np.dtype(BF16): np.uint16, np.dtype(F32): np.uint32}[np.dtype(dtype)]
  bits = flat.view(word)
  specials = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFA5, 0x0001, 0x807F], np.uint16)
  if word is np.uint32:
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA00005, 1, 0x807FFFFF],
                        np.uint32)
  bits[::97][:specials.size] = specials
  return x


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("codec", ["zipccl", "entropy"])
def test_collectives_equal_raw_and_lax(devices, codec):
  mesh = jax.make_mesh((devices,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:devices])
  rows, cols = 8 * devices, 2048
  x = _mixed((devices * rows, cols), BF16, seed=devices)
  u16 = lambda v: lax.bitcast_convert_type(v, jnp.uint16)

  def body(v):
    out = []
    for c in (codec, "raw"):
      rs, s = zc.compressed_psum_scatter(v, "x", tiled=True, codec=c, stats=True, **ALWAYS)
      a2a = zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, codec=c, **ALWAYS)
      ps = zc.compressed_psum(v, "x", codec=c, **ALWAYS)
      out.append((rs, a2a, ps))
      if c == codec:
        st = s
    return out, (lax.all_to_all(u16(v), "x", 0, 0, tiled=True), st)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                            out_specs=([(P("x"), P("x"), P())] * 2, (P("x"), P()))))
  (got, raw), (lax_a2a, st) = f(x)
  for name, a, b in zip(("psum_scatter", "all_to_all", "psum"), got, raw):
    assert_bits_equal(np.asarray(a), np.asarray(b), f"{name} {codec} vs raw over {devices}")
  assert_bits_equal(np.asarray(got[1]), np.asarray(lax_a2a).view(BF16), f"all_to_all vs lax over {devices}")
  blocks = np.split(x, devices)
  want = np.concatenate([ordered_sum([b[d * 8:(d + 1) * 8] for b in blocks], BF16) for d in range(devices)])
  assert_bits_equal(np.asarray(got[0]), want, f"psum_scatter vs rank-ordered sum over {devices}")
  assert not bool(st.raw_rung)
  # the stats' bytes are the compiled HLO's: a compressed rung is N - 1 permuted slots
  wb = zc.hlo_wire_bytes(jax.jit(jax.shard_map(
      lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec=codec, stats=True, **ALWAYS),
      mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P()))).lower(x).compile().as_text())
  (cond,) = wb.conditionals
  slot = int(st.slot_bytes[0])
  assert int(st.wire_bytes) == (devices - 1) * slot + st.agree_bytes == wb.taken([int(st.rung[0])])
  assert cond.branch_bytes[:-1] == tuple((devices - 1) * s for s in st.slot_sizes[0][:-1])
  assert cond.branch_bytes[-1] == st.raw_bytes


def test_two_axis_mesh_over_each_axis_and_both(mesh4x2):
  """Permutes over a tuple of axes take linear indices, like lax.axis_index(axes)."""
  x = _mixed((8 * 16, 2048), F32, seed=21)
  spec = P(("a", "b"))
  u32 = lambda v: lax.bitcast_convert_type(v, jnp.uint32)

  def body(v):
    res = []
    for axes in ("a", "b", ("a", "b"), ("b", "a")):
      res.append((zc.compressed_all_to_all(v, axes, 0, 0, tiled=True, **ALWAYS),
                  zc.compressed_all_to_all(v, axes, 0, 0, tiled=True, codec="raw"),
                  lax.all_to_all(u32(v), axes, 0, 0, tiled=True),
                  zc.compressed_psum_scatter(v, axes, tiled=True, **ALWAYS),
                  zc.compressed_psum_scatter(v, axes, tiled=True, codec="raw")))
    return res

  out = jax.jit(jax.shard_map(body, mesh=mesh4x2, in_specs=spec, out_specs=[(spec,) * 5] * 4))(x)
  for axes, (a2a, a2a_raw, a2a_lax, rs, rs_raw) in zip(("a", "b", "ab", "ba"), out):
    assert_bits_equal(np.asarray(a2a), np.asarray(a2a_raw), f"all_to_all over {axes} vs raw")
    assert_bits_equal(np.asarray(a2a), np.asarray(a2a_lax).view(F32), f"all_to_all over {axes} vs lax")
    assert_bits_equal(np.asarray(rs), np.asarray(rs_raw), f"psum_scatter over {axes} vs raw")
