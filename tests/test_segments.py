"""Segmented transports (segments.py, ffi/segments.h): a planned pytree psum moves
its leaves in shared collectives, every leaf coded as the rows it would be alone.

The oracle is codec="raw" (raw words, the same rank-ordered sums), compared word
for word; the targets are checked against the per-leaf encoder byte for byte.
"""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zc
from tests.reference import assert_bits_equal
from zipccl_jax._src import ffi as zffi
from zipccl_jax._src import planned_slots
from zipccl_jax._src import planned_sites
from zipccl_jax._src import segments
from zipccl_jax._src import row_ops
from zipccl_jax._src.codecs import entropy

BF16 = np.dtype(ml_dtypes.bfloat16)
N = 8


@pytest.fixture(autouse=True)
def _one_measuring_step(monkeypatch):
  """One measuring step, then planned steps (as test_planned.py scripts them). Plans take effect
  at the next step, built when it needs them (compiling ahead: test_planned_ahead.py)."""
  monkeypatch.setattr(planned_slots, "MEASURE_STEPS", 1)
  monkeypatch.setattr(zc, "jit", functools.partial(zc.jit, compile_ahead=False))


def _tree(seed, scale=1e-3, bits=False):
  """A gradient-like pytree: bf16 leaves of many sizes (some not divisible by N, some
  too small to compress), f32 leaves (the window codec; two too small) and an int32 counter;
  sizes per device, some not divisible by N (padded rows)."""
  rng = np.random.default_rng(seed)

  def leaf(n, dtype=BF16):
    if bits:   # incompressible words (no NaN/inf: sums compare word for word)
      word, inf = (np.uint16, 0x7F80) if dtype == BF16 else (np.uint32, 0x7F800000)
      w = rng.integers(0, np.iinfo(word).max, n, dtype=word, endpoint=True)
      w[(w & inf) == inf] = 0
      return w.view(dtype)
    return (rng.standard_normal(n) * scale).astype(dtype)

  sizes = [N * n for n in [4096 * (1 + i % 5) for i in range(12)] + [4096 + 5, 6000 + 3, 5, 64]]
  tree = {"w": [leaf(n) for n in sizes], "f32": [leaf(N * n, np.float32) for n in (8192, 3 * 4096 + 1, 3, 5)],
          "step": np.arange(N, dtype=np.int32)}
  return tree


def _psum(mesh, axes="x", check_vma=True, **kw):
  kw = dict(policy="always", bucket_bytes=0, **kw)
  spec = P(axes)
  return lambda t: jax.shard_map(lambda v: zc.compressed_psum(v, axes, **kw), mesh=mesh, in_specs=spec,
                                 out_specs=P(), check_vma=check_vma)(t)


def _shard(mesh, tree, axes="x"):
  return jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P(axes))), tree)


def _equal(got, want, what):
  for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
    assert_bits_equal(np.asarray(a), np.asarray(b), f"{what} leaf {i}")


def _ops(text: str, op: str) -> int:
  return text.count(f" {op}(")


def test_planned_pytree_psum_shares_collectives_and_equals_raw(mesh8):
  f = zc.jit(_psum(mesh8))
  raw = jax.jit(_psum(mesh8, codec="raw"))
  tree = _shard(mesh8, _tree(0))
  for step in range(4):   # measure, then planned
    _equal(f(tree), raw(tree), f"step {step}")
  sites = f.site_stats(tree)
  # the compressed leaves (14 bf16, 2 f32): two sites each (reduce-scatter, all-gather)
  assert len(sites) == 2 * 16
  assert all(s.slot_bytes is not None and s.used_bytes <= s.slot_bytes for s in sites)
  text = f.compiled(tree).as_text()
  # four groups (bf16 and f32, coded and raw): N - 1 permutes and one all-gather
  # each, whatever the number of leaves; no conditional
  assert _ops(text, "collective-permute") == 4 * (N - 1)
  assert _ops(text, "all-gather") == 4
  assert _ops(text, "conditional") == 0
  assert text.count('custom_call_target="zipccl_segments_encode"') == 8
  # stats=True: the coded leaves' stats add up to their sites' slots x the rows each
  # sends (N - 1 in the reduce-scatter on CPU, one in the all-gather)
  g = zc.jit(lambda t: jax.shard_map(lambda v: zc.compressed_psum(v, "x", policy="always", bucket_bytes=0,
                                                                   stats=True),
                                     mesh=mesh8, in_specs=P("x"), out_specs=(P(), P()))(t))
  for _ in range(2):
    ys, sts = g(tree)
  _equal(ys, raw(tree), "stats=True")
  coded = sts["w"][:14] + sts["f32"][:2]
  sent = sum((N - 1 if st.signature[0] == "an all_to_all" else 1) * st.slot_bytes for st in g.site_stats(tree))
  assert sum(int(np.max(st.wire_bytes)) for st in coded) == sent


def test_a_leaf_that_outgrows_its_slot_reruns_exactly(mesh8):
  """Leaves that stop compressing mid-run overflow their segments' slots: the step is
  re-run and equals raw, and those sites are re-planned."""
  f = zc.jit(_psum(mesh8))
  raw = jax.jit(_psum(mesh8, codec="raw"))
  easy, hard = _shard(mesh8, _tree(1)), _shard(mesh8, _tree(2, bits=True))
  for step, t in enumerate([easy, easy, hard, hard, easy]):
    _equal(f(t), raw(t), f"step {step}")
  assert sum(s.replans for s in f.site_stats(easy)) > 0


def test_gradient_vmap_and_a_2d_mesh(mesh8, mesh4x2):
  """The segmented psum's VJP (with and without vma types), under jax.vmap, and over
  one axis of a 2-D mesh (permutes over that axis' groups only)."""
  tree = {"a": _tree(3)["w"][:6]}
  for check_vma in (True, False):
    def loss(t, ps=_psum(mesh8, check_vma=check_vma)):
      return sum(jnp.sum(v.astype(jnp.float32) ** 2) for v in jax.tree.leaves(ps(t)))
    g = zc.jit(jax.grad(loss))
    want = jax.jit(jax.grad(lambda t, ps=_psum(mesh8, check_vma=check_vma, codec="raw"): sum(
        jnp.sum(v.astype(jnp.float32) ** 2) for v in jax.tree.leaves(ps(t)))))
    x = _shard(mesh8, tree)
    for step in range(2):
      _equal(g(x), want(x), f"grad check_vma={check_vma} step {step}")
  f = zc.jit(_psum(mesh4x2, axes="a"))
  raw = jax.jit(_psum(mesh4x2, axes="a", codec="raw"))
  x = _shard(mesh4x2, {"a": [v[: 4 * (v.size // 4)] for v in tree["a"]]}, "a")
  for step in range(2):
    _equal(f(x), raw(x), f"2-D mesh step {step}")
  batched = {"a": [np.stack([v, -v]) for v in tree["a"][:3]]}

  def vm(ps):
    return lambda t: jax.vmap(ps, in_axes=1, out_axes=0)(t)

  spec = NamedSharding(mesh8, P(None, "x"))
  xb = jax.tree.map(lambda a: jax.device_put(a, spec), batched)
  kw = dict(policy="always", bucket_bytes=0)
  body = lambda c: lambda t: jax.shard_map(jax.vmap(lambda v: zc.compressed_psum(v, "x", codec=c, **kw)),
                                           mesh=mesh8, in_specs=P(None, "x"), out_specs=P())(t)
  f, raw = zc.jit(body("auto")), jax.jit(body("raw"))
  for step in range(2):
    _equal(f(xb), raw(xb), f"vmap step {step}")


def _four(mesh, **kw):
  """all_gather (tiled, and not), psum_scatter, all_to_all and psum of one pytree."""
  kw = dict(policy="always", bucket_bytes=0, **kw)

  def body(t):
    return (zc.compressed_all_gather(t, "x", tiled=True, **kw),
            zc.compressed_all_gather(t, "x", to="invarying", **kw),
            zc.compressed_psum_scatter(t, "x", tiled=True, **kw),
            zc.compressed_all_to_all(t, "x", 0, 0, tiled=True, **kw))

  return lambda t: jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                                 out_specs=(P("x"), P(), P("x"), P("x")))(t)


def test_gather_scatter_and_all_to_all_pytrees_share_collectives(mesh8):
  rng = np.random.default_rng(8)
  shapes = [(N * 64, 96), (N * 8, 1024), (N * 3, 5), (N * 256,), (N * 16, 640)]
  tree = [(rng.standard_normal((N,) + s) * 1e-2).astype(BF16).reshape((N * s[0],) + s[1:]) for s in shapes]
  tree.append((rng.standard_normal((N * 64, 64)) * 1e-2).astype(np.float32))
  x = _shard(mesh8, tree)
  f, raw = zc.jit(_four(mesh8)), jax.jit(_four(mesh8, codec="raw"))
  for step in range(3):
    _equal(f(x), raw(x), f"step {step}")
  text = f.compiled(x).as_text()
  # per collective and group (bf16 coded, bf16 raw, f32 coded): the all-gathers one
  # all-gather, psum_scatter and all_to_all N - 1 permutes, however many leaves (XLA
  # merges the two all-gathers, and the two all-to-alls: they move the same rows)
  assert 3 <= _ops(text, "all-gather") <= 2 * 3
  assert 3 * (N - 1) <= _ops(text, "collective-permute") <= 2 * 3 * (N - 1)
  # the FSDP pattern: gather a parameter pytree, its gradient reduce-scattered
  params = [v[: N * (v.shape[0] // N)] for v in tree[:3]]

  def loss(ps, codec):
    def body(p):
      full = zc.compressed_all_gather(p, "x", tiled=True, codec=codec, policy="always", bucket_bytes=0)
      return sum(jnp.sum(jnp.sin(v.astype(jnp.float32))) for v in full)[None]   # per device
    return jnp.sum(jax.shard_map(body, mesh=mesh8, in_specs=P("x"), out_specs=P("x"))(ps))

  g, want = zc.jit(jax.grad(lambda ps: loss(ps, "auto"))), jax.jit(jax.grad(lambda ps: loss(ps, "raw")))
  xp = _shard(mesh8, params)
  for step in range(2):
    _equal(g(xp), want(xp), f"grad step {step}")


def _encode_leaf(x):
  return [np.asarray(a) for a in jax.jit(entropy.encode_rows)(x)]


def test_targets_code_each_segment_as_the_leaf_alone():
  """zipccl_segments_encode / _decode: a coded segment's wire bytes are the per-leaf
  encoder's first slot bytes; raw segments are the words (of every row); used sizes
  per segment; a cut segment fails to decode (all-one bits, nonzero status); a
  skipped row's coded segments take fill."""
  rng = np.random.default_rng(5)
  widths = [4096, 6000, 300, 2048]
  x = (rng.standard_normal((3, sum(widths))) * 1e-2).astype(BF16)
  parts = np.split(x, np.cumsum(widths)[:-1], axis=1)
  used = [int(_encode_leaf(p)[1][:, 2].max()) * 128 for p in parts]
  slots = [used[0] + 256, 0, segments.MEASURE, used[3] - 128]   # coded, raw, measured, cut
  skip = np.array([0, 0, 1], np.uint8)
  enc = jax.jit(lambda v, s: segments.encode_target(v, 2, widths, slots, s))
  payload, got_used = (np.asarray(a) for a in enc(x, skip))
  assert payload.shape == (3, segments.wire_width(widths, slots, 2))
  assert list(got_used) == [used[0] // 128, 0, used[2] // 128, used[3] // 128]
  offs = np.cumsum([0] + [s if s > 0 else w * 2 for w, s in zip(widths, slots)])
  for r in range(2):
    np.testing.assert_array_equal(payload[r, offs[0]:offs[1]], _encode_leaf(parts[0])[0][r, :slots[0]])
    np.testing.assert_array_equal(payload[r, offs[1]:offs[2]].view(np.uint16), parts[1][r].view(np.uint16))
  fill = np.full((1, sum(widths)), 7, BF16)
  dec = jax.jit(lambda p, s, f: segments.decode_target(p, 2, widths, slots, jnp.bfloat16, s, f))
  y, status = (np.asarray(a) for a in dec(payload, skip, fill))
  yw, xw = y.view(np.uint16), x.view(np.uint16)
  ok = np.concatenate([np.arange(0, widths[0] + widths[1] + widths[2])])
  np.testing.assert_array_equal(yw[:2, ok], xw[:2, ok])
  assert (yw[:2, -widths[3]:] == 0xFFFF).all() and status[3] > 0 and (status[:3] == 0).all()
  # the skipped row: its coded segments from fill, its raw ones from the wire
  o = np.cumsum([0] + widths)
  want = np.concatenate([fill[0, :o[1]], x[2, o[1]:o[3]], fill[0, o[3]:]]).view(np.uint16)
  np.testing.assert_array_equal(yw[2], want)
  with pytest.raises(Exception, match="zipccl_segments_encode: widths add up to"):
    jax.jit(lambda v: segments.encode_target(v, 2, [4096], [0], jnp.zeros(3, jnp.uint8)))(x)
  with pytest.raises(Exception, match=r"slots\[0\] = .* exceeds the segment's max_nbytes"):
    jax.jit(lambda v: segments.encode_target(v, 2, [sum(widths)], [1 << 24], jnp.zeros(3, jnp.uint8)))(x)
  with pytest.raises(Exception, match="zipccl_segments_decode: the entropy codec takes bfloat16 or float16"):
    jax.jit(lambda p: segments.decode_target(p, 2, widths, slots, jnp.float32, jnp.zeros(3, jnp.uint8),
                                      jnp.zeros((0, sum(widths)), jnp.float32)))(payload)
  with pytest.raises(Exception, match="zipccl_segments_decode: payload must be"):
    dec(payload[:, :-128], skip, fill)


@pytest.mark.parametrize("codec_id,dtype", [(2, BF16), (1, BF16), (1, np.float32)])
def test_xla_composition_equals_the_targets(codec_id, dtype):
  """encode_xla / decode_xla (the platforms with no segment targets): the targets'
  bytes, used sizes, values and statuses, for coded, raw, measured and cut segments,
  skipped rows and fills of F = 0, 1 and R rows."""
  rng = np.random.default_rng(9)
  widths = [4096, 6000, 300, 2048, 77]
  x = (rng.standard_normal((4, sum(widths))) * 1e-2).astype(dtype)
  skip = np.array([0, 1, 0, 0], np.uint8)
  enc = jax.jit(lambda v, k, sl: segments.encode_target(v, codec_id, widths, sl, k), static_argnums=2)
  enc_xla = jax.jit(lambda v, k, sl: segments.encode_xla(v, codec_id, widths, sl, k), static_argnums=2)
  used = np.asarray(enc(x, skip, (-1,) * 5)[1]) * 128
  slots = (int(used[0]) + 256, 0, -1, int(used[3]) - 128, 0)   # coded, raw, measured, cut, raw
  (p1, u1), (p2, u2) = enc(x, skip, slots), enc_xla(x, skip, slots)
  np.testing.assert_array_equal(np.asarray(u1), np.asarray(u2))
  coded = np.asarray(slots) > 0
  offs = np.cumsum([0] + [s if s > 0 else w * x.itemsize for w, s in zip(widths, slots)])
  for r in range(4):   # a skipped row's coded segments are unspecified
    for i in range(5):
      if skip[r] and coded[i]:
        continue
      np.testing.assert_array_equal(np.asarray(p1)[r, offs[i]:offs[i + 1]], np.asarray(p2)[r, offs[i]:offs[i + 1]])
  word = np.uint16 if dtype == BF16 else np.uint32
  for f in (0, 1, 4):
    fill = (x[:f] * 3).astype(dtype)
    y1, s1 = jax.jit(lambda p, k, fl: segments.decode_target(p, codec_id, widths, slots, dtype, k, fl))(p1, skip, fill)
    y2, s2 = jax.jit(lambda p, k, fl: segments.decode_xla(p, codec_id, widths, slots, dtype, k, fl))(p1, skip, fill)
    np.testing.assert_array_equal(np.asarray(s1), np.asarray(s2))
    assert np.asarray(s1)[3] > 0 and not np.asarray(s1)[[0, 1, 2, 4]].any()
    rows = [0, 2, 3] if f == 0 else [0, 1, 2, 3]   # F = 0: skipped rows unwritten
    np.testing.assert_array_equal(np.asarray(y1).view(word)[rows], np.asarray(y2).view(word)[rows])


def test_planned_pytrees_on_the_xla_composition_equal_raw(mesh8, monkeypatch):
  """The whole planned program as a platform without the CPU targets runs it (every
  platform_dependent takes its default branch, on this CPU): equal to raw."""
  from zipccl_jax._src import compat
  monkeypatch.setattr(compat, "platform_dependent", lambda *a, cpu, default: default(*a))
  tree = _shard(mesh8, _tree(10))
  f, raw = zc.jit(_psum(mesh8)), jax.jit(_psum(mesh8, codec="raw"))
  for step in range(3):
    _equal(f(tree), raw(tree), f"psum step {step}")
  text = f.compiled(tree).as_text()
  assert "zipccl_segments" not in text and _ops(text, "all-gather") == 4


def test_row_pack_inverts_row_unpack_and_mailbox_records_elementwise():
  rng = np.random.default_rng(6)
  xs = [rng.integers(0, 1 << 16, (3, w), dtype=np.uint16).view(BF16) for w in (5, 1, 9)]
  xs[0][0, 0] = np.uint16(0x7FC1).view(BF16)      # a NaN payload, kept
  packed = jax.jit(lambda *v: segments.pack(v))(*xs)
  np.testing.assert_array_equal(np.asarray(packed).view(np.uint16),
                                np.concatenate([x.view(np.uint16) for x in xs], axis=1))
  back = jax.jit(lambda v: row_ops.unpack(v, [5, 1, 9]))(packed)
  for a, b in zip(back, xs):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), b.view(np.uint16))
  ledger = 424242
  used = jnp.array([[3, 0, 5], [4, 2, -1]], jnp.int32)     # two batch rows, 3 sites
  status = jnp.array([0, 6, 0], jnp.int32)
  jax.jit(lambda v, a, b: planned_sites.record(v, [a, b], ledger, 2, planned_sites.ELEMENTWISE))(
      jnp.zeros(4), used, status)
  assert list(zffi.mailbox_take(ledger)) == [-1, -1, 4, 0, 2, 6, 5, 0]
  with pytest.raises(Exception, match="with column -2 every value must have value 0's last dimension 3"):
    jax.jit(lambda v: planned_sites.record(v, [used, jnp.zeros(2, jnp.int32)], ledger, 0,
                                           planned_sites.ELEMENTWISE))(jnp.zeros(4))
  assert list(zffi.mailbox_take(ledger)) == []
