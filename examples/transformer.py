"""The examples' byte-level transformer, its data and its FSDP units.

A decoder-only transformer in Flax linen: token and position embeddings,
pre-norm blocks (causal multi-head attention, GELU MLP, RMSNorm, no biases), an
output head tied to the token embedding; bfloat16 compute with float32
accumulation (`matmul`). Data: the bytes of the Python standard library's own
sources (no download), byte-level tokens (vocabulary 256), batches drawn with a
fixed seed. Used by train_fsdp.py, train_dp.py and train_moe.py (the corpus).
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

COMPUTE = jnp.bfloat16   # gathered parameters, activations and gradients


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

  @property
  def d_head(self) -> int:
    return self.d_model // self.heads


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



# ---- optimizer ------------------------------------------------------------------------------


def make_optimizer(cfg: Config):
  warmup = min(cfg.warmup, cfg.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup,
                                                max(cfg.steps, warmup + 1), cfg.lr / 10)
  return optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)
