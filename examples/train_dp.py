#!/usr/bin/env python
"""Data-parallel training with gradients averaged by `zipccl_jax.compressed_psum`.

What it shows: the step time of plain data parallelism when the gradient
all-reduce is compressed (codec="zipccl"), moves the same algorithm's raw words
(codec="raw") or is jax.lax's own psum (codec=None, "lax"), and that compression
changes no bit of the training.

- Model and data: the byte-level transformer of transformer.py (Flax linen, pre-norm causal attention + GELU MLP blocks, bfloat16 compute,
  float32 parameters) on the bytes of the Python standard library's sources.
- Parallelism: one mesh axis "dp" over every device (simulated CPU devices in
  one process, or every process's devices under examples/launch.py). Parameters
  and optimizer state are replicated; each device takes the gradient of its own
  part of the batch, flattens it into one bfloat16 buffer (like DDP's bucket,
  here a single one) and sums it over "dp" with

      g = zipccl_jax.compressed_psum(flat.astype(jnp.bfloat16), "dp", codec=codec,
                                     policy="always", stats=True)

  (a compressed reduce-scatter + a compressed all-gather; rank-order float32
  sums, so every device gets the same bits, and zipccl's bits equal raw's).
  optax.adamw then updates every replica identically.
- The three variants train in lockstep from the same initial state (see
  examples/harness.py): step times are medians after warm-up, bytes per step come
  from the compiled HLO, and the script exits 1 unless zipccl's and raw's losses
  and parameters are bit-identical and every process saw the same losses.

Run:  python examples/train_dp.py --quick                       (one process, 4 devices)
      python examples/launch.py -n 2 examples/train_dp.py        (2 processes)
      sudo python examples/launch.py -n 2 --netns 1gbit examples/train_dp.py
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the sibling modules

import launch   # noqa: E402  (no JAX import at module level)

AXIS = "dp"
QUICK = dict(steps=12, seq_len=64, d_model=64, layers=2, heads=2, batch_per_device=2, warmup=3)
DEFAULTS = dict(steps=40, seq_len=128, d_model=192, layers=4, heads=4, batch_per_device=1,
                warmup=10)


def make_config(model, **overrides):
  """A transformer.Config with only the model/optimizer fields this example uses."""
  names = {f.name for f in dataclasses.fields(model.Config)}
  return model.Config(**{k: v for k, v in overrides.items() if k in names})


def init_params(model, cfg) -> dict:
  """Host float32 parameters {unit: params} in train_fsdp.py's layout (same seeds)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  keys = jax.random.split(jax.random.key(cfg.seed), cfg.layers + 1)
  params = {"embed": model.Embeddings(cfg).init(
      keys[0], jnp.zeros((1, cfg.seq_len), jnp.int32))["params"]}
  x = jnp.zeros((1, cfg.seq_len, cfg.d_model), model.COMPUTE)
  for i in range(cfg.layers):
    params[f"block{i}"] = model.Block(cfg).init(keys[i + 1], x)["params"]
  return jax.tree.map(lambda a: np.asarray(a, np.float32), params)


def make_step(model, harness, cfg, mesh, codec, policy="always", label=""):
  """The jitted data-parallel step (state, batch) -> (state, mean loss, psum stats)."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax import lax
  from jax.flatten_util import ravel_pytree
  from jax.sharding import PartitionSpec as P

  import zipccl_jax
  opt = model.make_optimizer(cfg)

  def step(state, batch):
    params, opt_state = state

    def loss_fn(p):
      logits, _ = model.apply_model(cfg, p, batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(harness.varying(params, AXIS))
    flat, unravel = ravel_pytree(grads)
    total, stats = zipccl_jax.compressed_psum(flat.astype(jnp.bfloat16), AXIS, codec=codec,
                                              policy=policy, stats=True)
    grads = unravel(total.astype(jnp.float32) / lax.axis_size(AXIS))
    updates, opt_state = opt.update(grads, opt_state, params)
    return ((optax.apply_updates(params, updates), opt_state), lax.pmean(loss, AXIS),
            {"gradients": stats})

  step = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P(), P()))
  return harness.jit_for(label, step)


def main(argv=None) -> int:
  import harness
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  for k, v in DEFAULTS.items():
    ap.add_argument("--" + k.replace("_", "-"), type=int,
                    help=f"default {v} ({QUICK[k]} with --quick)")
  ap.add_argument("--quick", action="store_true", help="a tiny config that trains in seconds")
  harness.add_common_args(ap, devices=4)
  args = ap.parse_args(argv)
  sizes = dict(QUICK if args.quick else DEFAULTS)
  sizes.update({k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None})
  if sizes["d_model"] % sizes["heads"] or min(sizes.values()) < 1:
    ap.error("sizes must be positive and --d-model a multiple of --heads")

  multi = launch.init_jax(args.devices, malloc=args.malloc)
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P
  import transformer as model

  cfg = make_config(model, **sizes)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), (AXIS,),
                           axis_types=(jax.sharding.AxisType.Auto,))
  n = mesh.size
  params = init_params(model, cfg)
  n_params = sum(a.size for a in jax.tree.leaves(params))
  opt_state = jax.tree.map(np.asarray, model.make_optimizer(cfg).init(params))
  data = model.load_corpus()
  batches = [harness.put(b, mesh, P(AXIS)) for b in model.make_batches(data, cfg, n)]
  harness.say(f"data parallel: {cfg.layers} blocks, width {cfg.d_model}, {n_params / 1e6:.2f} M "
              f"parameters ({2 * n_params / 2**20:.2f} MiB of bfloat16 gradients per psum), "
              f"{n} devices in {jax.process_count()} process(es), {cfg.batch_per_device} x "
              f"{cfg.seq_len} tokens per device and step")

  harness.maybe_calibrate(args, mesh, AXIS)
  variants = []
  for label in args.codecs:
    state = harness.put((params, opt_state), mesh, P())
    step = make_step(model, harness, cfg, mesh, *harness.VARIANTS[label], label=label)
    variants.append(harness.compile_variant(label, step, state, batches[0]))
  harness.say("compiled: " + ", ".join(f"{v.label} {v.compile_s:.1f} s" for v in variants))
  harness.train_lockstep(variants, batches, log_every=args.log_every)
  res = harness.summarize(variants, warmup=args.warmup_steps, params_of=lambda s: s[0])
  harness.print_report("train_dp", res)
  harness.write_json(args.json, res, example="train_dp", config=dataclasses.asdict(cfg),
                     parameters=int(n_params))
  return harness.finish(multi, res["ok"])


if __name__ == "__main__":
  sys.exit(main())
