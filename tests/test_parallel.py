"""zipccl_jax.parallel: Flax steps written for jax.jit / nnx.jit, gradients compressed.

A linen model and an NNX model train a few optax steps data-parallel and FSDP
over the 8 simulated devices (axis "x"); every variant's parameters equal those
of the same step with codec="raw" bit for bit, the compiled step holds no
gradient-sized all-reduce, and the helpers compose with zipccl_jax.jit.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zc

from tests.reference import assert_bits_equal

N = 8
STEPS = 3
OPTS = dict(policy="always")   # the rows here are below policy="auto"'s threshold


def _batches(seed=0, steps=STEPS, width=64):
  """The same batch every step (so that the loss must fall)."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(4 * N, width)), jnp.bfloat16)
  y = jnp.asarray(rng.integers(0, 10, size=(4 * N,)), jnp.int32)
  return [(x, y)] * steps


def _ce(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


# ---- linen ----------------------------------------------------------------------------------

class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.gelu(nn.Dense(256, dtype=jnp.bfloat16, name="up")(x))
    return nn.Dense(10, dtype=jnp.bfloat16, name="head")(x)


def _linen_specs(params, fsdp: bool):
  """FSDP: every leaf whose leading dimension splits over the devices is sharded."""
  return jax.tree.map(lambda p: P("x") if fsdp and p.shape[0] % N == 0 else P(), params)


def train_linen(mesh, codec, fsdp, planned=False, steps=STEPS, compute_dtype=None):
  model = LinenMLP()
  params = model.init(jax.random.key(0), jnp.zeros((1, 64), jnp.bfloat16))["params"]
  specs = _linen_specs(params, fsdp)
  params = jax.tree.map(lambda p, s: jax.device_put(p, NamedSharding(mesh, s)), params, specs)
  tx = optax.adamw(1e-2)
  opt_state = tx.init(params)

  def loss_fn(p, batch):
    x, y = batch
    return _ce(model.apply({"params": p}, x), y)

  grad_fn = zc.parallel.value_and_grad(loss_fn, mesh, "x", param_specs=specs, codec=codec,
                                       compute_dtype=compute_dtype, **OPTS)

  def step(params, opt_state, batch):            # the user's jit step, one line changed
    loss, grads = grad_fn(params, batch)         # was: jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  # planned: plans take effect at the next step (built then), so these few steps run one
  jitted = zc.jit(step, compile_ahead=False) if planned else jax.jit(step)
  losses = []
  for batch in _batches(steps=steps):
    params, opt_state, loss = jitted(params, opt_state, batch)
    losses.append(loss)
  return params, jnp.stack(losses), jitted


@pytest.mark.parametrize("fsdp", [False, True], ids=["dp", "fsdp"])
def test_linen_step_is_bit_identical_to_raw(mesh8, fsdp):
  got, got_loss, _ = train_linen(mesh8, "zipccl", fsdp)
  want, want_loss, _ = train_linen(mesh8, "raw", fsdp)
  assert_bits_equal(got_loss, want_loss, "losses")
  for path, a in jax.tree_util.tree_leaves_with_path(got):
    b = want
    for k in path:
      b = b[k.key]
    assert_bits_equal(a, b, jax.tree_util.keystr(path))
  assert np.isfinite(np.asarray(got_loss)).all() and got_loss[-1] < got_loss[0]


def test_linen_fsdp_keeps_params_sharded_and_no_gradient_all_reduce(mesh8):
  params, _, jitted = train_linen(mesh8, "zipccl", fsdp=True, steps=1)
  assert params["up"]["kernel"].sharding.spec == P("x")      # [64, 256]: sharded
  assert params["head"]["bias"].sharding.spec in (P(), P(None))   # [10]: replicated
  batch = _batches(steps=1)[0]
  opt_state = optax.adamw(1e-2).init(params)
  text = jitted.lower(params, opt_state, batch).compile().as_text()
  # the only all-reduces are the loss's and the agreements' (a few bytes each): the
  # gradients move through the compressed transports
  big = [line for line in text.splitlines() if " all-reduce(" in line and "f32[]" not in line
         and "s32[" not in line]
  assert not big, big[:3]
  assert 'custom_call_target="zipccl_zipccl_encode"' in text


def test_compute_dtype_moves_bfloat16(mesh8):
  """compute_dtype=bfloat16: the float32 params are gathered and their gradients
  reduced as bfloat16 (the compressed rows are bf16), grads return as float32;
  bit-identical to raw."""
  got, got_loss, jitted = train_linen(mesh8, "zipccl", fsdp=True, compute_dtype=jnp.bfloat16)
  want, want_loss, _ = train_linen(mesh8, "raw", fsdp=True, compute_dtype=jnp.bfloat16)
  assert_bits_equal(got_loss, want_loss, "losses")
  assert_bits_equal(got["up"]["kernel"], want["up"]["kernel"], "up.kernel")
  assert got["up"]["kernel"].dtype == jnp.float32
  params, _, _ = train_linen(mesh8, "zipccl", fsdp=True, steps=1, compute_dtype=jnp.bfloat16)
  text = jitted.lower(params, optax.adamw(1e-2).init(params), _batches(steps=1)[0]).compile().as_text()
  encoders = [ln for ln in text.splitlines() if "zipccl_zipccl_encode" in ln]
  assert encoders and all("operand_layout_constraints={bf16[" in ln for ln in encoders)


def test_linen_step_under_zipccl_jit(mesh8):
  """The helper composes with zipccl_jax.jit: planned slots, same bits as raw."""
  got, got_loss, jitted = train_linen(mesh8, "zipccl", fsdp=True, planned=True)
  want, want_loss, _ = train_linen(mesh8, "raw", fsdp=True)
  assert_bits_equal(got_loss, want_loss, "losses")
  assert_bits_equal(got["up"]["kernel"], want["up"]["kernel"], "up.kernel")
  sites = jitted.site_stats()
  assert sites and all(s.slot_bytes is not None for s in sites)


# ---- NNX ------------------------------------------------------------------------------------

class NnxMLP(nnx.Module):
  def __init__(self, rngs, fsdp: bool):
    part = (lambda init, names: nnx.with_partitioning(init, names)) if fsdp else (
        lambda init, names: init)
    init = nnx.initializers.lecun_normal()
    self.up = nnx.Linear(64, 256, dtype=jnp.bfloat16, rngs=rngs,
                         kernel_init=part(init, ("x", None)))
    self.head = nnx.Linear(256, 10, dtype=jnp.bfloat16, rngs=rngs,
                           kernel_init=part(init, ("x", None)))

  def __call__(self, x):
    return self.head(nnx.gelu(self.up(x)))


def train_nnx(mesh, codec, fsdp):
  with jax.set_mesh(mesh):   # the variables with sharding metadata are placed on it
    model = NnxMLP(nnx.Rngs(0), fsdp)
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

  def loss_fn(model, batch):
    x, y = batch
    return _ce(model(x), y)

  grad_fn = zc.parallel.nnx_value_and_grad(loss_fn, mesh, "x", codec=codec, **OPTS)

  @nnx.jit
  def step(model, optimizer, batch):
    loss, grads = grad_fn(model, batch)          # was: nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss

  losses = [step(model, optimizer, batch) for batch in _batches(seed=1)]
  return nnx.state(model, nnx.Param), jnp.stack(losses)


@pytest.mark.parametrize("fsdp", [False, True], ids=["dp", "fsdp"])
def test_nnx_step_is_bit_identical_to_raw(mesh8, fsdp):
  got, got_loss = train_nnx(mesh8, "zipccl", fsdp)
  want, want_loss = train_nnx(mesh8, "raw", fsdp)
  assert_bits_equal(got_loss, want_loss, "losses")
  ga, wa = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(ga) == len(wa) == 4
  if fsdp:   # the kernels stay sharded as their metadata says
    assert got["up"]["kernel"][...].sharding.spec[0] == "x"
  for a, b in zip(ga, wa):
    assert_bits_equal(a, b, "params")
  assert got_loss[-1] < got_loss[0]


def test_dp_gradient_equals_compressed_psum_of_local_gradients(mesh8):
  """The data-parallel gradient is the compressed psum of each device's gradient of
  its part's loss / N: bit-equal to writing that out by hand in shard_map."""
  w = jnp.asarray(np.random.default_rng(2).normal(size=(64, 512)), jnp.bfloat16)
  x = jnp.asarray(np.random.default_rng(3).normal(size=(4 * N, 64)), jnp.bfloat16)
  loss_fn = lambda w, x: jnp.mean(jnp.tanh(x @ w).astype(jnp.float32) ** 2)
  loss, grad = jax.jit(zc.parallel.value_and_grad(loss_fn, mesh8, "x", codec="zipccl",
                                                  **OPTS))(w, x)

  def by_hand(w, x):
    w = jax.lax.pcast(w, "x", to="varying")   # each device's own gradient, not JAX's psum
    g = jax.grad(lambda w: loss_fn(w, x) / N)(w)
    return zc.compressed_psum(g, "x", codec="zipccl", **OPTS)

  want = jax.jit(jax.shard_map(by_hand, mesh=mesh8, in_specs=(P(), P("x")), out_specs=P()))(w, x)
  assert_bits_equal(grad, want, "gradient")
  assert loss.shape == ()


def test_aux_and_extra_arguments(mesh8):
  """has_aux: float leaves averaged over the axis, integer leaves summed; extra
  positional arguments go in replicated."""
  w = jnp.ones((16, 8), jnp.float32)
  x = jnp.arange(4 * N * 16, dtype=jnp.float32).reshape(4 * N, 16) / 100

  def loss_fn(w, x, scale):
    y = x @ w * scale
    return jnp.mean(y), {"mean": jnp.mean(y), "rows": jnp.int32(x.shape[0])}

  (loss, aux), grad = jax.jit(zc.parallel.value_and_grad(
      loss_fn, mesh8, "x", has_aux=True, **OPTS))(w, x, jnp.float32(2.0))
  assert int(aux["rows"]) == 4 * N
  np.testing.assert_allclose(float(aux["mean"]), float(loss), rtol=1e-6)
  np.testing.assert_allclose(float(loss), float(jnp.mean(x @ w * 2)), rtol=1e-5)
  assert grad.shape == w.shape


def test_bad_arguments_are_named(mesh8):
  f = lambda p, b: jnp.sum(p * b)
  with pytest.raises(ValueError, match="axis 'y' is not an axis of the mesh"):
    zc.parallel.value_and_grad(f, mesh8, "y")
  with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
    zc.parallel.value_and_grad(f, "x", "x")
  g = zc.parallel.value_and_grad(f, mesh8, "x", param_specs=P("z"))
  with pytest.raises(ValueError, match="names mesh axis 'z'"):
    g(jnp.ones(8), jnp.ones(8))


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["dp", "fsdp"])
def test_nnx_gpt_example_is_bit_identical(fsdp, capsys):
  """examples/flax_gpt.py (the NNX GPT of docs/flax.md) trains bit-identical to raw."""
  import importlib.util
  import pathlib
  import sys
  here = pathlib.Path(__file__).resolve().parents[1] / "examples"
  sys.path.insert(0, str(here))
  try:
    spec = importlib.util.spec_from_file_location("flax_gpt", here / "flax_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--steps", "3", "--d-model", "64", "--layers", "1", "--seq-len", "32"]
    assert module.main(args + (["--fsdp"] if fsdp else [])) == 0
  finally:
    sys.path.remove(str(here))
  assert "bit-identical to codec='raw': yes" in capsys.readouterr().out
