"""Bytes on the wire of the compressed collectives, read from the compiled HLO
(`zipccl_jax.hlo_wire_bytes`) and from their stats, and what `policy="auto"` and
`codec="auto"` choose with and without a calibration (8 simulated CPU devices)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src.codecs import window as W

from tests.reference import BF16, F16, F32, assert_bits_equal, gaussian

N = 8
ALWAYS = dict(policy="always")


# ---- bytes on the wire, read from compiled HLO ------------------------------------------------

ROWS, COLS = 128, 1024     # 128K bf16 per device; a row per peer is 16K elements (32 KiB)


def _hlo(mesh, f, out_spec):
  x = jax.ShapeDtypeStruct((N * ROWS, COLS), jnp.bfloat16)
  text = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=out_spec)) \
      .lower(x).compile().as_text()
  return zc.hlo_wire_bytes(text)


_U16 = lambda v: lax.bitcast_convert_type(v, jnp.uint16)
_RING = [(i, (i + 1) % N) for i in range(N)]
WIRE_CASES = {
    # name: (compressed, the lax twin moving the same data as uint16, out spec)
    "all_gather": (lambda v: zc.compressed_all_gather(v, "x", **ALWAYS),
                   lambda v: lax.all_gather(_U16(v), "x"), P("x")),
    "psum_scatter": (lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, **ALWAYS),
                     lambda v: lax.psum_scatter(_U16(v), "x", tiled=True), P("x")),
    "psum": (lambda v: zc.compressed_psum(v, "x", **ALWAYS),
             lambda v: lax.psum(_U16(v), "x"), P()),
    "all_to_all": (lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, **ALWAYS),
                   lambda v: lax.all_to_all(_U16(v), "x", 0, 0, tiled=True), P("x")),
    "ppermute": (lambda v: zc.compressed_ppermute(v, "x", _RING, **ALWAYS),
                 lambda v: lax.ppermute(_U16(v), "x", _RING), P("x")),
}


@pytest.mark.parametrize("name", list(WIRE_CASES))
def test_hlo_wire_bytes(mesh8, name):
  comp_fn, twin_fn, spec = WIRE_CASES[name]
  comp = _hlo(mesh8, comp_fn, spec)
  twin = _hlo(mesh8, twin_fn, spec)
  # The only all-reduce we add is the 4-byte fallback flag.
  assert all(o.opcode != "all-reduce" or o.operand_bytes == 4 for o in comp.ops)
  # The modelled bytes sent per device: operand bytes do not compare across
  # collectives (lax.psum is one all-reduce, which sends ~2B(N-1)/N; on CPU an
  # all-to-all transport moves N - 1 rows by permutes, lax's all-to-all hands
  # over N).
  ratio = twin.common_sent / comp.common_sent
  print(f"\n{name}: compressed {comp.common} B (fallback path {comp.fallback} B, all "
        f"branches {comp.total} B), lax uint16 twin {twin.common} B, ratio {ratio:.4f}")
  assert ratio >= 1.38, f"{name}: wire ratio {ratio:.4f} < 1.38"
  # The fallback path moves the raw bytes (plus, for all_gather, the compressed try).
  assert comp.fallback_sent >= twin.common_sent
  # And no bf16 (widened to f32 by XLA:CPU) anywhere on the wire.
  assert all(o.operand_bytes > 0 for o in comp.ops)


def test_hlo_raw_codec_matches_lax_uint16(mesh8):
  """codec="raw" is the uncompressed twin: same operand bytes as lax on uint16."""
  for name in ("all_gather", "psum_scatter", "all_to_all", "ppermute"):
    comp_fn, twin_fn, spec = WIRE_CASES[name]
    raw_fn = {
        "all_gather": lambda v: zc.compressed_all_gather(v, "x", codec="raw"),
        "psum_scatter": lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec="raw"),
        "all_to_all": lambda v: zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, codec="raw"),
        "ppermute": lambda v: zc.compressed_ppermute(v, "x", _RING, codec="raw"),
    }[name]
    raw, twin = _hlo(mesh8, raw_fn, spec), _hlo(mesh8, twin_fn, spec)
    assert raw.common == raw.total == twin.common, name


def test_policy_auto_threshold(mesh8):
  """policy="auto" without a calibration: small rows stay uncompressed, rows >= 64 KiB
  are compressed (conftest.py keeps any calibration file out of the tests)."""
  small = jax.ShapeDtypeStruct((N * 8, 1024), jnp.bfloat16)     # 16 KiB rows
  big = jax.ShapeDtypeStruct((N * 32, 1024), jnp.bfloat16)      # 64 KiB rows
  s, b = _auto_wire(mesh8, small), _auto_wire(mesh8, big)
  assert s.common == s.total == 8 * 1024 * 2
  # compressed (the default codec): the smallest rung of its ladder plus the
  # 24-byte agreement
  assert b.common == zc.codec_ladder(zc.AUTO_CODEC, BF16, 32 * 1024)[0] + 24
  assert b.common < 32 * 1024 * 2 and b.fallback == 32 * 1024 * 2 + 24
  assert zc.AUTO_MIN_ROW_BYTES == 64 * 1024


def _auto_wire(mesh, x):
  text = jax.jit(jax.shard_map(lambda v: zc.compressed_all_gather(v, "x"), mesh=mesh,
                               in_specs=P("x"), out_specs=P("x"))).lower(x).compile().as_text()
  return zc.hlo_wire_bytes(text)


def test_policy_auto_with_a_calibration_asks_the_cost_model(mesh8):
  """With a calibration in force, "auto" is costmodel.decide: a fast link keeps
  64 KiB rows raw, a slow one compresses them and keeps 256-byte rows raw."""
  from zipccl_jax import costmodel as cm
  small = jax.ShapeDtypeStruct((N * 8, 16), jnp.bfloat16)       # 256 B rows
  big = jax.ShapeDtypeStruct((N * 32, 1024), jnp.bfloat16)      # 64 KiB rows
  raw_big = 32 * 1024 * 2
  fast = cm.default_calibration("cpu")                           # 100 Gbit/s, 1 GB/s codec
  slow = cm.projected_calibration(fast, link_gbit=1.0, encode_GBps=3.0, decode_GBps=3.5)
  try:
    zc.set_calibration(fast)
    assert _auto_wire(mesh8, big).common == _auto_wire(mesh8, big).total == raw_big
    zc.set_calibration(slow)
    assert _auto_wire(mesh8, small).common == 8 * 16 * 2
    first_rung = ladder_lib.ladder(W.min_nbytes(BF16, 32 * 1024), raw_big)[0]
    assert _auto_wire(mesh8, big).common == first_rung + 24 < raw_big   # + the agreement
  finally:
    zc.set_calibration(None)


def _ratio_calibration(entropy_ratio: float, entropy_slowdown: float = 1.0):
  """A 1 Gbit/s calibration of both codecs (window codec at ratio 1.40), the entropy
  codec at `entropy_ratio` and `entropy_slowdown` x the window codec's codec time."""
  from zipccl_jax import costmodel as cm
  base = cm.projected_calibration(cm.default_calibration("cpu", codecs=("zipccl", "entropy")),
                                  link_gbit=1.0, encode_GBps=3.0, decode_GBps=3.5)
  ent = {d: dataclasses.replace(
      f, encode_s_per_byte=f.encode_s_per_byte * entropy_slowdown,
      decode_s_per_byte=f.decode_s_per_byte * entropy_slowdown, ratio=entropy_ratio)
      for d, f in base.codecs["entropy"].items()}
  win = {d: dataclasses.replace(f, ratio=1.40) for d, f in base.codecs["zipccl"].items()}
  return dataclasses.replace(base, codecs={"zipccl": win, "entropy": ent})


def test_codec_auto_takes_the_modelled_fastest_codec(mesh8):
  """codec="auto" (the default): AUTO_CODEC without a calibration; with one, the
  codec `costmodel.fastest_codec` names for the call, in every collective and its
  VJP, and the stats name it. Bits equal that codec's, compared as words."""
  from zipccl_jax import costmodel as cm
  x = gaussian((N * 4, 4096), BF16, seed=71)              # 32 KiB rows per device
  x32 = gaussian((N * 4, 1024), F32, seed=72)

  def run(codec_kw):
    def f(v, w):
      ag, s1 = zc.compressed_all_gather(v, "x", tiled=True, stats=True, **codec_kw)
      rs, s2 = zc.compressed_psum_scatter(v, "x", scatter_dimension=1, tiled=True,
                                          stats=True, **codec_kw)
      ps, s3 = zc.compressed_psum(v, "x", stats=True, **codec_kw)
      a2, s4 = zc.compressed_all_to_all(v, "x", 1, 1, tiled=True, stats=True, **codec_kw)
      pp, s5 = zc.compressed_ppermute(v, "x", [(i, (i + 1) % N) for i in range(N)],
                                      stats=True, **codec_kw)
      f32, s6 = zc.compressed_all_gather(w, "x", tiled=True, stats=True, **codec_kw)
      g = jax.grad(lambda u: jnp.sum(zc.compressed_psum_scatter(
          u, "x", scatter_dimension=1, tiled=True, **codec_kw).astype(jnp.float32) ** 2))(v)
      names.append(tuple(s.codec for s in (s1, s2, s3, s4, s5, s6)))   # static, at trace
      return ag, rs, ps, a2, pp, f32, g
    names = []
    out = jax.jit(jax.shard_map(f, mesh=mesh8, in_specs=(P("x"), P("x")), out_specs=P("x"),
                                check_vma=False))(x, x32)
    return out, names[0]

  pol = dict(policy="always")
  out, names = run(pol)                                  # no calibration in force
  assert zc.AUTO_CODEC == "entropy" and names == ("entropy",) * 5 + ("zipccl",)
  want, _ = run(dict(pol, codec="entropy"))
  for a, b in zip(out, want):
    assert_bits_equal(a, b)
  try:
    # A slow link and a much better entropy ratio: the entropy codec wherever it
    # takes the dtype (bf16); fp32 has the window codec only (with the calibration
    # too: it measured no fp32 entropy numbers).
    zc.set_calibration(_ratio_calibration(1.9))
    assert cm.fastest_codec("all_gather", BF16, 4 * 4096, N) == "entropy"
    out, names = run(pol)
    assert names == ("entropy",) * 5 + ("zipccl",)
    want, _ = run(dict(pol, codec="entropy"))
    for a, b in zip(out, want):
      assert_bits_equal(a, b)
    # The same ratio but 20x the codec time: the window codec is faster.
    zc.set_calibration(_ratio_calibration(1.5, entropy_slowdown=20.0))
    _, names = run(pol)
    assert names == ("zipccl",) * 6
    # policy="auto" with codec="auto": decide() over all codecs; a fast link keeps
    # the rows raw (the stats still name the codec the model preferred).
    zc.set_calibration(cm.default_calibration("cpu", codecs=("zipccl", "entropy")))
    hlo = jax.jit(jax.shard_map(lambda v: zc.compressed_all_gather(v, "x", tiled=True),
                                mesh=mesh8, in_specs=P("x"), out_specs=P("x"))
                  ).lower(x).compile().as_text()
    assert zc.hlo_wire_bytes(hlo).total == 4 * 4096 * 2
  finally:
    zc.set_calibration(None)
  with pytest.raises(ValueError, match="'auto' is reserved"):
    zc.codecs.register(zc.codecs.Codec("auto", 9, "zipccl_jax._src.codecs.window"))


def test_codec_auto_default_by_dtype():
  """Without a calibration, codec="auto" is AUTO_CODEC (the entropy codec) for the
  dtypes it takes and the window codec for float32, which it does not."""
  from zipccl_jax._src import plan as options
  assert zc.AUTO_CODEC == "entropy"
  for dt, want in ((BF16, "entropy"), (F16, "entropy"), (F32, "zipccl")):
    got = options.auto_codec(dtype=dt, m=1 << 16, collective="all_gather", n_peers=N)
    assert got == want, (dt, got)


def test_stats_wire_bytes_match_hlo(mesh8):
  x = gaussian((N * ROWS, COLS), BF16, seed=31)

  def f(v):
    return zc.compressed_psum(v, "x", stats=True, **ALWAYS)

  jf = jax.jit(jax.shard_map(f, mesh=mesh8, in_specs=P("x"), out_specs=(P(), P())))
  wb = zc.hlo_wire_bytes(jf.lower(x).compile().as_text())
  _, s = jf(x)
  # the two switches (reduce-scatter's all-to-all, all-gather), on the rungs taken
  order = [{("collective-permute",): 0, ("all-gather",): 1}[c.opcodes] for c in wb.conditionals]
  rungs = np.asarray(s.rung)
  assert int(s.wire_bytes) == wb.taken([int(rungs[i]) for i in order])
  assert not bool(s.fell_back)
