"""Compressed gradients for training steps written for `jax.jit` / `nnx.jit`.

`value_and_grad(loss_fn, mesh, axis, param_specs=...)` replaces
`jax.value_and_grad(loss_fn)` in a data-parallel or FSDP step (Flax linen or any
pytree of params); `nnx_value_and_grad` replaces `nnx.value_and_grad` for Flax NNX
models; `specs_of` reads the PartitionSpecs of placed params. docs/flax.md has
worked examples.
"""
from zipccl_jax._src.parallel import nnx_value_and_grad, specs_of, value_and_grad

__all__ = ["nnx_value_and_grad", "specs_of", "value_and_grad"]
