#!/usr/bin/env python
"""FSDP training of a small byte-level transformer over compressed collectives.

What it shows: `zipccl_jax.compressed_all_gather` and its VJP (a compressed
reduce-scatter) drop into FSDP training, are lossless, and move fewer bytes.

- Model: a decoder-only transformer in Flax linen: token and position
  embeddings, pre-norm blocks (causal multi-head attention, GELU MLP, RMSNorm,
  no biases), an output head tied to the token embedding. bfloat16 compute (the
  blocks' matmuls accumulate in float32: `matmul`).
- Data: the bytes of the Python standard library's own sources (no download),
  byte-level tokens (vocabulary 256), batches drawn with a fixed seed.
- Parallelism: 8 simulated CPU devices on one mesh axis "fsdp", pure FSDP
  (ZeRO-3 style). Each FSDP unit (the embeddings, each block) is one flat
  float32 master buffer split evenly over the devices. Inside `jax.shard_map`
  each device casts its shard to bfloat16 and `compressed_all_gather(...,
  tiled=True)` rebuilds the unit just before its first use. `jax.grad` of the
  local loss runs the gather's VJP, a compressed reduce-scatter that sums the
  devices' bfloat16 gradients in a fixed rank order with float32 accumulation,
  so each device receives the gradient of its own shard only. optax.adamw
  updates the float32 shards locally.
- The training runs twice from the same initial state: with the codec of
  `--codec` (any registered codec, `zipccl_jax.codecs.get`: by default the
  library's own default for bfloat16, `zipccl_jax.AUTO_CODEC` = "entropy"; or
  "zipccl", the window codec), and codec="raw" (the same algorithm moving
  uncompressed uint16 words: same reduction order). Losses and final parameters
  must agree bit for bit (compared as uint32 words); the script exits with
  status 1 if they do not.
- Bytes: the collectives' operand sizes are static, so the bytes every step
  sends follow from `zipccl_jax.encoded_nbytes`; the script checks that model
  against the compiled HLO (`zipccl_jax.hlo_wire_bytes`) for both the
  compressed and the fallback paths, then counts the path each call took.

Run:  python examples/train_fsdp.py          (default config: ~2 min of training on 2 cores)
      python examples/train_fsdp.py --quick  (a tiny config, seconds)
      python examples/train_fsdp.py --codec entropy   (the entropy codec instead)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import math
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax.progress import progress_bar

NUM_DEVICES = 8
AXIS = "fsdp"
COMPUTE = jnp.bfloat16   # gathered parameters, activations and gradients


def configure_jax(num_devices: int = NUM_DEVICES) -> None:
  """Simulates `num_devices` CPU devices. Must run before JAX starts a backend."""
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", num_devices)


# ---- configuration ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  steps: int = 200
  seq_len: int = 128
  d_model: int = 128
  layers: int = 4
  heads: int = 4
  mlp_ratio: int = 4
  batch_per_device: int = 2
  lr: float = 3e-3
  warmup: int = 20
  weight_decay: float = 0.01
  seed: int = 0
  # No capacity to tune: every collective sizes its wire from the data (the slot
  # ladder: the participants agree on the largest used size, one 4-byte pmax).

  @property
  def d_head(self) -> int:
    return self.d_model // self.heads


QUICK = dict(steps=20, seq_len=64, d_model=64, layers=2, heads=2, warmup=5)


# ---- data -----------------------------------------------------------------------------------


def load_corpus() -> np.ndarray:
  """The bytes of the standard library's top-level .py files, in sorted order."""
  root = os.path.dirname(os.__file__)
  chunks = []
  for path in sorted(glob.glob(os.path.join(root, "*.py"))):
    with open(path, "rb") as f:
      chunks.append(f.read())
  data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
  if data.size < 1 << 16:
    raise RuntimeError(f"the standard library sources under {root} are too small "
                       f"({data.size} bytes)")
  return data


def make_batches(data: np.ndarray, cfg: Config, num_devices: int) -> np.ndarray:
  """All batches up front, int32[steps, global batch, seq_len + 1]; both runs use them."""
  rng = np.random.default_rng(cfg.seed)
  starts = rng.integers(0, data.size - cfg.seq_len - 1,
                        size=(cfg.steps, cfg.batch_per_device * num_devices))
  return data[starts[..., None] + np.arange(cfg.seq_len + 1)].astype(np.int32)


# ---- model ----------------------------------------------------------------------------------


class Embeddings(nn.Module):
  """Token and position embeddings and the final norm; the head reuses `tok`."""
  cfg: Config

  def setup(self):
    d = self.cfg.d_model
    self.tok = self.param("tok", nn.initializers.normal(stddev=d ** -0.5), (256, d))
    self.pos = self.param("pos", nn.initializers.normal(stddev=0.02), (self.cfg.seq_len, d))
    self.final_norm = nn.RMSNorm(dtype=COMPUTE)

  def embed(self, tokens):
    return (jnp.take(self.tok, tokens, axis=0) + self.pos[:tokens.shape[-1]]).astype(COMPUTE)

  def logits(self, h):
    return jnp.einsum("bld,vd->blv", self.final_norm(h), self.tok.astype(COMPUTE),
                      preferred_element_type=jnp.float32)

  def __call__(self, tokens):  # for init only
    return self.logits(self.embed(tokens))


@jax.custom_vjp
def matmul(x, w):
  """x[M, K] @ w[K, N] of bfloat16 with float32 accumulation, rounded once to bfloat16.

  The forward and both backward products multiply bfloat16 operands into a
  float32 result (what a GPU's tensor cores do). On XLA:CPU this is also the fast
  path: a bf16 x bf16 -> f32 dot runs through oneDNN (~8x faster on one core here
  than a dot with a bfloat16 result, which is what jax's own transpose rule emits
  for the backward products).
  """
  return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _matmul_fwd(x, w):
  return matmul(x, w), (x, w)


def _matmul_bwd(res, g):
  x, w = res
  # Contracting dimensions instead of `.T`: XLA:CPU would copy the transposed
  # weight (a parameter-sized pass) before the dot.
  dx = lax.dot_general(g, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  dw = lax.dot_general(x, g, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _dense_dot(x, kernel, dimension_numbers, precision=None, **_):
  """nn.DenseGeneral's dot_general for the blocks' layers: x's trailing axes contract
  with the kernel's leading ones (no batch axes), via the 2-D `matmul`."""
  del precision
  (cx, ck), (bx, bk) = dimension_numbers
  k = len(cx)
  if bx or bk or tuple(cx) != tuple(range(x.ndim - k, x.ndim)) or tuple(ck) != tuple(range(k)):
    raise ValueError(f"_dense_dot: unsupported dimension numbers {dimension_numbers}")
  inner = math.prod(x.shape[x.ndim - k:])
  y = matmul(x.reshape(-1, inner), kernel.reshape(inner, -1))
  return y.reshape(x.shape[:x.ndim - k] + kernel.shape[k:])


class Block(nn.Module):
  """Pre-norm block: causal multi-head self-attention, then a GELU MLP."""
  cfg: Config

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    length, d = x.shape[1], x.shape[2]
    dense = functools.partial(nn.DenseGeneral, use_bias=False, dtype=COMPUTE,
                              dot_general=_dense_dot)
    h = nn.RMSNorm(dtype=COMPUTE, name="attn_norm")(x)
    q, k, v = dense((3, cfg.heads, cfg.d_head), name="qkv")(h).transpose(2, 0, 1, 3, 4)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    causal = jnp.tril(jnp.ones((length, length), bool))
    p = jax.nn.softmax(jnp.where(causal, s * cfg.d_head ** -0.5, -1e30), axis=-1)
    a = jnp.einsum("bhqk,bkhd->bqhd", p.astype(COMPUTE), v)
    x = x + dense(d, axis=(-2, -1), name="out")(a)
    h = nn.RMSNorm(dtype=COMPUTE, name="mlp_norm")(x)
    return x + dense(d, name="down")(jax.nn.gelu(dense(cfg.mlp_ratio * d, name="up")(h)))


def apply_model(cfg: Config, params: dict, inputs, get=lambda name, p: p):
  """Logits and per-block outputs. `get(name, params[name])` returns a unit's pytree
  (the FSDP step gathers it there, just before the unit's first use)."""
  emb = {"params": get("embed", params["embed"])}
  h = Embeddings(cfg).apply(emb, inputs, method=Embeddings.embed)
  acts = []
  for i in range(cfg.layers):
    name = f"block{i}"
    h = Block(cfg).apply({"params": get(name, params[name])}, h)
    acts.append(h)
  return Embeddings(cfg).apply(emb, h, method=Embeddings.logits), acts


# ---- FSDP units: flat, padded, sharded parameter buffers -------------------------------------


@dataclasses.dataclass(frozen=True)
class Unit:
  """How one FSDP unit's pytree maps onto its flat buffer (static metadata)."""
  name: str
  treedef: object
  shapes: tuple
  size: int     # real elements
  shard: int    # elements per device; the buffer holds shard * devices (zero padded)

  def unflatten(self, flat):
    # One split (its VJP is one concatenate), not a slice per leaf: the VJP of
    # slicing pads every leaf's gradient to the whole unit and adds them up, which
    # cost ~5x the model's own backward pass at width 1024.
    ends = np.cumsum([math.prod(shape) for shape in self.shapes]).tolist()
    parts = jnp.split(flat, ends) if ends else [flat]
    leaves = [p.reshape(shape) for p, shape in zip(parts, self.shapes)]
    return jax.tree_util.tree_unflatten(self.treedef, leaves)


def init_model(cfg: Config, num_devices: int):
  """Initial float32 parameters as FSDP units: (units, {name: flat padded buffer})."""
  keys = jax.random.split(jax.random.key(cfg.seed), cfg.layers + 1)
  trees = {"embed": Embeddings(cfg).init(keys[0], jnp.zeros((1, cfg.seq_len), jnp.int32))}
  x = jnp.zeros((1, cfg.seq_len, cfg.d_model), COMPUTE)
  for i in range(cfg.layers):
    trees[f"block{i}"] = Block(cfg).init(keys[i + 1], x)
  units, buffers = [], {}
  for name, tree in trees.items():
    leaves, treedef = jax.tree_util.tree_flatten(tree["params"])
    flat = np.concatenate([np.asarray(leaf, np.float32).reshape(-1) for leaf in leaves])
    shard = -(-flat.size // num_devices)
    units.append(Unit(name, treedef, tuple(leaf.shape for leaf in leaves), flat.size, shard))
    buffers[name] = np.pad(flat, (0, shard * num_devices - flat.size))
  return tuple(units), buffers


def unit_capacities(units, cfg=None, codec: str = "zipccl") -> dict:
  """{unit: (slot ladder of its gather rows, of its gradient reduce-scatter rows)}.

  Kept under its old name for callers (the capacities of the fixed-slot transport
  are gone): each ladder lists the row sizes the library can send with `codec`,
  the raw size last (`zipccl_jax.codec_ladder`: what the transport compiles;
  `check_against_hlo` compares the resulting wire model with the compiled HLO, so
  a mismatch does not go unnoticed).
  """
  del cfg
  out = {}
  for u in units:
    raw = 2 * u.shard
    # gather rows and gradient rows hold shard elements each; the gradient rows go
    # over an all-to-all (the same spacing as the gathers since its rungs compile to
    # no kernel on CPU)
    out[u.name] = (zipccl_jax.codec_ladder(codec, COMPUTE, u.shard) + (raw,),
                   zipccl_jax.codec_ladder(codec, COMPUTE, u.shard, all_to_all=True) + (raw,))
  return out


def count_stat(codec: str) -> tuple:
  """(name, unit) of `codec`'s count statistic (stats column 1, CollectiveStats.
  escape_count): the window codec counts escaped exponents (a rate per element),
  the entropy codec blocks stored raw (a rate per block of its BLOCK elements)."""
  if codec == "entropy":
    return "raw blocks", zipccl_jax.codecs.get(codec).BLOCK
  if codec == "zipccl":
    return "escape rate", 1
  return "count rate", 1


def count_units(codec: str, m: int) -> int:
  """Units (elements or blocks) of one row of m elements that count_stat's rate is of."""
  return -(-m // count_stat(codec)[1])


# ---- the gather, and a probe of its backward pass ---------------------------------------------


def _identity(full, probe):
  """Identity on `full`. Its VJP (`grad_probe`) reports what the backward reduce-scatter
  encodes."""
  del probe
  return full


def _watch_fwd(full, probe):
  del probe
  return full, None


@functools.cache
def grad_probe(codec: str):
  """The probe of the gather's backward pass for `codec` (a custom_vjp identity).

  The gather's VJP reduce-scatters the cotangent of `full`, one row per
  destination, and has no stats output. This probe encodes the same rows with the
  same codec's `encode_rows` and returns, as the gradient of `probe` float32[3]:
  (the codec's count in all rows, the count of the worst row, the largest used
  size of a row in units of 128 bytes). The count is stats column 1: escaped
  exponents for the window codec, raw blocks for the entropy codec
  (`count_stat`). The reduce-scatter sends the ladder rung that holds the largest
  used size of all devices.
  """
  encode_rows = zipccl_jax.codecs.get(codec).encode_rows

  def bwd(_, ct):
    rows = ct.reshape(lax.axis_size(AXIS), -1)
    _, st = encode_rows(rows)
    cnt = st[:, 1]
    return ct, jnp.stack([cnt.sum(), cnt.max(), st[:, 2].max()]).astype(jnp.float32)

  probe = jax.custom_vjp(_identity)
  probe.defvjp(_watch_fwd, bwd)
  return probe


def gather_unit(shard, probe, *, codec: str, capacities: tuple = ()):
  """All-gathers one unit's shard as bfloat16; returns (whole unit, CollectiveStats).

  policy="always": "auto" only compresses rows of at least AUTO_MIN_ROW_BYTES
  (64 KiB), and these rows are smaller. No capacity argument: the library sizes
  every call from the data (`capacities` is accepted and unused).
  """
  del capacities
  full, stats = zipccl_jax.compressed_all_gather(
      shard.astype(COMPUTE), AXIS, tiled=True, codec=codec, policy="always", stats=True)
  if probe is not None:
    full = grad_probe(codec)(full, probe)
  return full, stats


# ---- the training step ----------------------------------------------------------------------


def make_optimizer(cfg: Config):
  warmup = min(cfg.warmup, cfg.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup,
                                                max(cfg.steps, warmup + 1), cfg.lr / 10)
  return optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)


def make_train_step(cfg: Config, units, mesh, codec: str, capacities: dict, opt_state,
                    watch: bool):
  """The jitted FSDP step.

  (shards, opt_state, probes, batch) -> (shards, opt_state, mean loss, gather stats
  per unit, probe gradients per unit); `probes` only matter when `watch`.
  """
  by_name = {u.name: u for u in units}
  opt = make_optimizer(cfg)

  def local_loss(shards, probes, batch):
    stats = {}

    def get(name, shard):
      full, stats[name] = gather_unit(shard, probes[name] if watch else None, codec=codec,
                                      capacities=capacities[name])
      return by_name[name].unflatten(full)

    logits, _ = apply_model(cfg, shards, batch[:, :-1], get)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    # The reduce-scatter sums the devices' gradients: dividing by the device
    # count makes that sum the gradient of the global mean loss.
    return loss / lax.axis_size(AXIS), stats

  def step(shards, opt_state, probes, batch):
    (loss, stats), (grads, probe_grads) = jax.value_and_grad(
        local_loss, argnums=(0, 1), has_aux=True)(shards, probes, batch)
    updates, opt_state = opt.update(grads, opt_state, shards)
    return (optax.apply_updates(shards, updates), opt_state, lax.psum(loss, AXIS), stats,
            probe_grads)

  sharded = P(AXIS)
  opt_specs = jax.tree.map(lambda x: sharded if x.ndim else P(), opt_state)
  step = jax.shard_map(step, mesh=mesh, in_specs=(sharded, opt_specs, sharded, sharded),
                       out_specs=(sharded, opt_specs, P(), P(), sharded))
  return jax.jit(step, donate_argnums=(0, 1))


# ---- bytes on the wire ------------------------------------------------------------------------


def wire_model(units, codec: str, capacities: dict, n: int) -> dict:
  """Bytes one step sends, summed over the n devices, per unit, collective and rung.

  Unit u's all-gather moves one row of shard_u elements per device; its
  reduce-scatter moves n rows per device (one per destination) over an
  all-to-all. With a codec ("zipccl", "entropy") each is a switch over the slot ladder
  (`capacities`, from unit_capacities): rung k moves rows of ladder[k] bytes, the
  last rung the raw words. Agreement: every transport all-gathers int32[6] (its used
  size, count and plan fingerprint). Sent bytes per device use the model of zipccl_jax.hlo_wire_bytes:
  all-gather (n-1) x operand, all-to-all (n-1)/n x operand, all-reduce
  2(n-1)/n x operand. `check_against_hlo` compares the totals with the HLO.

  Returns:
    {unit: {"gather": (bytes per rung...), "scatter": (bytes per rung...)},
     "other": bytes of the loss all-reduce}.
  """
  out = {}
  reduce4 = 2 * (n - 1) / n * 4                              # an all-reduce of one int32
  for u in units:
    raw = 2 * u.shard                                        # bf16 bytes of one row
    if codec != "raw":
      gather_l, scatter_l = capacities[u.name]
      agree = (n - 1) * 24                                   # an all-gather of int32[6]
      gather = tuple((n - 1) * slot + agree for slot in gather_l)
      scatter = tuple((n - 1) * slot + agree for slot in scatter_l)
    else:
      gather = scatter = ((n - 1) * raw,)
    out[u.name] = {"gather": tuple(n * b for b in gather), "scatter": tuple(n * b for b in scatter)}
  out["other"] = n * reduce4                                 # psum of the float32 loss
  return out


def check_against_hlo(model: dict, hlo, n: int):
  """Raises unless the model's totals equal the compiled HLO's (smallest and raw rungs)."""
  units = [v for k, v in model.items() if k != "other"]
  common = sum(v["gather"][0] + v["scatter"][0] for v in units) + model["other"]
  worst = sum(v["gather"][-1] + v["scatter"][-1] for v in units) + model["other"]
  if abs(common - n * hlo.common_sent) > 1 or abs(worst - n * hlo.fallback_sent) > 1:
    raise AssertionError(
        f"the wire model disagrees with the compiled HLO: {common:.0f} vs "
        f"{n * hlo.common_sent:.0f} bytes (smallest rungs), {worst:.0f} vs "
        f"{n * hlo.fallback_sent:.0f} (raw rungs)")
  return common, worst


# ---- one run --------------------------------------------------------------------------------


def train(cfg: Config, codec: str, mesh, units, buffers, batches, *, progress=True) -> dict:
  """Trains from `buffers`; returns losses, final shards, bytes, fallbacks and timings.

  `codec`: a registered codec ("zipccl", "entropy") or "raw". A compressed run
  also probes its gradient rows (`grad_probe`).
  """
  n = mesh.size
  sharding = NamedSharding(mesh, P(AXIS))
  shards = {k: jax.device_put(v, sharding) for k, v in buffers.items()}
  opt_state = jax.jit(make_optimizer(cfg).init)(shards)  # moments sharded, count replicated
  compressed = codec != "raw"
  # (the raw run moves raw words only: its ladders are unused)
  capacities = unit_capacities(units, cfg, codec if compressed else "zipccl")
  watch = compressed
  probes = {u.name: jax.device_put(np.zeros(3 * n, np.float32), sharding) for u in units}
  data = jax.device_put(batches, NamedSharding(mesh, P(None, AXIS)))

  t0 = time.perf_counter()
  step = make_train_step(cfg, units, mesh, codec, capacities, opt_state, watch)
  step = step.lower(shards, opt_state, probes, data[0]).compile()
  compile_s = time.perf_counter() - t0
  model = wire_model(units, codec, capacities, n)
  common, worst = check_against_hlo(model, zipccl_jax.hlo_wire_bytes(step.as_text()), n)

  losses, sent = [], {"gather": [], "scatter": []}
  fallbacks = {"gather": 0, "scatter": 0}
  # [the codec's count (window: escapes, entropy: raw blocks), units it counts of
  # (elements, blocks)]
  escapes = {"gather": [0, 0], "scatter": [0, 0]}
  worst_row = 0.0                                            # of the gradient rows
  used_log = {"gather": [], "scatter": []}    # (row elements, agreed used bytes) per call
  bar = progress_bar(cfg.steps, f"{codec:>6}", unit="step", enabled=progress)
  t0 = time.perf_counter()
  for i in range(cfg.steps):
    shards, opt_state, loss, stats, probe_grads = step(shards, opt_state, probes, data[i])
    # Wait for the whole step before dispatching the next: with several steps in
    # flight, XLA:CPU's simulated devices can deadlock in a collective rendezvous.
    jax.block_until_ready((shards, opt_state))
    loss, stats, probe_grads = jax.device_get((loss, stats, probe_grads))
    for u in units:
      st = stats[u.name]
      rung = {"gather": int(np.asarray(st.rung).reshape(-1)[0]), "scatter": 0}
      if watch:
        used_log["gather"].append((u.shard, int(np.max(st.used_bytes))))
      escapes["gather"][0] += int(st.escape_count)
      escapes["gather"][1] += n * count_units(codec, u.shard)
      if watch:
        pg = probe_grads[u.name].reshape(n, 3)
        used = 128 * int(pg[:, 2].max())                       # agreed over all devices
        rung["scatter"] = sum(1 for slot in capacities[u.name][1][:-1] if used > slot)
        used_log["scatter"].append((u.shard, used))
        escapes["scatter"][0] += int(pg[:, 0].sum())
        escapes["scatter"][1] += n * n * count_units(codec, u.shard)
        worst_row = max(worst_row, float(pg[:, 1].max()) / count_units(codec, u.shard))
      for k in rung:
        fallbacks[k] += rung[k] == len(model[u.name][k]) - 1 and compressed
        sent[k].append(model[u.name][k][rung[k]])
    losses.append(float(loss))
    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.update(1)
  wall = time.perf_counter() - t0
  bar.close()
  per_step = {k: sum(v) / cfg.steps for k, v in sent.items()}
  per_step["other"] = model["other"]
  return dict(codec=codec, losses=np.asarray(losses, np.float32),
              params={k: np.asarray(v) for k, v in shards.items()},
              bytes_common=common, bytes_worst=worst, bytes=per_step,
              bytes_per_step=sum(per_step.values()), fallbacks=fallbacks,
              calls=cfg.steps * len(units),
              escape_rate={k: e / max(m, 1) for k, (e, m) in escapes.items()},
              worst_gradient_row=worst_row, used=used_log,
              wall_s=wall, compile_s=compile_s)


# ---- codec analysis of weights, gradients and activations ---------------------------------------


def analyze_tensors(cfg: Config, units, buffers, batch, codec: str = "zipccl") -> list:
  """zipccl_jax.analyze(..., codec=codec) on the initial weights, one step's
  gradients and activations.

  Per tensor of the embeddings and the first block (weights and gradients, as
  bfloat16; gradients of one device's batch), and the output of the first and
  last blocks. Returns [(kind, name, Analysis)].
  """
  params = {u.name: jax.tree.map(lambda x: x.astype(COMPUTE),
                                 u.unflatten(jnp.asarray(buffers[u.name]))) for u in units}

  def loss_fn(params, batch):
    logits, acts = apply_model(cfg, params, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean(), acts

  (_, acts), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch)
  rows = []
  for kind, tree in (("weight", params), ("gradient", grads)):
    for name in ("embed", "block0"):
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree[name]):
        if leaf.size >= 4096:
          label = name + "." + ".".join(str(getattr(k, "key", k)) for k in path)
          rows.append((kind, label, zipccl_jax.analyze(leaf, codec=codec)))
  rows.append(("activation", "block0 output", zipccl_jax.analyze(acts[0], codec=codec)))
  rows.append(("activation", f"block{cfg.layers - 1} output",
               zipccl_jax.analyze(acts[-1], codec=codec)))
  return rows


def print_analysis(rows, codec: str = "zipccl") -> None:
  """The analysis table. Its count column is the codec's (`count_stat`): the window
  codec's escape rate in %, or the entropy codec's raw blocks of all blocks."""
  head = "esc %" if codec == "zipccl" else ("raw blk" if codec == "entropy" else "count")

  def count(a):
    if codec == "zipccl":
      return f"{100 * a.escape_rate:.2f}"
    if codec == "entropy":
      return f"{a.count}/{count_units(codec, a.n)}"
    return f"{a.count}"

  width = max([len(head), 6] + [len(count(a)) for _, _, a in rows])
  print(f"  {'kind':<10} {'tensor':<26} {'elements':>8} {'H bits':>6} {'exp H':>5} "
        f"{head:>{width}} {'ratio':>6} {'wire':>6} {'exact':>5}")
  for kind, label, a in rows:
    print(f"  {kind:<10} {label[:26]:<26} {a.n:>8} {a.entropy_bits:>6.2f} "
          f"{a.exponent_entropy_bits:>5.2f} {count(a):>{width}} {a.ratio:>6.3f} "
          f"{a.wire_ratio:>6.3f} "
          f"{'yes' if a.roundtrip_ok else 'NO':>5}")


# ---- main ---------------------------------------------------------------------------------------


def _words(x) -> np.ndarray:
  x = np.ascontiguousarray(x)
  return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def first_mismatch(a: dict, b: dict) -> str | None:
  """None when every buffer is bit-identical, else the first differing word in hex."""
  for k in a:
    wa, wb = _words(a[k]), _words(b[k])
    bad = np.flatnonzero(wa != wb)
    if bad.size:
      i = int(bad[0])
      return f"{k}[{i}]: 0x{int(wa[i]):08x} vs 0x{int(wb[i]):08x} ({bad.size} words differ)"
  return None


def _mib(nbytes: float) -> str:
  return f"{nbytes / 2**20:.2f} MiB"


def parse_args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--steps", type=int, help=f"training steps (default {Config.steps})")
  ap.add_argument("--seq-len", type=int, help=f"tokens per sequence (default {Config.seq_len})")
  ap.add_argument("--d-model", type=int, help=f"model width (default {Config.d_model})")
  ap.add_argument("--layers", type=int, help=f"transformer blocks (default {Config.layers})")
  ap.add_argument("--heads", type=int, help=f"attention heads (default {Config.heads})")
  ap.add_argument("--batch-per-device", type=int,
                  help=f"sequences per device and step (default {Config.batch_per_device})")
  ap.add_argument("--codec", default=zipccl_jax.AUTO_CODEC, choices=zipccl_jax.codecs.names(),
                  help="the codec of the compressed run (zipccl_jax.codecs.get): entropy (the "
                       "library's default for bfloat16, zipccl_jax.AUTO_CODEC; default) or "
                       "zipccl (the window codec); the raw run is the baseline")
  ap.add_argument("--quick", action="store_true",
                  help="a tiny config (2 layers, width 64, 20 steps) that trains in seconds")
  ap.add_argument("--no-analyze", action="store_true", help="skip the codec analysis table")
  ap.add_argument("--no-progress", action="store_true", help="no progress bars")
  ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
  args = ap.parse_args(argv)
  overrides = dict(QUICK) if args.quick else {}
  for k in ("steps", "seq_len", "d_model", "layers", "heads", "batch_per_device"):
    if getattr(args, k) is not None:
      overrides[k] = getattr(args, k)
  cfg = Config(**overrides)
  if cfg.d_model % cfg.heads:
    ap.error(f"--d-model ({cfg.d_model}) must be a multiple of --heads ({cfg.heads})")
  if min(cfg.steps, cfg.seq_len, cfg.layers, cfg.batch_per_device) < 1:
    ap.error("--steps, --seq-len, --layers and --batch-per-device must be positive")
  return cfg, args


def main(argv=None) -> int:
  """Runs the demo; returns 0 when both runs are bit-identical (and every round trip is)."""
  cfg, args = parse_args(argv)
  devices = jax.devices("cpu")
  if len(devices) < NUM_DEVICES:
    print(f"error: this example needs {NUM_DEVICES} CPU devices, JAX has {len(devices)}; run "
          "it as a script (it configures the simulated devices itself) or set "
          "jax_num_cpu_devices before JAX starts", file=sys.stderr)
    return 2
  with jax.default_device(devices[0]):
    return _run(cfg, args, devices[:NUM_DEVICES])


def _run(cfg: Config, args, devices) -> int:
  mesh = jax.sharding.Mesh(np.array(devices), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
  data = load_corpus()
  batches = make_batches(data, cfg, mesh.size)
  units, buffers = init_model(cfg, mesh.size)
  print(f"model: {cfg.layers} blocks, width {cfg.d_model}, {cfg.heads} heads, "
        f"{sum(u.size for u in units) / 1e6:.2f} M parameters in {len(units)} FSDP units, "
        f"sharded over {mesh.size} CPU devices ({', '.join(f'{u.shard}' for u in units)} "
        f"elements per device)")
  print(f"data: {data.size / 1e6:.1f} MB of Python standard library sources, "
        f"{cfg.batch_per_device * mesh.size} x {cfg.seq_len} byte tokens per step")

  codec = args.codec
  if not args.no_analyze:
    call = "zipccl_jax.analyze" + ("" if codec == "zipccl" else f", codec={codec!r}")
    print(f"\ncodec analysis ({call}, bfloat16; ratio = raw / exact encoded size, wire = "
          f"raw / the ladder's slot a collective of the tensor moves):")
    rows = analyze_tensors(cfg, units, buffers, jnp.asarray(batches[0, :cfg.batch_per_device]),
                           codec)
    print_analysis(rows, codec)
    if not all(a.roundtrip_ok for _, _, a in rows):
      print("error: a codec round trip was not bit-exact", file=sys.stderr)
      return 1
  print()

  runs = {c: train(cfg, c, mesh, units, buffers, batches, progress=not args.no_progress)
          for c in (codec, "raw")}
  z, r = runs[codec], runs["raw"]
  loss_same = np.array_equal(_words(z["losses"]), _words(r["losses"]))
  mismatch = None if not loss_same else first_mismatch(z["params"], r["params"])
  identical = loss_same and mismatch is None

  print(f"\nmean loss ({codec} | raw):")
  edges = np.linspace(0, cfg.steps, min(10, cfg.steps) + 1).astype(int)
  for a, b in zip(edges[:-1], edges[1:]):
    zl, rl = z["losses"][a:b].mean(), r["losses"][a:b].mean()
    print(f"  steps {a + 1:>4}-{b:<4} {zl:.4f} | {rl:.4f}")

  print(f"\nbytes sent per step, summed over the {mesh.size} devices (the slot ladders' "
        "sizes equal the compiled HLO's collectives):")
  print(f"  {'':<38} {codec:>10} {'raw':>10} {'ratio':>6}")
  table = [("if every call took its smallest rung", z["bytes_common"], r["bytes_common"]),
           ("if every call took the raw rung", z["bytes_worst"], r["bytes_worst"]),
           ("measured: weight all-gathers", z["bytes"]["gather"], r["bytes"]["gather"]),
           ("measured: gradient reduce-scatters", z["bytes"]["scatter"], r["bytes"]["scatter"]),
           ("measured: total", z["bytes_per_step"], r["bytes_per_step"])]
  for name, bz, br in table:
    print(f"  {name:<38} {_mib(bz):>10} {_mib(br):>10} {br / bz:>6.3f}")
  rate, worst_row = z["escape_rate"], 100 * z["worst_gradient_row"]
  if codec == "entropy":
    block = count_stat(codec)[1]
    print(f"  raw blocks (of {block} elements): weights {100 * rate['gather']:.2f}%, gradient "
          f"rows {100 * rate['scatter']:.2f}% (worst row {worst_row:.1f}%); no capacity to "
          "tune (library defaults)")
  else:
    print(f"  {count_stat(codec)[0]}: weights {100 * rate['gather']:.2f}%, gradient rows "
          f"{100 * rate['scatter']:.2f}% (worst row {worst_row:.1f}%); no capacity to tune "
          "(library defaults)")
  print(f"  calls on the raw rung (exact): all-gathers {z['fallbacks']['gather']}/{z['calls']}, "
        f"reduce-scatters {z['fallbacks']['scatter']}/{z['calls']}")

  ratio = r["bytes_per_step"] / z["bytes_per_step"]
  print("\nsummary")
  print(f"  {'':<28} {codec:>12} {'raw':>12}")
  for name, a, b in (
      ("steps", cfg.steps, cfg.steps),
      ("loss, first step", f"{z['losses'][0]:.6f}", f"{r['losses'][0]:.6f}"),
      ("loss, last step", f"{z['losses'][-1]:.6f}", f"{r['losses'][-1]:.6f}"),
      ("bytes sent per step", _mib(z["bytes_per_step"]), _mib(r["bytes_per_step"])),
      ("compile time (s)", f"{z['compile_s']:.1f}", f"{r['compile_s']:.1f}"),
      ("training wall time (s)", f"{z['wall_s']:.1f}", f"{r['wall_s']:.1f}")):
    print(f"  {name:<28} {str(a):>12} {str(b):>12}")
  print(f"  {f'wire ratio (raw / {codec})':<28} {ratio:>12.3f}")
  print(f"  {'bit-identical':<28} {'yes' if identical else 'NO':>12}")
  if not identical:
    print(f"  first difference: {'the losses' if not loss_same else mismatch}")

  if args.json:
    keys = ("bytes_common", "bytes_worst", "bytes", "bytes_per_step", "fallbacks", "calls",
            "escape_rate", "worst_gradient_row", "used", "wall_s", "compile_s")
    with open(args.json, "w") as f:
      json.dump(dict(config=dataclasses.asdict(cfg), codec=codec, identical=bool(identical),
                     ratio=ratio,
                     runs={c: dict({k: v[k] for k in keys}, losses=v["losses"].tolist())
                           for c, v in runs.items()}), f, indent=1)
  return 0 if identical else 1


# ---- several processes (under examples/launch.py) ---------------------------------------------

DISTRIBUTED_STEPS = 30   # default --steps of the multi-process mode (timing, not convergence)


def main_distributed(argv=None) -> int:
  """The multi-process mode: step times of zipccl / raw / lax, bit-identity across processes.

  Runs under examples/launch.py (one FSDP shard per device of every process). The
  three variants train in lockstep from the same state (examples/harness.py);
  exits 1 unless zipccl's and raw's losses and every process's shards are
  bit-identical and all processes saw the same losses. Takes the model options
  of the single-process mode plus harness's (--codecs, --warmup-steps, --json...).
  """
  import harness   # examples/ is on sys.path (see __main__)
  ap = argparse.ArgumentParser(add_help=False)
  harness.add_common_args(ap, devices=NUM_DEVICES)
  hargs, rest = ap.parse_known_args(argv)
  cfg, args = parse_args(rest + ["--no-analyze", "--no-progress"])
  if args.steps is None and not args.quick:
    cfg = dataclasses.replace(cfg, steps=DISTRIBUTED_STEPS)
  import launch
  multi = launch.init_jax(hargs.devices, malloc=hargs.malloc)
  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.array(devices), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
  n = mesh.size
  units, buffers = init_model(cfg, n)
  opt_state = jax.tree.map(np.asarray, make_optimizer(cfg).init(buffers))
  opt_specs = jax.tree.map(lambda x: P(AXIS) if x.ndim else P(), opt_state)
  batches = [harness.put(b, mesh, P(AXIS)) for b in make_batches(load_corpus(), cfg, n)]
  harness.say(f"FSDP: {cfg.layers} blocks, width {cfg.d_model}, "
              f"{sum(u.size for u in units) / 1e6:.2f} M parameters in {len(units)} units over "
              f"{n} devices in {jax.process_count()} process(es), {cfg.batch_per_device} x "
              f"{cfg.seq_len} tokens per device and step")

  variants = []
  for label in hargs.codecs:
    codec, policy = harness.VARIANTS[label]
    if policy != "always":   # gather_unit compresses with policy="always"
      ap.error(f"--codecs: {label!r} is not available in train_fsdp.py")
    ladders = unit_capacities(units, cfg, codec if codec in zipccl_jax.codecs.names() else "zipccl")
    inner = make_train_step(cfg, units, mesh, codec, ladders, opt_state, watch=False)

    def step(state, batch, inner=inner):
      shards, opt, probes = state
      shards, opt, loss, stats, _ = inner(shards, opt, probes, batch)
      return (shards, opt, probes), loss, stats

    state = (harness.put(buffers, mesh, P(AXIS)), harness.put(opt_state, mesh, opt_specs),
             harness.put({u.name: np.zeros(3 * n, np.float32) for u in units}, mesh, P(AXIS)))
    variants.append(harness.compile_variant(label, harness.jit_for(label, step), state,
                                            batches[0]))
  harness.say("compiled: " + ", ".join(f"{v.label} {v.compile_s:.1f} s" for v in variants))
  harness.train_lockstep(variants, batches, log_every=hargs.log_every)
  res = harness.summarize(variants, warmup=hargs.warmup_steps, params_of=lambda s: s[0])
  harness.print_report("train_fsdp", res)
  harness.write_json(hargs.json, res, example="train_fsdp", config=dataclasses.asdict(cfg))
  return harness.finish(multi, res["ok"])


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # launch.py, harness.py
  import launch
  if launch.launched():
    sys.exit(main_distributed())
  configure_jax()
  sys.exit(main())
