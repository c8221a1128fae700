#!/usr/bin/env python
"""Data parallelism with a compressed gradient all-reduce, in one screen.

Eight simulated CPU devices each hold a slice of a batch and a replica of a small
linear model. Each computes its gradient; `zipccl_jax.compressed_psum` sums the
gradients over the "dp" axis with the exponent bits compressed on the wire. The
script prints the bytes each device handed to the collective against the raw
twin (`codec="raw"`: the same algorithm, uncompressed) and checks that both give
the same bits.

    python examples/quickstart.py
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax                                    # noqa: E402
import jax.numpy as jnp                       # noqa: E402
import numpy as np                            # noqa: E402
from jax.sharding import AxisType, PartitionSpec as P   # noqa: E402

import zipccl_jax as zc                       # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("dp",), axis_types=(AxisType.Auto,))
n = mesh.shape["dp"]
rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(0, 0.02, (1024, 512)), jnp.bfloat16)     # replicated weights
x = jnp.asarray(rng.normal(0, 1.0, (n * 16, 1024)), jnp.bfloat16)   # batch, split over "dp"
y = jnp.asarray(rng.normal(0, 1.0, (n * 16, 512)), jnp.bfloat16)


def loss(w, x, y):
  return jnp.mean((x @ w - y).astype(jnp.float32) ** 2)


def make_step(codec):
  def step(w, x, y):
    # cast the replicated weights to "varying" first, so that jax.grad does not
    # insert its own (uncompressed) psum: see docs/sharp-bits.md
    g = jax.grad(loss)(jax.lax.pcast(w, "dp", to="varying"), x, y)
    g, st = zc.compressed_psum(g, "dp", codec=codec, policy="always", stats=True)
    return w - 0.1 * g / n, st
  return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")),
                               out_specs=(P(), P())))


w_zip, st_zip = make_step("auto")(w, x, y)
w_raw, st_raw = make_step("raw")(w, x, y)
same = np.array_equal(np.asarray(w_zip).view(np.uint16), np.asarray(w_raw).view(np.uint16))
print(f"devices: {n}, gradient: {w.size * w.dtype.itemsize:,} B per device")
print(f"compressed ({st_zip.codec}): {int(st_zip.wire_bytes):,} B sent per device")
print(f"raw twin:                {int(st_raw.wire_bytes):,} B sent per device")
print(f"wire ratio: {int(st_raw.wire_bytes) / int(st_zip.wire_bytes):.3f}x fewer bytes")
print(f"bit-identical to the raw twin: {same}")
raise SystemExit(0 if same else 1)
