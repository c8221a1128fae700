#!/usr/bin/env python
"""A small Flax NNX GPT trained with `nnx.jit`, its gradients compressed.

What it shows: a training step written the usual NNX way (`nnx.jit`,
`nnx.Optimizer`, sharding metadata on the parameters) becomes a compressed
data-parallel or FSDP step by changing one line:

    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)            # before
    loss, grads = grad_fn(model, batch)                                # after, with
    grad_fn = zc.parallel.nnx_value_and_grad(loss_fn, mesh, "data")

Data parallel, the gradients are summed over "data" by the compressed psum; with
`--fsdp` the kernels are sharded over "data" by their metadata
(`nnx.with_partitioning`), gathered compressed for the step, and their gradients
reduce-scattered compressed. The model trains twice from the same initial state,
compressed and `codec="raw"` (the same algorithm on uncompressed words): losses and
parameters must be bit-identical (else exit status 1). Data: the bytes of the
Python standard library's sources, byte-level tokens.

Run:  python examples/flax_gpt.py            (8 simulated CPU devices, data parallel)
      python examples/flax_gpt.py --fsdp     (FSDP)
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, PartitionSpec as P

import zipccl_jax as zc
from transformer import load_corpus   # the script's directory is on sys.path

AXIS = "data"


class Block(nnx.Module):
  def __init__(self, d: int, heads: int, shard, rngs: nnx.Rngs):
    self.norm1, self.norm2 = nnx.RMSNorm(d, rngs=rngs), nnx.RMSNorm(d, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(heads, d, dtype=jnp.bfloat16, decode=False,
                                       kernel_init=shard(nnx.initializers.lecun_normal()),
                                       rngs=rngs)
    self.up = nnx.Linear(d, 4 * d, dtype=jnp.bfloat16, rngs=rngs,
                         kernel_init=shard(nnx.initializers.lecun_normal()))
    self.down = nnx.Linear(4 * d, d, dtype=jnp.bfloat16, rngs=rngs,
                           kernel_init=shard(nnx.initializers.lecun_normal()))

  def __call__(self, x, mask):
    x = x + self.attn(self.norm1(x), mask=mask)
    return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class GPT(nnx.Module):
  def __init__(self, d: int, layers: int, heads: int, seq: int, fsdp: bool, rngs: nnx.Rngs):
    # FSDP: shard every kernel's first dimension over AXIS (metadata the helper reads)
    shard = (lambda init: nnx.with_partitioning(init, (AXIS,))) if fsdp else (lambda init: init)
    self.tok = nnx.Embed(256, d, embedding_init=shard(nnx.initializers.normal(0.02)), rngs=rngs)
    self.pos = nnx.Param(jax.random.normal(rngs.params(), (seq, d)) * 0.02)
    self.blocks = nnx.List([Block(d, heads, shard, rngs) for _ in range(layers)])
    self.norm = nnx.RMSNorm(d, rngs=rngs)

  def __call__(self, tokens):
    x = (self.tok(tokens) + self.pos[:tokens.shape[1]]).astype(jnp.bfloat16)
    mask = nnx.make_causal_mask(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.tok.attend(self.norm(x).astype(jnp.float32))


def loss_fn(model, batch):
  logits = model(batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def train(args, mesh, codec: str, batches):
  with jax.set_mesh(mesh):   # places the variables with sharding metadata
    model = GPT(args.d_model, args.layers, args.heads, args.seq_len, args.fsdp, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
  grad_fn = zc.parallel.nnx_value_and_grad(loss_fn, mesh, AXIS, codec=codec, policy="always")

  @nnx.jit
  def step(model, optimizer, batch):
    loss, grads = grad_fn(model, batch)          # was: nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer, b)) for b in batches]
  return np.asarray(losses, np.float32), nnx.state(model, nnx.Param)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--fsdp", action="store_true", help="shard the kernels over the devices")
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--d-model", type=int, default=128)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--heads", type=int, default=8,
                  help="attention heads (with --fsdp a multiple of the device count)")
  ap.add_argument("--seq-len", type=int, default=64)
  ap.add_argument("--batch-per-device", type=int, default=2)
  ap.add_argument("--codec", default=zc.AUTO_CODEC, choices=zc.codecs.names())
  args = ap.parse_args(argv)
  n = jax.device_count()
  mesh = jax.make_mesh((n,), (AXIS,), axis_types=(AxisType.Explicit,))
  data = load_corpus()
  rng = np.random.default_rng(0)
  starts = rng.integers(0, data.size - args.seq_len - 1, (args.steps, args.batch_per_device * n))
  batches = [jax.device_put(jnp.asarray(data[s[:, None] + np.arange(args.seq_len + 1)],
                                        jnp.int32), jax.sharding.NamedSharding(mesh, P(AXIS)))
             for s in starts]
  got, got_params = train(args, mesh, args.codec, batches)
  want, want_params = train(args, mesh, "raw", batches)
  same = np.array_equal(got.view(np.uint32), want.view(np.uint32)) and all(
      np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
      for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params)))
  mode = "FSDP" if args.fsdp else "data parallel"
  print(f"NNX GPT, {mode} over {n} devices, codec={args.codec!r}: loss {got[0]:.4f} -> "
        f"{got[-1]:.4f} in {args.steps} steps; bit-identical to codec='raw': "
        f"{'yes' if same else 'NO'}")
  return 0 if same else 1


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", 8)
  sys.exit(main())
