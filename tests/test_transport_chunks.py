"""Chunked transports (`chunks=`, zipccl_jax/_src/transport.py; docs/design.md, "Transport: the slot ladder").

A compressed row is moved in C column chunks, each its own ladder transport
(encode, agreement, slot switch). Checked here: the chunk boundaries; the five
collectives and their gradients are the same bits for C in {1, 2, 3} (sizes not
divisible by C, rows shorter than C, chunks too small to compress) as codec="raw"
and the numpy references; C = 1 compiles the unchunked program; the compiled
module holds C switches per transport whose raw branches are the chunks' sizes;
stats add up over the chunks and equal the HLO's bytes on the rungs taken;
"auto" and the option's validation; the cost model's chunk count.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src.codecs import window as W
from zipccl_jax import costmodel as cm
from tests.reference import BF16, F16, F32, assert_bits_equal, gaussian, ordered_sum

N = 8
RING = [(i, (i + 1) % N) for i in range(N)]
_OUT = (P(), P("x"), P("x"), P("x"), P())


def _five(v, kw):
  """The five collectives on v (tiled along dim 0), with stats."""
  return (zc.compressed_all_gather(v, "x", tiled=True, to="invarying", stats=True, **kw),
          zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, stats=True, **kw),
          zc.compressed_ppermute(v, "x", RING, stats=True, **kw),
          zc.compressed_psum_scatter(v, "x", scatter_dimension=0, tiled=True, stats=True, **kw),
          zc.compressed_psum(v, "x", stats=True, **kw))


@functools.lru_cache(None)
def _fn(mesh, kw):
  def f(v):
    outs = _five(v, dict(kw))
    return (tuple(o[0] for o in outs), tuple(o[1].rung for o in outs),
            tuple(o[1].wire_bytes for o in outs))
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"),
                               out_specs=(_OUT, (P(),) * 5, (P(),) * 5)))


def _reference(x, dtype):
  """numpy results of the five collectives for x = N blocks stacked along dim 0."""
  blocks = np.split(np.asarray(x), N)
  parts = [np.split(b, N) for b in blocks]
  a2a = np.concatenate([np.concatenate([parts[s][d] for s in range(N)]) for d in range(N)])
  pp = np.concatenate([blocks[(d - 1) % N] for d in range(N)])
  rs = np.concatenate([ordered_sum([parts[s][d] for s in range(N)], dtype) for d in range(N)])
  return np.asarray(x), a2a, pp, rs, ordered_sum(blocks, dtype)


def _data(shape, dtype, seed):
  """Gaussian with specials: +-0, +-inf, NaNs with distinct payloads, subnormals."""
  x = gaussian(shape, dtype, seed=seed).reshape(-1)
  u = np.dtype({2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize])
  bits = x.view(u)
  if u == np.uint16:
    specials = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFA3, 0x0001, 0x8003] if \
        dtype == BF16 else [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFD03, 0x0001, 0x8003]
  else:
    specials = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00011, 0xFFA00003, 1, 0x80000005]
  idx = np.random.default_rng(seed).choice(bits.size, 64, replace=False)
  bits[idx] = np.resize(np.asarray(specials, u), idx.size)
  return bits.view(dtype).reshape(shape)


# ---- chunk boundaries --------------------------------------------------------------------


@pytest.mark.parametrize("m", [0, 1, 2, 3, 5, 7, 100, 4095, 4096, 8193, 3 * 4096 + 1, 1 << 20])
@pytest.mark.parametrize("c", [1, 2, 3, 4, 16])
def test_chunk_bounds_cover_the_row(m, c):
  b = zc_chunk_bounds(m, c)
  assert b[0][0] == 0 and b[-1][1] == max(m, 0)
  assert all(b0 < b1 for b0, b1 in b) or m == 0
  assert all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))
  assert len(b) == (1 if m == 0 else min(c, m))
  sizes = [b1 - b0 for b0, b1 in b]
  if m >= c * 4096:
    assert all(a % 4096 == 0 for a, _ in b)   # whole codec blocks
    assert max(sizes) - min(sizes[:-1] or sizes) <= 4096 and sizes[-1] <= max(sizes)
  else:
    assert max(sizes) - min(sizes) <= 1


def zc_chunk_bounds(m, c):
  return ladder_lib.chunk_bounds(m, c)


# ---- exactness -------------------------------------------------------------------------------


# C = 1 is the unchunked program (test_chunks_1_is_the_unchunked_program), which the
# rest of the suite covers; each chunk is a full ladder to compile, so the cases
# are few.
@pytest.mark.parametrize("dtype,cols,chunks", [(BF16, 5003, 2), (BF16, 5003, 3),
                                               (F16, 4099, 3), (F32, 2053, 2)],
                         ids=["bf16-C2", "bf16-C3", "f16-C3", "f32-C2"])
def test_five_collectives_bit_identical(mesh8, dtype, cols, chunks):
  # 8 rows x cols per device: all_gather rows of 8*cols, all-to-all rows of cols
  # elements (odd: no C divides them)
  x = _data((N * 8, cols), dtype, seed=cols + chunks)
  ys, rungs, _ = _fn(mesh8, (("policy", "always"), ("chunks", chunks)))(x)
  raw, _, _ = _fn(mesh8, (("codec", "raw"), ("policy", "always")))(x)
  names = ("all_gather", "all_to_all", "ppermute", "psum_scatter", "psum")
  for name, y, r, want in zip(names, ys, raw, _reference(x, dtype)):
    assert_bits_equal(y, r, f"{name} C={chunks} vs raw")
    assert_bits_equal(y, want, f"{name} C={chunks} vs numpy")
  # one rung per chunk per compressed transport (psum: two transports); a row
  # whose smallest encoding is not below raw moves raw, unchunked
  def count(m, a2a):
    fits = ladder_lib.ladder(W.min_nbytes(dtype, m), m * np.dtype(dtype).itemsize, all_to_all=a2a)
    return chunks if fits else 1

  gather, a2a = count(8 * cols, False), count(cols, True)
  assert gather == chunks
  assert [np.shape(r)[-1] for r in rungs] == [gather, a2a, gather, a2a, a2a + count(cols, False)]


def test_rows_shorter_than_chunks_and_tiny_chunks(mesh8):
  # all-to-all rows of 1 element (m < C): nothing compresses, one raw transport;
  # gather rows of 24 elements with C=16: too short for a ladder at all
  x = _data((N * 8, 3), BF16, seed=5)
  ys, rungs, _ = _fn(mesh8, (("policy", "always"), ("chunks", 16)))(x)
  for name, y, want in zip(("all_gather", "a2a", "pp", "rs", "psum"), ys, _reference(x, BF16)):
    assert_bits_equal(y, want, name)
  assert [np.shape(r)[-1] for r in rungs] == [1, 1, 1, 1, 2]
  # a row that compresses whole but whose 16 chunks of 252 elements do not: every
  # chunk moves raw, still exact
  x = _data((N * 8, 504), BF16, seed=6)   # gather rows of 4032 elements
  ys, rungs, _ = _fn(mesh8, (("policy", "always"), ("chunks", 16)))(x)
  raw, _, _ = _fn(mesh8, (("codec", "raw"), ("policy", "always")))(x)
  for y, r in zip(ys, raw):
    assert_bits_equal(y, r)
  assert np.shape(rungs[0])[-1] == 16


def test_gradients_with_chunks(mesh8):
  # fp32: short ladders (only its exponents compress), so the program compiles fast
  x = _data((N * 8, 4100), F32, seed=7)
  w = gaussian((N * 8, 4100), F32, seed=8)

  def loss(kw):
    def f(v, u):
      # all_gather's VJP is a chunked psum_scatter (the all-to-all transport); the
      # other VJPs are the same transports again (ppermute inverted, all_to_all
      # with its axes swapped), checked forward above
      g = zc.compressed_all_gather(v, "x", tiled=True, **kw)
      return jnp.sum(g.astype(jnp.float32) ** 2) + jnp.sum((v * u).astype(jnp.float32))
    sm = jax.jit(jax.shard_map(lambda v, u: jax.grad(f)(v, u), mesh=mesh8,
                               in_specs=(P("x"), P("x")), out_specs=P("x")))
    return sm(x, w), zc.hlo_wire_bytes(sm.lower(x, w).compile().as_text())

  got, wb = loss(dict(policy="always", chunks=2))
  assert_bits_equal(got, loss(dict(codec="raw", policy="always"))[0], "grad C=2 vs raw")
  # two chunked transports: the gather forward, its psum_scatter backward
  # (the psum_scatter's rungs are collective permutes on CPU: row_ops.a2a_slot)
  assert sorted(c.opcodes for c in wb.conditionals) == [("all-gather",)] * 2 + [
      ("collective-permute",)] * 2


# ---- structure ---------------------------------------------------------------------------


def _compiled(mesh, f, x, out_specs):
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=out_specs)).lower(
      x).compile().as_text()


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_hlo_has_one_switch_and_agreement_per_chunk(mesh8, chunks):
  m = 3 * 4096 + 5                                  # gather row elements
  x = jax.ShapeDtypeStruct((N, m), BF16)
  text = _compiled(mesh8, lambda v: zc.compressed_all_gather(
      v, "x", tiled=True, policy="always", chunks=chunks), x, P("x"))
  wb = zc.hlo_wire_bytes(text)
  bounds = zc_chunk_bounds(m, chunks)
  assert len(bounds) == chunks
  assert len(wb.conditionals) == chunks
  # each switch's raw rung moves its chunk's uint16 words
  assert sorted(c.branch_bytes[-1] for c in wb.conditionals) == sorted(
      2 * (b - a) for a, b in bounds)
  # the agreements: an all-gather of 24 bytes per chunk, outside the switches
  agreements = [o for o in wb.ops if o.opcode.startswith("all-gather") and not o.branches]
  assert len(agreements) == chunks and all(o.operand_bytes == 24 for o in agreements)


def test_chunks_1_is_the_unchunked_program(mesh8):
  x = jax.ShapeDtypeStruct((N * 8, 5003), BF16)

  def f(kw):
    return jax.jit(jax.shard_map(lambda v: [o[0] for o in _five(v, kw)], mesh=mesh8,
                                 in_specs=P("x"), out_specs=list(_OUT))).lower(x).as_text()

  # no calibration in force (conftest): "auto" is 1 chunk, the same program
  assert f(dict(policy="always", chunks=1)) == f(dict(policy="always"))
  assert f(dict(policy="always", chunks=1)) == f(dict(policy="always", chunks="auto"))
  assert f(dict(policy="always", chunks=2)) != f(dict(policy="always", chunks=1))


def test_stats_add_up_over_chunks(mesh8):
  x = _data((N * 8, 5003), BF16, seed=9)
  for chunks in (1, 3):
    def f(v, chunks=chunks):
      y, s = zc.compressed_all_gather(v, "x", tiled=True, to="invarying", stats=True,
                                      policy="always", chunks=chunks)
      return y, s
    jf = jax.jit(jax.shard_map(f, mesh=mesh8, in_specs=P("x"), out_specs=(P(), P())))
    _, s = jf(x)
    wb = zc.hlo_wire_bytes(jf.lower(x).compile().as_text())
    assert np.shape(s.rung) == (chunks,)
    assert s.raw_bytes == 8 * 5003 * 2 and s.elements == N * 8 * 5003
    assert len(s.slots) == chunks
    # wire bytes = the rungs' slots summed over the chunks + every chunk's agreement
    slots = sum(s.slots[t][int(r)] for t, r in enumerate(np.asarray(s.rung)))
    assert int(s.wire_bytes) == slots + s.agree_bytes and s.agree_bytes == 24 * chunks
    # the compiled switches on the rungs taken: a switch belongs to a chunk of its raw
    # size (chunks of one size have the same ladder, so which is which does not
    # change the sum)
    by_raw = {}
    for c in wb.conditionals:
      by_raw.setdefault(c.branch_bytes[-1], []).append(c.name)
    choice = {by_raw[s.slots[t][-1]].pop(): int(r) for t, r in enumerate(np.asarray(s.rung))}
    assert len(choice) == chunks == len(wb.conditionals)
    assert wb.taken(choice) == int(s.wire_bytes)
    assert float(s.ratio) > 1.2


# ---- options -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad,err", [(0, ValueError), (17, ValueError), (-1, ValueError),
                                     (True, TypeError), ("four", TypeError), (2.0, TypeError)])
def test_chunks_is_validated(mesh8, bad, err):
  f = jax.shard_map(lambda v: zc.compressed_psum(v, "x", chunks=bad), mesh=mesh8,
                    in_specs=P("x"), out_specs=P())
  with pytest.raises(err, match="compressed_psum: chunks"):
    jax.eval_shape(f, jax.ShapeDtypeStruct((N, 64), BF16))


def test_chunks_environment_default(mesh8, monkeypatch):
  x = jax.ShapeDtypeStruct((N, 3 * 4096), BF16)

  def n_switches():
    return len(zc.hlo_wire_bytes(_compiled(mesh8, lambda v: zc.compressed_all_gather(
        v, "x", tiled=True, policy="always"), x, P("x"))).conditionals)

  try:
    monkeypatch.setenv("ZIPCCL_CHUNKS", "3")
    ladder_lib.chunks_default.cache_clear()
    assert n_switches() == 3
    monkeypatch.setenv("ZIPCCL_CHUNKS", "lots")
    ladder_lib.chunks_default.cache_clear()
    with pytest.raises(TypeError, match="chunks"):
      n_switches()
  finally:
    monkeypatch.delenv("ZIPCCL_CHUNKS")
    ladder_lib.chunks_default.cache_clear()
  assert n_switches() == 1


def test_auto_chunks_follow_the_cost_model(mesh8, monkeypatch):
  """With a calibration in force, "auto" asks best_chunks: 1 on XLA:CPU (no
  overlap, measured), more where an overlap is declared (ZIPCCL_OVERLAP)."""
  base = cm.default_calibration("cpu")
  slow = cm.projected_calibration(base, link_gbit=1.0, encode_GBps=1.0, decode_GBps=1.5)
  m = 1 << 18
  x = jax.ShapeDtypeStruct((N, m), BF16)

  def n_switches():
    return len(zc.hlo_wire_bytes(_compiled(mesh8, lambda v: zc.compressed_all_gather(
        v, "x", tiled=True, policy="always"), x, P("x"))).conditionals)

  try:
    zc.set_calibration(slow)
    assert cm.best_chunks("all_gather", "bfloat16", m, N, slow) == 1
    assert n_switches() == 1
    monkeypatch.setenv("ZIPCCL_OVERLAP", "1")
    want = cm.best_chunks("all_gather", "bfloat16", m, N, slow)
    assert want > 1
    assert n_switches() == len(zc_chunk_bounds(m, want))
  finally:
    zc.set_calibration(None)


# ---- the cost model's chunk count -------------------------------------------------------------


def test_best_chunks_and_overlap(monkeypatch):
  cal = cm.projected_calibration(cm.default_calibration("cpu"), link_gbit=1.0,
                                 encode_GBps=1.0, decode_GBps=1.5)
  m = 1 << 22
  t1 = cm.model_time("all_gather", "bfloat16", m, 2, cal, "zipccl")
  # chunks=1 is the unchunked model whatever the overlap
  assert t1 == cm.model_time("all_gather", "bfloat16", m, 2, cal, "zipccl", overlap=1.0)
  # no overlap: every chunk only adds latency; full overlap: the pipeline
  assert cm.model_time("all_gather", "bfloat16", m, 2, cal, "zipccl", chunks=4,
                       overlap=0.0) > t1
  assert cm.model_time("all_gather", "bfloat16", m, 2, cal, "zipccl", chunks=4,
                       overlap=1.0) < t1
  assert cm.best_chunks("all_gather", "bfloat16", m, 2, cal, overlap=0.0) == 1
  k = cm.best_chunks("all_gather", "bfloat16", m, 2, cal, overlap=1.0)
  assert k in cm.CHUNK_CANDIDATES and k > 1
  assert cm.best_chunks("all_gather", "bfloat16", m, 2, cal, overlap=1.0, max_chunks=3) <= 3
  # tiny rows, one peer, unknown codec: one chunk
  assert cm.best_chunks("all_gather", "bfloat16", 5000, 2, cal, overlap=1.0) == 1
  assert cm.best_chunks("all_gather", "bfloat16", m, 1, cal, overlap=1.0) == 1
  assert cm.best_chunks("all_gather", "bfloat16", m, 2, cal, "nope", overlap=1.0) == 1
  # the overlap: measured per platform, declared by ZIPCCL_OVERLAP
  assert cm.overlap_fraction(cal) == cm.MEASURED_OVERLAP["cpu"] == 0.0
  monkeypatch.setenv("ZIPCCL_OVERLAP", "0.5")
  assert cm.overlap_fraction(cal) == 0.5
  for bad in ("2", "-0.1", "x"):
    monkeypatch.setenv("ZIPCCL_OVERLAP", bad)
    with pytest.raises(ValueError, match="ZIPCCL_OVERLAP"):
      cm.overlap_fraction(cal)
  with pytest.raises(ValueError, match="overlap"):
    cm.model_time("all_gather", "bfloat16", m, 2, cal, "zipccl", overlap=1.5)
