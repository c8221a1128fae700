"""Differentiation of the compressed collectives: custom VJPs and JVPs.

The transpose of each collective is another compressed collective with the same
options (no stats): all_gather <-> psum_scatter, all_to_all with its axes swapped,
ppermute with the inverted permutation, psum as JAX's shard_map rule
(docs/design.md, "Autodiff"). `with_vjp` makes an implementation differentiable
in both modes; the bucketed twins (`bag`, `brs`, ...) pack a tuple of rows into one
transport inside the custom VJP, so that their gradients are bucketed collectives
too.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import compat
from zipccl_jax._src import segments
from zipccl_jax._src import row_ops
from zipccl_jax._src.collectives import impl


# The transpose of each collective is another compressed collective with the same
# options (no stats): all_gather <-> psum_scatter, all_to_all with its axes swapped,
# ppermute with the inverted permutation, psum as JAX's shard_map rule.


def _float0_zeros(a):
  """The tangent of an integer/bool output (the stats): float0 zeros, as JAX wants."""
  return np.zeros(np.shape(a), jax.dtypes.float0)


def with_vjp(fwd, bwd):
  """fwd(x, cfg) -> (y, stats) made differentiable in both modes.

  Reverse mode (jax.grad, jax.vjp): a custom_vjp whose backward pass `bwd` is the
  transposed *compressed* collective. Forward mode (jax.jvp, jax.jacfwd): JAX
  cannot run a custom_vjp forward, so a custom_jvp wraps it. Each collective is
  linear in x, so its tangent is the same collective applied to the tangent. In
  reverse mode JAX linearizes that custom_jvp rule and transposes the tangent
  map, which a custom_vjp call cannot be; there the rule differentiates the
  custom_vjp instead, which JAX records as a linear op with our `bwd` as its
  transpose. `compat.tangent_mode` tells the modes apart; where the rule is traced
  into the JVP jaxpr of an inner jit, jax.checkpoint or lax.scan, JAX may later run
  that jaxpr forward or transpose it, and the tangent is a `linear_call` (forward:
  `fwd`; transpose: `bwd`; `compat` gives it a batching rule). The custom_vjp's
  forward calls the custom_jvp function, so a jvp of a grad (Hessian-vector
  products) is forward mode through `bwd`'s collectives: it works too.
  """
  vjp_fn = jax.custom_vjp(fwd, nondiff_argnums=(1,))
  f = jax.custom_jvp(vjp_fn, nondiff_argnums=(1,))
  vjp_fn.defvjp(lambda x, cfg: (f(x, cfg), None), lambda cfg, _, ct: (bwd(cfg, ct[0]),))

  @f.defjvp
  def _jvp(cfg, primals, tangents):
    (x,), (t,) = primals, tangents
    mode = compat.tangent_mode(jax.tree_util.tree_leaves(t)[0])
    if mode == "reverse":
      return jax.jvp(lambda u: vjp_fn(u, cfg), (x,), (t,))
    # Forward mode: the primal and the tangent go through `f` itself, so that an
    # outer forward transformation (jacfwd of jacfwd, a jvp of a jvp) applies this
    # rule again rather than meeting the custom_vjp, which it cannot.
    y, st = f(x, cfg)
    lin = cfg._replace(stats=False)
    if mode == "either":
      # The rule is traced into a JVP jaxpr (of a jit, checkpoint or scan) that JAX
      # may run forward (jax.jvp) or split and transpose (jax.grad): a linear_call
      # runs `fwd` forward and transposes to `bwd`.
      ty = compat.linear_call(lambda _, u: fwd(u, lin)[0], lambda _, ct: bwd(lin, ct), (), t)
    else:
      ty, _ = f(t, lin)
    return (y, st), (ty, jax.tree_util.tree_map(_float0_zeros, st))

  return f


def _ag_bwd(cfg: impl.Cfg, ct):
  if cfg.to == "invarying":
    # lax's rule: the cotangent is replicated, so each peer keeps its own chunk.
    me = lax.axis_index(cfg.axes)
    if cfg.tiled:
      size = ct.shape[cfg.dim] // cfg.n_peers
      return lax.dynamic_slice_in_dim(ct, me * size, size, cfg.dim)
    return lax.dynamic_index_in_dim(ct, me, cfg.dim, keepdims=False)
  back = cfg._replace(fn="compressed_psum_scatter (grad of compressed_all_gather)", stats=False)
  return rs(compat.pvary(ct, cfg.axes), back)[0]


def _rs_bwd(cfg: impl.Cfg, ct):
  back = cfg._replace(fn="compressed_all_gather (grad of compressed_psum_scatter)",
                      stats=False, to="varying")
  return ag(compat.pvary(ct, cfg.axes), back)[0]


def _psum_bwd(cfg: impl.Cfg, ct):
  if compat.check_vma_enabled():
    return compat.pvary(ct, cfg.axes)      # JAX: psum's cotangent is only re-typed
  return psum(ct, cfg._replace(stats=False))[0]  # no vma: psum again


def _a2a_bwd(cfg: impl.Cfg, ct):
  return a2a(compat.pvary(ct, cfg.axes), cfg._replace(dim=cfg.dim2, dim2=cfg.dim, stats=False))[0]


def _pp_bwd(cfg: impl.Cfg, ct):
  inv = tuple((d, s) for s, d in cfg.perm)
  return pp(compat.pvary(ct, cfg.axes), cfg._replace(perm=inv, stats=False))[0]


ag = with_vjp(impl.ag_impl, _ag_bwd)
rs = with_vjp(impl.rs_impl, _rs_bwd)
psum = with_vjp(impl.psum_impl, _psum_bwd)
a2a = with_vjp(impl.a2a_impl, _a2a_bwd)
pp = with_vjp(impl.pp_impl, _pp_bwd)


# Bucketed twins: x is a tuple of rows (of one dtype) packed along their last axis
# into one row (set) for the collective and unpacked after it, in the unsigned
# word domain (XLA:CPU may compute a bf16 concatenate in f32, which would
# canonicalise NaN payloads). Packing is inside the custom VJP, so gradients flow
# (a bitcast has none) and are themselves bucketed collectives. cfg is the neutral
# one of each bucket: rows [M] (gather, psum, permute) or [N, M] (one per peer).


def _pack(xs):
  return row_ops.unbits(jnp.concatenate([row_ops.bits(v) for v in xs], axis=-1),
                          xs[0].dtype)


def _unpack(y, xs):
  """Cuts y along its last axis into pieces as wide as the rows of xs (one custom
  call on CPU: `row_ops.unpack`)."""
  pieces = row_ops.unpack(row_ops.bits(y), [v.shape[-1] for v in xs])
  return tuple(row_ops.unbits(p, y.dtype) for p in pieces)


def _bucketed(fwd):
  def run(xs, cfg):
    y, st = fwd(_pack(xs), cfg)
    return _unpack(y, xs), st
  return run


def _pvary_all(cts, cfg):
  return tuple(compat.pvary(c, cfg.axes) for c in cts)


def _bag_bwd(cfg: impl.Cfg, cts):
  if cfg.to == "invarying":
    me = lax.axis_index(cfg.axes)
    return tuple(lax.dynamic_index_in_dim(c, me, 0, keepdims=False) for c in cts)
  return brs(_pvary_all(cts, cfg), cfg._replace(stats=False))[0]


def _brs_bwd(cfg: impl.Cfg, cts):
  return bag(_pvary_all(cts, cfg), cfg._replace(stats=False, to="varying"))[0]


def _bpsum_bwd(cfg: impl.Cfg, cts):
  if compat.check_vma_enabled():
    return _pvary_all(cts, cfg)
  return bpsum(cts, cfg._replace(stats=False))[0]


def _ba2a_bwd(cfg: impl.Cfg, cts):
  return ba2a(_pvary_all(cts, cfg), cfg._replace(stats=False))[0]


def _bpp_bwd(cfg: impl.Cfg, cts):
  inv = tuple((d, s) for s, d in cfg.perm)
  return bpp(_pvary_all(cts, cfg), cfg._replace(perm=inv, stats=False))[0]


bag = with_vjp(_bucketed(impl.ag_impl), _bag_bwd)
brs = with_vjp(_bucketed(impl.rs_impl), _brs_bwd)
bpsum = with_vjp(_bucketed(impl.psum_impl), _bpsum_bwd)
ba2a = with_vjp(_bucketed(impl.a2a_impl), _ba2a_bwd)
bpp = with_vjp(_bucketed(impl.pp_impl), _bpp_bwd)


# Segmented twins (segments.py): a group of leaves' rows side by side in one planned
# transport, every leaf coded on its own; their callers pass one group of
# `segments.run`. Their transposes are segmented collectives too.


def _segmented(kind):
  def run(xs, cfg):
    ys, sts = segments.group(kind, xs, cfg)
    return tuple(ys), tuple(sts)
  return run


def _sag_bwd(cfg: impl.Cfg, cts):
  if cfg.to == "invarying":
    me = lax.axis_index(cfg.axes)
    return tuple(lax.dynamic_index_in_dim(c, me, 0, keepdims=False) for c in cts)
  return srs(_pvary_all(cts, cfg), cfg._replace(stats=False))[0]


def _srs_bwd(cfg: impl.Cfg, cts):
  return sag(_pvary_all(cts, cfg), cfg._replace(stats=False, to="varying"))[0]


def _spsum_bwd(cfg: impl.Cfg, cts):
  if compat.check_vma_enabled():
    return _pvary_all(cts, cfg)
  return spsum(cts, cfg._replace(stats=False))[0]


def _sa2a_bwd(cfg: impl.Cfg, cts):
  return sa2a(_pvary_all(cts, cfg), cfg._replace(stats=False))[0]


sag = with_vjp(_segmented("all_gather"), _sag_bwd)
srs = with_vjp(_segmented("psum_scatter"), _srs_bwd)
spsum = with_vjp(_segmented("psum"), _spsum_bwd)
sa2a = with_vjp(_segmented("all_to_all"), _sa2a_bwd)
