"""The slot-ladder transport (zipccl_jax/_src/transport.py), driven by the "trim" toy
codec (tests/trim_codec.py) so that each test chooses the used size of every
participant's rows: different size classes per device, the raw rung, corrupted
payloads, huge operands (shapes only), VJPs and a 2-D mesh. Results are compared
word for word with codec="raw" and with the inputs (gathers, permutes) or the
rank-ordered float32 sum (reductions).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax._src import ladder as ladder_lib
from tests.jaxtest import smap
from tests.reference import BF16, F16, F32, assert_bits_equal, gaussian, ordered_sum

N = 8
TRIM = dict(codec="trim", policy="always")


@pytest.fixture(scope="module", autouse=True)
def trim_codecs():
  zc.codecs.register(zc.codecs.Codec("trim", 90, "tests.trim_codec"))
  zc.codecs.register(zc.codecs.Codec("trim_corrupt", 91, "tests.trim_codec_corrupt"))
  zc.codecs.register(zc.codecs.Codec("trim_skip", 92, "tests.trim_codec_skip"))
  yield
  zc.codecs.unregister("trim")
  zc.codecs.unregister("trim_corrupt")
  zc.codecs.unregister("trim_skip")



def blocks_with_tails(rows, cols, dtype, keep, seed=0):
  """N blocks of [rows, cols]; block d keeps its first keep[d] elements (flattened)
  nonzero and zeroes the rest, so its trimmed row uses ~keep[d] * itemsize bytes."""
  x = gaussian((N, rows * cols), dtype, seed=seed)
  x[x == 0] = 1   # no accidental zeros inside the kept part
  for d, k in enumerate(keep):
    x[d, k:] = 0
  return x.reshape(N * rows, cols)


def used_units(nonzero_bytes, raw):
  """The trim codec's used size (units of 128 B) of a row with this many nonzero bytes."""
  return max(1 + -(-nonzero_bytes // 128), 1 + -(-(3 * raw // 4) // 128))


def trim_ladder(raw):
  return ladder_lib.ladder(128 + -(-(3 * raw // 4) // 128) * 128, raw)


def expected_rung(max_used_bytes, rungs):
  return sum(1 for r in rungs if max_used_bytes > r)


# ---- size classes, raw rung, exactness ------------------------------------------------------------


def _five(mesh, x, **kw):
  ring = [(i, (i + 1) % N) for i in range(N)]

  @smap(mesh, P("x"), ((P(), P("x"), P("x"), P("x"), P()), P()))
  def f(v):
    outs = (zc.compressed_all_gather(v, "x", tiled=True, to="invarying", stats=True, **kw),
            zc.compressed_all_to_all(v, "x", 1, 1, tiled=True, stats=True, **kw),
            zc.compressed_ppermute(v, "x", ring, stats=True, **kw),
            zc.compressed_psum_scatter(v, "x", scatter_dimension=1, tiled=True, stats=True, **kw),
            zc.compressed_psum(v, "x", stats=True, **kw))
    st = {k: jnp.stack([o[1].rung[-1] if k == "rung" else getattr(o[1], k) for o in outs])
          for k in ("rung", "decode_errors")}
    st["used"] = jnp.stack([o[1].used_units[0] for o in outs])
    return tuple(o[0] for o in outs), st

  return f(x)


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=lambda d: d.name)
def test_each_device_its_own_size_class(mesh8, dtype):
  rows, cols = 4, 512
  n = rows * cols
  keep = [1560 + 40 * d for d in range(N)]   # device d uses ~keep[d] of 2048 elements
  x = blocks_with_tails(rows, cols, dtype, keep, seed=3)
  ys, st = _five(mesh8, x, **TRIM)
  raw = _five(mesh8, x, codec="raw", policy="always")[0]
  for name, y, r in zip(("all_gather", "all_to_all", "ppermute", "psum_scatter", "psum"), ys, raw):
    assert_bits_equal(y, r, name)
  assert_bits_equal(ys[0], x, "all_gather vs input")
  blocks = np.split(x, N)
  assert_bits_equal(ys[4], ordered_sum(blocks, dtype), "psum")
  # the gather's row is the whole block: the largest device decides the rung for all
  item = np.dtype(dtype).itemsize
  want_units = used_units(max(keep) * item, n * item)
  assert int(st["used"][0]) == want_units
  rungs = trim_ladder(n * item)
  assert int(st["rung"][0]) == expected_rung(want_units * 128, rungs)
  assert int(st["rung"][0]) < len(rungs)          # not the raw rung
  assert np.all(np.asarray(st["decode_errors"]) <= 0)   # -1: not counted (no check_decode)


def test_one_incompressible_device_takes_the_raw_rung(mesh8):
  rows, cols = 4, 512
  keep = [64] * N
  keep[5] = rows * cols   # device 5: no zero tail at all
  x = blocks_with_tails(rows, cols, BF16, keep, seed=4)
  ys, st = _five(mesh8, x, **TRIM)
  raw = _five(mesh8, x, codec="raw", policy="always")[0]
  for y, r in zip(ys, raw):
    assert_bits_equal(y, r)
  ladder = trim_ladder(rows * cols * 2)
  assert int(st["rung"][0]) == len(ladder)         # all_gather: the raw rung
  assert int(st["rung"][2]) == len(ladder)         # ppermute: device 5 sends


# ---- the own row is not coded (docs/format.md, "Skipped rows") ------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F32], ids=lambda d: d.name)
def test_own_row_is_neither_encoded_nor_decoded(mesh8, dtype):
  """trim_skip garbles skipped rows and requires skip + fill: exact results prove the
  transports mark exactly the own row (all-to-all: sent and received; gather: received)."""
  # every row of 1024 (an all-to-all's message) has a zero tail: all of them compress
  x = gaussian((N * 8, 1024), dtype, seed=11)
  x[x == 0] = 1
  for i in range(N * 8):
    x[i, 600 + 13 * (i % 11):] = 0
  kw = dict(codec="trim_skip", policy="always", stats=True)

  @smap(mesh8, P("x"), ((P("x"), P()), (P("x"), P()), (P(), P()), (P("x"), P()), (P(), P())))
  def f(v):
    return (zc.compressed_all_gather(v, "x", tiled=True, **kw),
            zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, **kw),
            zc.compressed_psum(v, "x", **kw),
            zc.compressed_psum_scatter(v, "x", tiled=True, **kw),
            zc.compressed_all_gather(v, "x", tiled=True, to="invarying", **kw))

  @smap(mesh8, P("x"), (P("x"), P("x"), P(), P("x"), P()))
  def raw(v):
    kw = dict(codec="raw")
    return (zc.compressed_all_gather(v, "x", tiled=True, **kw),
            zc.compressed_all_to_all(v, "x", 0, 0, tiled=True, **kw),
            zc.compressed_psum(v, "x", **kw),
            zc.compressed_psum_scatter(v, "x", tiled=True, **kw),
            zc.compressed_all_gather(v, "x", tiled=True, to="invarying", **kw))

  ys = f(x)
  for name, (y, st), r in zip(("all_gather", "all_to_all", "psum", "psum_scatter",
                               "all_gather inv"), ys, raw(x)):
    assert_bits_equal(y, r, name)
    if name in ("all_to_all", "psum_scatter"):   # rows of 256 with zero tails: compressed
      assert not bool(np.any(np.asarray(st.raw_rung))), name
  assert_bits_equal(ys[0][0][:x.shape[0]], x, "all_gather vs input")


def test_gathers_do_not_decode_their_own_row(mesh8):
  """A gather's own row is its input: every decode of the gathers (all_gather both
  ways, psum's second phase) gets the skip mask and the fill, and stays exact (a
  mask on the wrong row would put this device's data in another's place)."""
  from tests import skip_spy_codec as spy
  zc.codecs.register(zc.codecs.Codec("skip_spy", 93, "tests.skip_spy_codec"))
  try:
    x = gaussian((N * 4, 512), BF16, seed=14)
    spy.CALLS.clear()
    kw = dict(codec="skip_spy", policy="always")
    ys = smap(mesh8, P("x"), (P("x"), P(), P()))(lambda v: (
        zc.compressed_all_gather(v, "x", tiled=True, **kw),
        zc.compressed_all_gather(v, "x", tiled=True, to="invarying", **kw),
        zc.compressed_psum(v, "x", **kw)))(x)
    raw = smap(mesh8, P("x"), (P("x"), P(), P()))(lambda v: (
        zc.compressed_all_gather(v, "x", tiled=True, codec="raw"),
        zc.compressed_all_gather(v, "x", tiled=True, to="invarying", codec="raw"),
        zc.compressed_psum(v, "x", codec="raw")))(x)
    for y, r in zip(ys, raw):
      assert_bits_equal(y, r)
    assert_bits_equal(ys[1], x)
    assert spy.CALLS and all(c == (True, True) for c in spy.CALLS), spy.CALLS
  finally:
    zc.codecs.unregister("skip_spy")


@pytest.mark.parametrize("codec", ["zipccl", "entropy"])
def test_own_incompressible_row_does_not_decide_the_rung(mesh8, codec):
  """Device d's row d of a reduce-scatter never leaves it: random bits there (which
  no codec shrinks) must not push the call to the raw rung."""
  m = 8192
  x = gaussian((N, N, m), BF16, seed=12)
  bits = np.random.default_rng(13).integers(0, 2 ** 16, size=(N, m), dtype=np.uint16)
  for d in range(N):
    x[d, d] = bits[d].view(BF16)
  x = x.reshape(N * N, m)

  @smap(mesh8, P("x"), (P("x"), P()))
  def f(v):
    return zc.compressed_psum_scatter(v, "x", tiled=True, stats=True, codec=codec,
                                      policy="always")

  y, st = f(x)
  want = smap(mesh8, P("x"), P("x"))(
      lambda v: zc.compressed_psum_scatter(v, "x", tiled=True, codec="raw"))(x)
  assert_bits_equal(y, want)
  assert not bool(st.raw_rung), "the own (incompressible) row decided the rung"
  assert float(st.ratio) > 1.2
  # the count and its elements leave the own rows out (N - 1 coded rows per device)
  assert st.elements == N * (N - 1) * m
  if codec == "zipccl":   # escapes of Gaussian rows only: random bits would escape ~all
    assert 0 < float(st.escape_rate) < 0.2


def test_stats_report_rung_used_and_slot_bytes(mesh8):
  rows, cols = 8, 256
  n = rows * cols
  keep = [1500] * N
  keep[2] = 1800
  x = blocks_with_tails(rows, cols, BF16, keep, seed=5)

  @smap(mesh8, P("x"), (P(), P()))
  def f(v):
    return zc.compressed_all_gather(v, "x", tiled=True, to="invarying", stats=True, **TRIM)

  _, s = f(x)
  rungs = trim_ladder(2 * n)
  want_used = used_units(1800 * 2, 2 * n) * 128
  r = expected_rung(want_used, rungs)
  assert s.collective == "all_gather" and s.codec == "trim" and s.compressed
  assert np.asarray(s.rung).tolist() == [r] and not bool(s.raw_rung) and not bool(s.fell_back)
  assert np.asarray(s.used_bytes).tolist() == [want_used]
  assert np.asarray(s.slot_bytes).tolist() == [rungs[r]]
  assert rungs[r] >= want_used
  assert int(s.wire_bytes) == rungs[r] + s.agree_bytes
  assert s.raw_bytes == 2 * n and float(s.ratio) > 1
  text = f.lower(x).compile().as_text()
  wb = zc.hlo_wire_bytes(text)
  (cond,) = wb.conditionals
  assert len(cond.branch_bytes) == len(rungs) + 1 and cond.branch_bytes[-1] == 2 * n
  assert list(cond.branch_bytes[:-1]) == list(rungs)   # one slot per rung
  assert wb.taken([r]) == int(s.wire_bytes)
  # the agreement: an all-gather of (used, count, 4 fingerprint fields), with or without stats
  assert s.agree_bytes == 24
  assert wb.common == rungs[0] + 24 and wb.fallback == 2 * n + 24


def test_psum_stats_have_two_transports(mesh8):
  x = blocks_with_tails(8, 256, BF16, [2048] * N, seed=6)   # dense: both phases raw
  _, s = smap(mesh8, P("x"), (P(), P()))(
      lambda v: zc.compressed_psum(v, "x", stats=True, **TRIM))(x)
  assert np.asarray(s.rung).shape == (2,) and bool(s.raw_rung)
  assert int(s.wire_bytes) == s.raw_bytes + s.agree_bytes


# ---- decode failures are never silent -------------------------------------------------------------


def test_decode_errors_give_nan_rows_and_stats(mesh8):
  x = blocks_with_tails(4, 512, BF16, [1600] * N, seed=7)

  @smap(mesh8, P("x"), (P(), P()))
  def f(v):
    return zc.compressed_all_gather(v, "x", tiled=True, to="invarying", stats=True,
                                    codec="trim_corrupt", policy="always", check_decode=False)

  y, s = f(x)
  y = np.asarray(y).view(np.uint16).reshape(N, -1)
  assert np.all(y[0] == 0xFFFF), "a row that failed to decode must be all-one bits"
  assert_bits_equal(y[1:].view(BF16), x.reshape(N, -1)[1:])
  assert int(s.decode_errors) == -1   # not counted without check_decode (no extra collective)


def test_check_decode_raises(mesh8):
  x = blocks_with_tails(4, 512, BF16, [1600] * N, seed=8)
  f = smap(mesh8, P("x"), P("x"))(lambda v: zc.compressed_all_gather(
      v, "x", tiled=True, codec="trim_corrupt", policy="always", check_decode=True))
  with pytest.raises(Exception, match="failed to decode"):
    jax.block_until_ready(f(x))   # the results themselves fail: nobody can use the NaN rows
  # A clean call with the check replaces the failed call's runtime tokens, so the error
  # does not come back at later effects barriers (nor at interpreter exit).
  g = smap(mesh8, P("x"), P("x"))(lambda v: zc.compressed_all_gather(
      v, "x", tiled=True, codec="trim", policy="always", check_decode=True))
  want = smap(mesh8, P("x"), P("x"))(lambda v: jax.lax.all_gather(v, "x", tiled=True))(x)
  assert_bits_equal(g(x), want)
  jax.effects_barrier()


def test_check_decode_is_validated(mesh8):
  with pytest.raises(TypeError, match="check_decode must be a bool"):
    smap(mesh8, P("x"), P("x"))(lambda v: zc.compressed_psum_scatter(
        v, "x", tiled=True, check_decode=1))(np.zeros((64, 8), np.float32))


# ---- sizes above 2 GiB: shapes only, nothing is allocated ----------------------------------------


@pytest.mark.parametrize("stats", [False, True])
def test_operands_of_2_gib_per_device_trace(mesh8, stats):
  n = (1 << 30) + 2048                    # bf16: 2 GiB + 4 KiB per device
  x = jax.ShapeDtypeStruct((N * n,), jnp.bfloat16)

  def body(v):
    y = zc.compressed_psum_scatter(v, "x", tiled=True, policy="always", stats=stats)
    return y[0] if stats else y

  out = jax.eval_shape(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=P("x")), x)
  assert out.shape == (n,)

  def gather(v):
    y = zc.compressed_all_gather(v[:n // 8], "x", tiled=True, codec="trim", policy="always",
                                 stats=stats)
    return y[0] if stats else y

  out = jax.eval_shape(jax.shard_map(gather, mesh=mesh8, in_specs=P("x"), out_specs=P("x")), x)
  assert out.shape == (N * N * (n // 8),)


def test_stats_sizes_are_exact_python_ints_above_2_gib():
  big = (5 << 30) + 256
  st = zc.CollectiveStats(rung=np.array([1], np.int32), used_units=np.array([7], np.int32),
                          escape_count=np.int32(0), decode_errors=np.int32(0),
                          collective="psum_scatter", codec="zipccl", compressed=True,
                          raw_bytes=big, elements=1, slots=((big // 2, big - 128, big),),
                          slot_sizes=((1, 2, 3),), agree_bytes=4)
  assert int(st.wire_bytes) == big - 124 and int(st.used_bytes[0]) == 7 * 128
  assert not bool(st.raw_rung) and abs(float(st.ratio) - big / (big - 124)) < 1e-12


# ---- options ------------------------------------------------------------------------------------


def test_codec_names_come_from_the_registry(mesh8):
  assert {"zipccl", "trim"} <= set(zc.codecs.names())
  with pytest.raises(ValueError, match="codec must be one of 'auto', 'zipccl'.*'raw', None"):
    smap(mesh8, P("x"), P("x"))(lambda v: zc.compressed_ppermute(
        v, "x", [(0, 1)], codec="zstd"))(np.zeros((64, 8), np.float32))
  with pytest.raises(ValueError, match="already registered"):
    zc.codecs.register(zc.codecs.Codec("trim", 90, "tests.trim_codec"))


# ---- autodiff and a 2-D mesh -------------------------------------------------------------------------


def test_vjps_through_the_ladder_match_raw(mesh8):
  x = blocks_with_tails(8, 256, F32, [1600 + 50 * d for d in range(N)], seed=10)

  def loss(codec):
    kw = dict(codec=codec, policy="always")

    @smap(mesh8, P("x"), P("x"))
    def g(v):
      def f(u):
        a = zc.compressed_all_gather(u, "x", tiled=True, **kw)   # VJP: a psum_scatter
        d = zc.compressed_ppermute(u, "x", [(i, (i + 3) % N) for i in range(N)], **kw)
        return jnp.sum(a * a) + jnp.sum(d * u)
      return jax.grad(f)(v)
    return g(x)

  assert_bits_equal(loss("trim"), loss("raw"))


def test_two_axis_mesh(mesh4x2):
  x = blocks_with_tails(2, 512, BF16, [800 + 30 * d for d in range(N)], seed=11)

  def run(**kw):
    @smap(mesh4x2, P(("a", "b")), (P(), P(("a", "b"))))
    def f(v):
      g = zc.compressed_all_gather(v, ("a", "b"), tiled=True, to="invarying", **kw)
      s = zc.compressed_psum_scatter(v, ("a", "b"), scatter_dimension=1, tiled=True, **kw)
      return g, s
    return f(x)

  (g, s), (g_raw, s_raw) = run(**TRIM), run(codec="raw", policy="always")
  assert_bits_equal(g, x) and assert_bits_equal(g, g_raw)
  assert_bits_equal(s, s_raw)


def test_groups_of_one_axis_on_different_rungs(mesh4x2):
  """Transports over "a" of a 4 x 2 mesh: the two "a" groups agree separately, so
  one takes the raw rung and the other a compressed one in the same call. Every
  branch of a transport's switch issues the same collectives (docs/design.md: an
  XLA:CPU collective-permute rendezvous spans both groups), so nothing hangs and
  every result is exact."""
  x = gaussian((8 * 8, 1024), BF16, seed=21)
  blk = x[5 * 8:6 * 8].view(np.uint16)        # device 5 (a=2, b=1): random bits
  blk[:] = np.random.default_rng(22).integers(0, 2 ** 16, size=blk.shape, dtype=np.uint16)
  ring = [(0, 1), (1, 2), (2, 3), (3, 0)]
  spec = P(("a", "b"))

  def run(**kw):
    @smap(mesh4x2, spec, (spec, spec, spec, spec, P("b")))
    def f(v):
      pp, st = zc.compressed_ppermute(v, "a", ring, stats=True, **kw)
      a2a = zc.compressed_all_to_all(v, "a", 0, 0, tiled=True, **kw)
      rs = zc.compressed_psum_scatter(v, "a", tiled=True, **kw)
      ag = zc.compressed_all_gather(v, "a", tiled=True, **kw)
      return pp, a2a, rs, ag, (st.rung if kw.get("codec") != "raw" else st.rung * 0)[None]
    return f(jax.device_put(x, jax.NamedSharding(mesh4x2, spec)))

  got, want = run(codec="zipccl", policy="always"), run(codec="raw", policy="always")
  for name, y, r in zip(("ppermute", "all_to_all", "psum_scatter", "all_gather"), got, want):
    assert_bits_equal(y, r, name)
  rungs = np.asarray(got[4]).reshape(-1)
  assert rungs[0] != rungs[1], f"the groups should take different rungs, got {rungs}"
