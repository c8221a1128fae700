"""Pytrees: leaf by leaf, with small leaves packed into buckets that share a transport.

A pytree of many small leaves (a model's gradients: biases, norms, small matrices)
would pay per leaf a row header, the ladder's slack, an agreement and a
collective's latency, and each leaf's transport compiles its own ladder. Leaves of
one dtype are packed into buckets of at most `bucket_bytes` (greedily, in leaf
order) and each bucket moves as one row (set) through the same collective. Every
collective acts element by element on the rows (a gather or permute copies each
element, a reduction sums each element over the peers in rank order), so a leaf's
result is the same bits packed or alone; only the bytes on the wire and the number
of transports change. Leaves no codec takes (integers, bool, fp8, Python scalars)
take the plain lax collective (`takes_lax`).
"""
from __future__ import annotations

from typing import NamedTuple

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import options
from zipccl_jax._src import segments
from zipccl_jax._src import stats as stats_lib


class Item(NamedTuple):
  """A bucketable leaf: its rows and how to turn the bucket's rows back into it."""
  rows: jax.Array       # [m] (gather, psum, permute) or [N, m] (one row per peer)
  post: object          # rows of the result, this leaf's slice -> the leaf's result


def flat_item(fn, leaf, opts, axes):
  """The _Item of a leaf whose rows are its flattened elements (psum, ppermute), or
  None for a leaf that is not bucketed (plain lax, codec None, empty)."""
  if takes_lax(fn, leaf, axes) or opts.codec is None:
    return None
  leaf = options.check_x(fn, leaf)
  if leaf.size == 0:
    return None
  shape = leaf.shape
  return Item(compat.pvary(leaf, axes).reshape(-1), lambda r: r.reshape(shape))


def _bucket_groups(items, limit: int) -> list:
  """Indices of the buckets: leaves of one dtype, in leaf order, greedily filled up
  to `limit` raw bytes; a leaf of `limit` bytes or more travels alone."""
  groups, open_ = [], {}
  for i, it in items:
    nbytes = it.rows.size * it.rows.dtype.itemsize
    key = np.dtype(it.rows.dtype).name
    if nbytes >= limit:
      groups.append([i])
      continue
    cur = open_.get(key)
    if cur is None or cur[1] + nbytes > limit:
      cur = open_[key] = [[], 0]
      groups.append(cur[0])
    cur[0].append(i)
    cur[1] += nbytes
  return groups


def map_leaves(one, x, stats: bool, bucket=None):
  """Runs the collective on every leaf of x: `one(leaf) -> (y, stats)`.

  bucket: None, or (item, run, limit[, segmented]): item(leaf) -> _Item, or None for
  a leaf that is not bucketed (plain lax, empty); run(rows) runs the bucketed
  collective on a tuple of rows and returns (the tuple of their results, the
  bucket's stats). The buckets are the same with stats=True (the program must not
  change with stats): every leaf of a bucket then reports the bucket's stats.
  segmented(rows) (under zipccl_jax.jit: segments.available()) moves the
  rows of the leaves left to travel alone in shared transports, each leaf coded on
  its own, and returns (result rows, stats) per leaf or None where it declines.
  """
  leaves, treedef = jax.tree_util.tree_flatten(x)
  outs = [None] * len(leaves)
  if bucket is not None and len(leaves) >= 2:
    item, run, limit = bucket[:3]
    items = [(i, it) for i, it in ((i, item(leaf)) for i, leaf in enumerate(leaves))
             if it is not None]
    by_index = dict(items)
    alone = []
    for group in _bucket_groups(items, limit):
      if len(group) == 1:
        alone.append(group[0])
        continue
      its = [by_index[i] for i in group]
      ys, st = run(tuple(it.rows for it in its))
      for i, it, r in zip(group, its, ys):
        outs[i] = (it.post(r), st)
    if len(bucket) > 3 and len(alone) >= 2 and segments.available():
      for i, o in zip(alone, bucket[3](tuple(by_index[i].rows for i in alone))):
        if o is not None:
          outs[i] = (by_index[i].post(o[0]), o[1])
  outs = [one(leaf) if o is None else o for leaf, o in zip(leaves, outs)]
  y = jax.tree_util.tree_unflatten(treedef, [o[0] for o in outs])
  if not stats:
    return y
  return y, jax.tree_util.tree_unflatten(treedef, [o[1] for o in outs])


def lax_stats(name, x):
  """codec=None: the lax op's operand is x itself (XLA:CPU may widen bf16 further)."""
  x = jnp.asarray(x)
  return stats_lib.make_stats(name, None, [stats_lib.plain_part(x.size * x.dtype.itemsize)])


def takes_lax(fn, leaf, axes=None) -> bool:
  """True when `leaf` goes through the plain `jax.lax` collective, uncompressed.

  Whatever the options (codec=None included), every leaf no codec takes:
  Python scalars (`compressed_psum(1, axis)` is the axis size, as in lax; a
  constant moves nothing), arrays of any dtype other than bf16/fp16/fp32
  (integers, bool, fp8, float64, complex: a step counter inside a pytree of
  gradients, say), and arrays typed reduced or unreduced over `axes` (JAX's
  reduced/unreduced types: lax.psum of an unreduced value is its own
  collective, and lax raises for the others). Those get lax's result, gradient
  and errors exactly, so the compressed_* functions are drop-in replacements for
  every input lax takes.
  """
  if isinstance(leaf, (bool, int, float, complex)):
    return True
  if axes is not None and compat.reduced_axes(leaf) & frozenset(
      axes if isinstance(axes, tuple) else (axes,)):
    return True
  dtype = getattr(leaf, "dtype", None)
  if dtype is None:
    try:
      dtype = jnp.asarray(leaf).dtype
    except TypeError as e:
      raise TypeError(f"{fn}: x must be an array (or a pytree of arrays), got "
                      f"{type(leaf).__name__} ({e})") from None
  return not dtypes.is_supported(dtype)


_warned_invariant = False


def invariant_over(fn, leaf, axes) -> bool:
  """True when `leaf` is typed invariant over every one of `axes` (shard_map with
  vma checking): its sum is leaf x N with no communication, which lax.psum computes,
  so the reduction takes lax.psum. Warns once: inside jax.grad this is the trap of
  replicated parameters (JAX has already summed their gradient, uncompressed)."""
  global _warned_invariant
  if not compat.check_vma_enabled() or isinstance(leaf, (bool, int, float, complex)):
    return False
  try:
    varying = compat.varying_axes(leaf)
  except (TypeError, AttributeError):
    return False
  if any(a in varying for a in axes):
    return False
  if not _warned_invariant:
    _warned_invariant = True
    warnings.warn(
        f"{fn}: x is already invariant over {axes}: it is summed like lax.psum (x * "
        "axis size, no communication). If x is a gradient of parameters replicated over "
        "that axis, JAX has already summed it with an uncompressed psum; take the gradient "
        "w.r.t. zipccl_jax.compressed_pcast(params, axis) instead, whose transpose is the "
        "compressed psum (docs/sharp-bits.md).", stacklevel=4)
  return True
