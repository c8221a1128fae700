#!/usr/bin/env python
"""Mixture-of-experts training with tokens dispatched by `zipccl_jax.compressed_all_to_all`.

What it shows: expert parallelism, the all_to_all pattern of MoE models, with the
token exchange compressed (codec="zipccl"), as raw words (codec="raw") or by
jax.lax (codec=None, "lax"): step times, bytes per step, bit-identical training.

- Model (plain JAX, bfloat16 compute, float32 parameters): byte-level tokens,
  token + position embeddings, `layers` pre-norm blocks of causal multi-head
  attention and a top-1 ("switch") mixture-of-experts MLP, an output head tied
  to the token embedding. Loss: cross-entropy + 0.01 x the switch load-balancing
  loss.
- Parallelism: one mesh axis "ep" over every device. Device r holds experts
  r*k .. r*k+k-1 (k = --experts-per-device) and its own slice of the batch;
  attention, router and embeddings are replicated (their gradients are summed
  with `compressed_psum`, as in train_dp.py).
- Dispatch: each device routes its T tokens to E = k x devices experts; expert e
  takes at most C = ceil(capacity_factor x T / E) tokens from each device, in
  token order (the rest skip the MLP through the residual). The tokens go into
  fixed-size buckets bf16[devices, k, C, d] (zeros where a bucket is not full)
  and

      x = zipccl_jax.compressed_all_to_all(buckets, "ep", 0, 0, tiled=True,
                                           codec=codec, policy="always", stats=True)

  brings every device the buckets of its own experts; a second all_to_all takes
  the expert outputs back, and each token's output is scaled by its gate. The
  backward pass runs both exchanges again (compressed_all_to_all's VJP).
- The three variants train in lockstep from the same initial state (see
  examples/harness.py); the script exits 1 unless zipccl's and raw's losses and
  parameters are bit-identical and every process saw the same losses.

Run:  python examples/train_moe.py --quick                      (one process, 4 devices)
      python examples/launch.py -n 2 examples/train_moe.py       (2 processes)
      sudo python examples/launch.py -n 2 --netns 1gbit examples/train_moe.py
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the sibling modules

import launch   # noqa: E402  (no JAX import at module level)

AXIS = "ep"
AUX_WEIGHT = 0.01    # the switch transformer's load-balancing loss weight


@dataclasses.dataclass(frozen=True)
class Config:
  steps: int = 40
  seq_len: int = 128
  d_model: int = 128
  layers: int = 2
  heads: int = 4
  experts_per_device: int = 2
  d_ff: int = 256
  batch_per_device: int = 2
  capacity_factor: float = 1.25
  lr: float = 3e-3
  warmup: int = 10
  weight_decay: float = 0.01
  seed: int = 0


QUICK = dict(steps=12, seq_len=32, d_model=64, layers=1, heads=2, d_ff=128, warmup=3)
SIZES = ("steps", "seq_len", "d_model", "layers", "heads", "experts_per_device", "d_ff",
         "batch_per_device", "warmup")


def capacity(cfg: Config, n_devices: int) -> int:
  """Tokens each expert takes from each device per step."""
  tokens = cfg.batch_per_device * cfg.seq_len
  return max(1, math.ceil(cfg.capacity_factor * tokens / (cfg.experts_per_device * n_devices)))


# ---- parameters -------------------------------------------------------------------------------


def init_params(cfg: Config, n_devices: int) -> dict:
  """Host float32 parameters: {"dense": replicated, "experts": [E, ...] leaves (sharded)}."""
  import numpy as np
  rng = np.random.default_rng(cfg.seed)
  d, f, e = cfg.d_model, cfg.d_ff, cfg.experts_per_device * n_devices

  def normal(shape, std):
    return (rng.standard_normal(shape) * std).astype(np.float32)

  dense = {"tok": normal((256, d), d ** -0.5), "pos": normal((cfg.seq_len, d), 0.02),
           "final_norm": np.ones(d, np.float32)}
  experts = {}
  for i in range(cfg.layers):
    dense[f"layer{i}"] = {
        "attn_norm": np.ones(d, np.float32), "qkv": normal((d, 3 * d), d ** -0.5),
        "out": normal((d, d), d ** -0.5), "moe_norm": np.ones(d, np.float32),
        "router": normal((d, e), 0.02)}
    experts[f"layer{i}"] = {"w_in": normal((e, d, f), d ** -0.5),
                            "w_out": normal((e, f, d), f ** -0.5)}
  return {"dense": dense, "experts": experts}


def state_specs(state):
  """Expert tensors (the only 3-D leaves, also in the optimizer state) split over "ep"."""
  import jax
  from jax.sharding import PartitionSpec as P
  return jax.tree.map(lambda x: P(AXIS) if x.ndim == 3 else P(), state)


# ---- model ------------------------------------------------------------------------------------


def _rms(x, scale):
  import jax.numpy as jnp
  from jax import lax
  x32 = x.astype(jnp.float32)
  return (x32 * lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * scale).astype(jnp.bfloat16)


def _attention(p, x, heads: int):
  import jax
  import jax.numpy as jnp
  b, s, d = x.shape
  bf = jnp.bfloat16
  q, k, v = (x @ p["qkv"].astype(bf)).reshape(b, s, 3, heads, d // heads).transpose(2, 0, 1, 3, 4)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
  causal = jnp.tril(jnp.ones((s, s), bool))
  w = jax.nn.softmax(jnp.where(causal, logits * (d // heads) ** -0.5, -1e30), axis=-1)
  a = jnp.einsum("bhqk,bkhd->bqhd", w.astype(bf), v).reshape(b, s, d)
  return a @ p["out"].astype(bf)


def _moe(p, experts, x, cfg: Config, codec, policy: str, n: int):
  """Top-1 MoE MLP over this device's tokens x bf16[T, d]; returns (y, aux loss, stats)."""
  import jax
  import jax.numpy as jnp
  import zipccl_jax
  t, d = x.shape
  k = cfg.experts_per_device
  e, c = k * n, capacity(cfg, n)
  probs = jax.nn.softmax(x.astype(jnp.float32) @ p["router"], axis=-1)        # [T, E]
  expert = jnp.argmax(probs, axis=-1)
  gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)[:, 0]
  onehot = jax.nn.one_hot(expert, e, dtype=jnp.int32)
  slot = ((jnp.cumsum(onehot, axis=0) - 1) * onehot).sum(-1)                  # rank in its expert
  keep = (slot < c).astype(jnp.float32)
  # dispatch[t, e, c] = 1 where token t sits in slot c of expert e's bucket.
  dispatch = (onehot.astype(jnp.float32)[:, :, None]
              * jax.nn.one_hot(slot, c, dtype=jnp.float32)[:, None, :] * keep[:, None, None])
  buckets = jnp.einsum("tec,td->ecd", dispatch.astype(jnp.bfloat16), x)          # exact: one term
  kw = dict(codec=codec, policy=policy, stats=True, tiled=True)
  mine, st_in = zipccl_jax.compressed_all_to_all(buckets.reshape(n, k, c, d), AXIS, 0, 0, **kw)
  h = jax.nn.gelu(jnp.einsum("skcd,kdf->skcf", mine, experts["w_in"].astype(jnp.bfloat16)))
  out = jnp.einsum("skcf,kfd->skcd", h, experts["w_out"].astype(jnp.bfloat16))
  back, st_out = zipccl_jax.compressed_all_to_all(out, AXIS, 0, 0, **kw)
  y = jnp.einsum("tec,ecd->td", dispatch * gate[:, None, None],
                 back.reshape(e, c, d).astype(jnp.float32)).astype(jnp.bfloat16)
  aux = e * jnp.sum(onehot.astype(jnp.float32).mean(0) * probs.mean(0))
  return y, aux, {"dispatch": st_in, "combine": st_out}


def local_loss(dense, experts, batch, cfg: Config, codec, policy: str, n: int):
  """This device's loss / n (so that summing over devices gives the global mean)."""
  import jax.numpy as jnp
  import optax
  inputs, targets = batch[:, :-1], batch[:, 1:]
  b, s = inputs.shape
  h = (jnp.take(dense["tok"], inputs, axis=0) + dense["pos"][:s]).astype(jnp.bfloat16)
  stats, aux = {}, 0.0
  for i in range(cfg.layers):
    p = dense[f"layer{i}"]
    h = h + _attention(p, _rms(h, p["attn_norm"]), cfg.heads)
    y, a, stats[f"layer{i}"] = _moe(p, experts[f"layer{i}"],
                                    _rms(h, p["moe_norm"]).reshape(b * s, -1), cfg, codec,
                                    policy, n)
    h = h + y.reshape(b, s, -1)
    aux = aux + a
  logits = jnp.einsum("bld,vd->blv", _rms(h, dense["final_norm"]),
                      dense["tok"].astype(jnp.bfloat16), preferred_element_type=jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
  return (ce + AUX_WEIGHT * aux / cfg.layers) / n, stats


def make_optimizer(cfg: Config):
  import optax
  warmup = min(cfg.warmup, cfg.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup,
                                                max(cfg.steps, warmup + 1), cfg.lr / 10)
  return optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)


def make_step(harness, cfg: Config, mesh, codec, policy, state, label=""):
  """The jitted expert-parallel step (state, batch) -> (state, mean loss, stats)."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax import lax
  from jax.flatten_util import ravel_pytree
  from jax.sharding import PartitionSpec as P

  import zipccl_jax
  opt, n = make_optimizer(cfg), mesh.size

  def step(state, batch):
    params, opt_state = state
    (loss, stats), (g_dense, g_experts) = jax.value_and_grad(
        local_loss, argnums=(0, 1), has_aux=True)(
            harness.varying(params["dense"], AXIS), params["experts"], batch, cfg, codec, policy,
            n)
    # Expert gradients are complete already (the backward all_to_all brought every
    # device's contribution); the replicated part is summed over "ep".
    flat, unravel = ravel_pytree(g_dense)
    total, stats["dense_gradients"] = zipccl_jax.compressed_psum(
        flat.astype(jnp.bfloat16), AXIS, codec=codec, policy=policy, stats=True)
    grads = {"dense": unravel(total.astype(jnp.float32)), "experts": g_experts}
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), lax.psum(loss, AXIS), stats

  specs = state_specs(state)
  step = jax.shard_map(step, mesh=mesh, in_specs=(specs, P(AXIS)), out_specs=(specs, P(), P()))
  return harness.jit_for(label, step)


def main(argv=None) -> int:
  import harness
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  for k in SIZES:
    ap.add_argument("--" + k.replace("_", "-"), type=int, help=f"default {getattr(Config, k)}"
                    + (f" ({QUICK[k]} with --quick)" if k in QUICK else ""))
  ap.add_argument("--capacity-factor", type=float,
                  help=f"expert capacity / an even share of the tokens (default "
                       f"{Config.capacity_factor})")
  ap.add_argument("--quick", action="store_true", help="a tiny config that trains in seconds")
  harness.add_common_args(ap, devices=4)
  args = ap.parse_args(argv)
  sizes = dict(QUICK) if args.quick else {}
  sizes.update({k: getattr(args, k) for k in SIZES if getattr(args, k) is not None})
  if args.capacity_factor is not None:
    sizes["capacity_factor"] = args.capacity_factor
  cfg = Config(**sizes)
  if cfg.d_model % cfg.heads or min(getattr(cfg, k) for k in SIZES) < 1 \
      or cfg.capacity_factor <= 0:
    ap.error("sizes must be positive and --d-model a multiple of --heads")

  multi = launch.init_jax(args.devices, malloc=args.malloc)
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P
  import transformer   # the corpus and its batches

  mesh = jax.sharding.Mesh(np.array(jax.devices()), (AXIS,),
                           axis_types=(jax.sharding.AxisType.Auto,))
  n = mesh.size
  params = init_params(cfg, n)
  opt_state = jax.tree.map(np.asarray, make_optimizer(cfg).init(params))
  host_state = (params, opt_state)
  batches = [harness.put(b, mesh, P(AXIS))
             for b in transformer.make_batches(transformer.load_corpus(), cfg, n)]
  c = capacity(cfg, n)
  harness.say(
      f"mixture of experts: {cfg.layers} blocks, width {cfg.d_model}, "
      f"{cfg.experts_per_device * n} experts of width {cfg.d_ff} ({cfg.experts_per_device} per "
      f"device), top-1, capacity {c} tokens per expert and source device; {n} devices in "
      f"{jax.process_count()} process(es); each all_to_all moves bf16[{n}, "
      f"{cfg.experts_per_device}, {c}, {cfg.d_model}] per device "
      f"({2 * n * cfg.experts_per_device * c * cfg.d_model / 2**10:.0f} KiB)")

  harness.maybe_calibrate(args, mesh, AXIS)
  variants = []
  for label in args.codecs:
    state = harness.put(host_state, mesh, state_specs(host_state))
    step = make_step(harness, cfg, mesh, *harness.VARIANTS[label], state, label=label)
    variants.append(harness.compile_variant(label, step, state, batches[0]))
  harness.say("compiled: " + ", ".join(f"{v.label} {v.compile_s:.1f} s" for v in variants))
  harness.train_lockstep(variants, batches, log_every=args.log_every)
  res = harness.summarize(variants, warmup=args.warmup_steps, params_of=lambda s: s[0])
  harness.print_report("train_moe", res)
  harness.write_json(args.json, res, example="train_moe", config=dataclasses.asdict(cfg),
                     capacity=c)
  return harness.finish(multi, res["ok"])


if __name__ == "__main__":
  sys.exit(main())
