"""Compressed data-parallel and FSDP gradients for steps written for `jax.jit`.

Most Flax training steps are written for `jax.jit` (or `nnx.jit`) with sharding
annotations: XLA inserts the gradient all-reduce (data parallel) or the weight
all-gathers and gradient reduce-scatters (FSDP) itself, uncompressed. These
helpers replace the step's `jax.value_and_grad(loss_fn)` (or NNX's
`nnx.value_and_grad`) by one that runs the loss inside `jax.shard_map` over one
mesh axis, so that those collectives are the compressed ones:

* a parameter replicated over the axis (its PartitionSpec does not name it) goes
  through `compressed_pcast`: its gradient is summed over the axis by the
  compressed psum (bucketed with the other replicated leaves);
* a parameter sharded over the axis along dimension d is rebuilt by
  `compressed_all_gather(..., axis=d, tiled=True)`; its gradient comes back
  sharded like the parameter through the gather's VJP, a compressed
  reduce-scatter;
* the batch is split over the axis along its leading dimension (every leaf); the
  loss is each device's `loss_fn` on its part, averaged over the axis: the
  gradient is that of the mean loss, as with jit (same-size parts).

The sums are float32 in rank order (docs/design.md, "Collectives: semantics"), so the result
is bit-identical to `codec="raw"` and deterministic; it may differ from jit's
psum in the last bits (XLA picks its own order). Other mesh axes see replicated
values: the specs may name only `axis`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zipccl_jax._src.collectives.api import compressed_all_gather, compressed_pcast


def _gather_dim(spec, axis: str, where: str) -> int | None:
  """The dimension a PartitionSpec shards over `axis` (None: replicated)."""
  if spec is None:
    return None
  if not isinstance(spec, P):
    raise TypeError(f"{where}: expected a jax.sharding.PartitionSpec, got {type(spec).__name__}")
  dims = []
  for d, entry in enumerate(spec):
    names = entry if isinstance(entry, tuple) else (entry,)
    for name in names:
      if name is None:
        continue
      if name != axis:
        raise ValueError(f"{where}: {spec} names mesh axis {name!r}; these helpers shard over "
                         f"axis {axis!r} only (other axes must be replicated)")
      dims.append(d)
  if len(dims) > 1:
    raise ValueError(f"{where}: {spec} shards over {axis!r} along more than one dimension")
  return dims[0] if dims else None


def specs_of(tree) -> Any:
  """The PartitionSpec of every array of `tree` from its sharding (P() when it has
  none or is not a NamedSharding): for params already placed on the mesh."""
  def one(x):
    s = getattr(x, "sharding", None)
    return s.spec if isinstance(s, NamedSharding) else P()
  return jax.tree.map(one, tree)


def value_and_grad(loss_fn: Callable, mesh: Mesh, axis: str, *, param_specs=None,
                   has_aux: bool = False, compute_dtype=None, **options) -> Callable:
  """`jax.value_and_grad(loss_fn)` with the gradient collectives compressed.

  Args:
    loss_fn: `loss_fn(params, batch, *args) -> loss` (or `(loss, aux)` with
      has_aux), a scalar mean over its batch.
    mesh: the mesh; axis: its axis to parallelize over.
    param_specs: a pytree of PartitionSpecs matching params (a spec naming `axis`
      shards that leaf: FSDP); None: every leaf replicated (data parallel). Use
      `specs_of(params)` for params already placed with NamedShardings.
    has_aux: as jax.value_and_grad (aux leaves are averaged over the axis when
      floating point, else summed).
    compute_dtype: e.g. jnp.bfloat16: floating parameters are cast to it before
      they are gathered (FSDP) or cast to varying (DP), so the collectives move it
      (~1.4x for bfloat16 against ~1.15x for float32) and loss_fn sees it; the
      gradients are cast back to the parameters' dtype. None: as they are.
    **options: of the compressed collectives (codec, policy, check_decode,
      chunks, bucket_bytes).

  Returns:
    `f(params, batch, *args) -> (loss, grads)` (or `((loss, aux), grads)`), to
    call inside `jax.jit` / `nnx.jit` / `zipccl_jax.jit` or eagerly; params
    placed by param_specs, the batch's leaves split along their leading
    dimension; grads placed like params.
  """
  if not isinstance(mesh, Mesh):
    raise TypeError(f"value_and_grad: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
  if axis not in mesh.axis_names:
    raise ValueError(f"value_and_grad: axis {axis!r} is not an axis of the mesh "
                     f"{tuple(mesh.axis_names)}")

  def f(params, batch, *args):
    specs = (jax.tree.map(lambda _: P(), params) if param_specs is None else param_specs)
    flat, treedef = jax.tree.flatten(params)
    flat_specs = treedef.flatten_up_to(specs)
    dims = [_gather_dim(s, axis, f"value_and_grad: param_specs[{i}]")
            for i, s in enumerate(flat_specs)]
    n = mesh.shape[axis]

    def local(flat_params, batch, *args):
      if compute_dtype is not None:
        flat_params = [p.astype(compute_dtype) if jax.numpy.issubdtype(p.dtype, jax.numpy.floating)
                       else p for p in flat_params]
      replicated = compressed_pcast([p for p, d in zip(flat_params, dims) if d is None], axis,
                                    **options)
      it = iter(replicated)
      full = [next(it) if d is None else
              compressed_all_gather(p, axis, axis=d, tiled=True, **options)
              for p, d in zip(flat_params, dims)]
      out = loss_fn(jax.tree.unflatten(treedef, full), batch, *args)
      loss, aux = out if has_aux else (out, None)
      return loss / n, aux

    def step(flat_params, batch, *args):
      (loss, aux), grads = jax.value_and_grad(local, has_aux=True)(flat_params, batch, *args)
      loss = lax.psum(loss, axis)
      aux = jax.tree.map(functools.partial(_mean, axis=axis, n=n), aux)
      return loss, aux, grads

    param_in = [P(*([None] * d + [axis])) if d is not None else P() for d in dims]
    smap = jax.shard_map(step, mesh=mesh,
                         in_specs=(param_in, jax.tree.map(lambda _: P(axis), batch))
                         + tuple(jax.tree.map(lambda _: P(), a) for a in args),
                         out_specs=(P(), P(), param_in))
    loss, aux, grads = smap(flat, batch, *args)
    grads = jax.tree.unflatten(treedef, grads)
    return ((loss, aux), grads) if has_aux else (loss, grads)

  return f


def _mean(x, *, axis: str, n: int):
  """An aux leaf out of the shard_map: averaged over the axis when floating point
  (a metric of the part), else summed (a count)."""
  if jax.numpy.issubdtype(x.dtype, jax.numpy.floating):
    return lax.psum(x, axis) / n
  return lax.psum(x, axis)


def nnx_value_and_grad(loss_fn: Callable, mesh: Mesh, axis: str, *, wrt=None,
                       param_specs=None, has_aux: bool = False, compute_dtype=None,
                       **options) -> Callable:
  """`nnx.value_and_grad(loss_fn)` for Flax NNX models, gradients compressed.

  Args:
    loss_fn: `loss_fn(model, batch, *args) -> loss` (or `(loss, aux)`).
    mesh, axis, has_aux, compute_dtype, **options: as `value_and_grad`.
    wrt: the NNX filter of the differentiated state (default `nnx.Param`).
    param_specs: PartitionSpecs of that state (an nnx.State of specs); default
      `nnx.get_partition_spec` of it (the params' `sharding` metadata).

  Returns:
    `f(model, batch, *args) -> (loss, grads)` with grads an `nnx.State` of the
    `wrt` variables, as `nnx.value_and_grad` returns (feed it to
    `optimizer.update`). Other state (batch statistics, RNG counts) is read, and
    updates to it inside the loss are not kept.
  """
  from flax import nnx   # flax is optional: only this helper needs it

  wrt = nnx.Param if wrt is None else wrt

  def f(model, batch, *args):
    graphdef, params, rest = nnx.split(model, wrt, ...)
    specs = param_specs
    if specs is None:
      specs = jax.tree.map(lambda s: s if isinstance(s, P) else P(),
                           nnx.get_partition_spec(params),
                           is_leaf=lambda s: isinstance(s, P) or s is None)

    def pure(p, b, r, *a):   # the rest of the state goes in replicated
      return loss_fn(nnx.merge(graphdef, p, r), b, *a)

    return value_and_grad(pure, mesh, axis, param_specs=specs, has_aux=has_aux,
                          compute_dtype=compute_dtype, **options)(params, batch, rest, *args)

  return f
