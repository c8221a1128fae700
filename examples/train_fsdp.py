#!/usr/bin/env python
"""FSDP training of a small byte-level transformer over compressed collectives.

What it shows: `zipccl_jax.compressed_all_gather` and its VJP (a compressed
reduce-scatter) drop into FSDP training, are lossless, and move fewer bytes.

- Model: a decoder-only transformer in Flax linen (pre-norm blocks: causal
  attention, GELU MLP, RMSNorm, no biases; the head tied to the token
  embedding), bfloat16 compute with float32 accumulation (`matmul`).
- Data: the bytes of the Python standard library's own sources (no download),
  byte-level tokens, batches drawn with a fixed seed.
- Parallelism: 8 simulated CPU devices on one mesh axis "fsdp" (ZeRO-3 style).
  Each FSDP unit (the embeddings, each block) is one flat float32 buffer split
  evenly over the devices. Inside `jax.shard_map` each device casts its shard to
  bfloat16 and `compressed_all_gather(..., tiled=True)` rebuilds the unit just
  before its use; `jax.grad` runs the gather's VJP, a compressed reduce-scatter
  that sums the bfloat16 gradients in rank order with float32 accumulation.
  optax.adamw updates the float32 shards locally.
- The step is jitted with `zipccl_jax.jit`: every collective moves a slot planned
  from the sizes its first calls measured, validated after each step (a step that
  outgrows its plan runs again, exactly). `--ladder` uses `jax.jit` instead: each
  call agrees on its size at run time.
- It trains twice from the same state, with `--codec` (default the library's
  default for bfloat16, "entropy"; or "zipccl", the window codec) and with
  codec="raw" (the same algorithm moving uncompressed words). Losses and final
  parameters must agree bit for bit (as uint32 words), else exit status 1.
- Bytes: the compiled step's collectives (`zipccl_jax.hlo_wire_bytes`); planned,
  every operand size is static, so that is what each step sends.

Run:  python examples/train_fsdp.py          (default config: ~2 min on 2 cores)
      python examples/train_fsdp.py --quick  (a tiny config, seconds)
      python examples/launch.py -n 2 examples/train_fsdp.py   (2 processes: step times)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax.progress import progress_bar
# transformer.py, launch.py, harness.py: the script's directory is on sys.path
from transformer import (COMPUTE, Config, apply_model, init_model, load_corpus, make_batches,
                         make_optimizer)

NUM_DEVICES = 8
AXIS = "fsdp"


def configure_jax(num_devices: int = NUM_DEVICES) -> None:
  """Simulates `num_devices` CPU devices. Must run before JAX starts a backend."""
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", num_devices)


QUICK = dict(steps=20, seq_len=64, d_model=64, layers=2, heads=2, warmup=5)


# ---- the training step ----------------------------------------------------------------------


def make_train_step(cfg: Config, units, mesh, codec: str, opt_state):
  """The FSDP step (to jit): (shards, opt_state, batch) -> (shards, opt_state, mean loss).

  policy="always": the rows here are below "auto"'s 64 KiB threshold.
  """
  by_name = {u.name: u for u in units}
  opt = make_optimizer(cfg)

  def local_loss(shards, batch):
    def get(name, shard):
      full = zipccl_jax.compressed_all_gather(shard.astype(COMPUTE), AXIS, tiled=True,
                                              codec=codec, policy="always")
      return by_name[name].unflatten(full)

    logits, _ = apply_model(cfg, shards, batch[:, :-1], get)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    # The reduce-scatter sums the devices' gradients: dividing by the device
    # count makes that sum the gradient of the global mean loss.
    return loss / lax.axis_size(AXIS)

  def step(shards, opt_state, batch):
    loss, grads = jax.value_and_grad(local_loss)(shards, batch)
    updates, opt_state = opt.update(grads, opt_state, shards)
    return optax.apply_updates(shards, updates), opt_state, lax.psum(loss, AXIS)

  sharded = P(AXIS)
  opt_specs = jax.tree.map(lambda x: sharded if x.ndim else P(), opt_state)
  step = jax.shard_map(step, mesh=mesh, in_specs=(sharded, opt_specs, sharded),
                       out_specs=(sharded, opt_specs, P()))
  return step


def train(cfg: Config, codec: str, mesh, units, buffers, batches, *, planned=True,
          progress=True) -> dict:
  """Trains from `buffers` with `codec` ("raw" for the baseline); returns the losses,
  final shards, bytes sent per step and timings."""
  sharding = NamedSharding(mesh, P(AXIS))
  shards = {k: jax.device_put(v, sharding) for k, v in buffers.items()}
  opt_state = jax.jit(make_optimizer(cfg).init)(shards)  # moments sharded, count replicated
  data = jax.device_put(batches, NamedSharding(mesh, P(None, AXIS)))
  step = make_train_step(cfg, units, mesh, codec, opt_state)
  # Planned steps keep the donated state (a step that outgrew its plan runs again on
  # its inputs); the steps that cannot run again donate it.
  step = (zipccl_jax.jit if planned else jax.jit)(step, donate_argnums=(0, 1))
  losses, times = [], []
  bar = progress_bar(cfg.steps, f"{codec:>7}", unit="step", enabled=progress)
  for i in range(cfg.steps):
    t0 = time.perf_counter()
    shards, opt_state, loss = step(shards, opt_state, data[i])
    # One step in flight at a time: XLA:CPU's simulated devices can deadlock in a
    # collective rendezvous with several.
    losses.append(float(loss))
    times.append(time.perf_counter() - t0)
    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.update(1)
  bar.close()
  compiled = (step.compiled(shards, opt_state, data[0]) if planned else
              step.lower(shards, opt_state, data[0]).compile())
  hlo = zipccl_jax.hlo_wire_bytes(compiled.as_text())
  replans = sum(s.replans for s in step.site_stats()) if planned else 0
  return dict(codec=codec, losses=np.asarray(losses, np.float32),
              params={k: np.asarray(v) for k, v in shards.items()},
              sent=hlo.common_sent * mesh.size, sent_fallback=hlo.fallback_sent * mesh.size,
              first_step_s=times[0], step_s=float(np.median(times[1:] or times)),
              replans=replans)


# ---- codec analysis of weights, gradients and activations -----------------------------------


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


def print_analysis(rows) -> None:
  print(f"  {'kind':<10} {'tensor':<26} {'elements':>8} {'H bits':>6} {'exp H':>5} "
        f"{'ratio':>6} {'wire':>6} {'exact':>5}")
  for kind, label, a in rows:
    print(f"  {kind:<10} {label[:26]:<26} {a.n:>8} {a.entropy_bits:>6.2f} "
          f"{a.exponent_entropy_bits:>5.2f} {a.ratio:>6.3f} {a.wire_ratio:>6.3f} "
          f"{'yes' if a.roundtrip_ok else 'NO':>5}")


# ---- main ---------------------------------------------------------------------------------------


def first_mismatch(a: dict, b: dict) -> str | None:
  """None when every buffer is bit-identical, else the first differing word in hex."""
  for k in a:
    wa, wb = (np.ascontiguousarray(x).view(np.uint32) for x in (a[k], b[k]))
    bad = np.flatnonzero(wa != wb)
    if bad.size:
      i = int(bad[0])
      return f"{k}[{i}]: 0x{int(wa[i]):08x} vs 0x{int(wb[i]):08x} ({bad.size} words differ)"
  return None


def parse_args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  for name, help_ in (("steps", "training steps"), ("seq-len", "tokens per sequence"),
                      ("d-model", "model width"), ("layers", "transformer blocks"),
                      ("heads", "attention heads"), ("batch-per-device", "sequences per device")):
    default = getattr(Config, name.replace("-", "_"))
    ap.add_argument(f"--{name}", type=int, help=f"{help_} (default {default})")
  ap.add_argument("--codec", default=zipccl_jax.AUTO_CODEC, choices=zipccl_jax.codecs.names(),
                  help=f"the compressed run's codec (default {zipccl_jax.AUTO_CODEC!r}, the "
                       "library's default for bfloat16)")
  ap.add_argument("--ladder", action="store_true",
                  help="jax.jit (sizes agreed per call at run time) instead of zipccl_jax.jit")
  ap.add_argument("--quick", action="store_true", help="a tiny config that trains in seconds")
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
  mesh = jax.sharding.Mesh(np.array(devices[:NUM_DEVICES]), (AXIS,),
                           axis_types=(jax.sharding.AxisType.Auto,))
  data = load_corpus()
  batches = make_batches(data, cfg, mesh.size)
  units, buffers = init_model(cfg, mesh.size)
  codec = args.codec
  print(f"model: {cfg.layers} blocks, width {cfg.d_model}, "
        f"{sum(u.size for u in units) / 1e6:.2f} M parameters in {len(units)} FSDP units over "
        f"{mesh.size} CPU devices; data: {data.size / 1e6:.1f} MB of Python sources")
  if not args.no_analyze:
    print(f"\ncodec analysis (zipccl_jax.analyze, codec={codec!r}, bfloat16; ratio = raw / "
          "encoded size, wire = raw / the slot a collective of the tensor moves):")
    rows = analyze_tensors(cfg, units, buffers, jnp.asarray(batches[0, :cfg.batch_per_device]),
                           codec)
    print_analysis(rows)
    if not all(a.roundtrip_ok for _, _, a in rows):
      print("error: a codec round trip was not bit-exact", file=sys.stderr)
      return 1
  print()
  with jax.default_device(devices[0]):
    runs = {c: train(cfg, c, mesh, units, buffers, batches, planned=not args.ladder,
                     progress=not args.no_progress) for c in (codec, "raw")}
  z, r = runs[codec], runs["raw"]
  loss_same = np.array_equal(z["losses"].view(np.uint32), r["losses"].view(np.uint32))
  mismatch = None if not loss_same else first_mismatch(z["params"], r["params"])
  identical = loss_same and mismatch is None

  edges = np.linspace(0, cfg.steps, min(5, cfg.steps) + 1).astype(int)
  print(f"\nmean loss ({codec} | raw): " + ", ".join(
      f"steps {a + 1}-{b} {z['losses'][a:b].mean():.4f} | {r['losses'][a:b].mean():.4f}"
      for a, b in zip(edges[:-1], edges[1:])))
  ratio = r["sent"] / z["sent"]
  sent = (f"{z['sent'] / 2**20:.2f} MiB" if not args.ladder else
          f"{z['sent'] / 2**20:.2f}-{z['sent_fallback'] / 2**20:.2f} MiB")
  print(f"\n  {'':<34} {codec:>16} {'raw':>12}")
  for name, a, b in (
      ("bytes sent per step, all devices", sent, f"{r['sent'] / 2**20:.2f} MiB"),
      ("first step incl. compile (s)", f"{z['first_step_s']:.1f}", f"{r['first_step_s']:.1f}"),
      ("step time, median (ms)", f"{1e3 * z['step_s']:.0f}", f"{1e3 * r['step_s']:.0f}"),
      ("re-plans", z["replans"], r["replans"]),
      ("loss, last step", f"{z['losses'][-1]:.6f}", f"{r['losses'][-1]:.6f}")):
    print(f"  {name:<34} {str(a):>16} {str(b):>12}")
  print(f"  {f'wire ratio (raw / {codec})':<34} {ratio:>16.3f}"
        + ("  (smallest rungs)" if args.ladder else ""))
  print(f"  {'bit-identical':<34} {'yes' if identical else 'NO':>16}")
  if not identical:
    print(f"  first difference: {'the losses' if not loss_same else mismatch}")
  if args.json:
    keys = ("sent", "sent_fallback", "first_step_s", "step_s", "replans")
    with open(args.json, "w") as f:
      json.dump(dict(config=dataclasses.asdict(cfg), codec=codec, identical=bool(identical),
                     ratio=ratio, planned=not args.ladder,
                     runs={c: dict({k: v[k] for k in keys}, losses=v["losses"].tolist())
                           for c, v in runs.items()}), f, indent=1)
  return 0 if identical else 1


# ---- several processes (under examples/launch.py) ---------------------------------------------


def main_distributed(argv=None) -> int:
  """Step times of several variants (--codecs, default zipccl,raw,lax) trained in
  lockstep across processes (examples/harness.py); exit 1 unless the compressed
  and raw variants are bit-identical in every process."""
  import harness
  import launch
  ap = argparse.ArgumentParser(add_help=False)
  harness.add_common_args(ap, devices=NUM_DEVICES)
  hargs, rest = ap.parse_known_args(argv)
  cfg, args = parse_args(rest + ["--no-analyze", "--no-progress"])
  if args.steps is None and not args.quick:
    cfg = dataclasses.replace(cfg, steps=30)   # timing, not convergence
  multi = launch.init_jax(hargs.devices, malloc=hargs.malloc)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), (AXIS,),
                           axis_types=(jax.sharding.AxisType.Auto,))
  units, buffers = init_model(cfg, mesh.size)
  opt_state = jax.tree.map(np.asarray, make_optimizer(cfg).init(buffers))
  opt_specs = jax.tree.map(lambda x: P(AXIS) if x.ndim else P(), opt_state)
  batches = [harness.put(b, mesh, P(AXIS)) for b in make_batches(load_corpus(), cfg, mesh.size)]
  harness.say(f"FSDP: {cfg.layers} blocks, width {cfg.d_model}, {len(units)} units over "
              f"{mesh.size} devices in {jax.process_count()} process(es)")
  variants = []
  for label in hargs.codecs:
    codec, policy = harness.VARIANTS[label]
    if policy != "always":   # the gathers compress with policy="always"
      ap.error(f"--codecs: {label!r} is not available in train_fsdp.py")
    inner = make_train_step(cfg, units, mesh, codec, opt_state)

    def step(state, batch, inner=inner):
      shards, opt, loss = inner(*state, batch)
      return (shards, opt), loss, {}

    state = (harness.put(buffers, mesh, P(AXIS)), harness.put(opt_state, mesh, opt_specs))
    variants.append(harness.compile_variant(label, harness.jit_for(label, step), state,
                                            batches[0]))
  harness.say("compiled: " + ", ".join(f"{v.label} {v.compile_s:.1f} s" for v in variants))
  harness.train_lockstep(variants, batches, log_every=hargs.log_every)
  res = harness.summarize(variants, warmup=hargs.warmup_steps, params_of=lambda s: s[0])
  harness.print_report("train_fsdp", res)
  harness.write_json(hargs.json, res, example="train_fsdp", config=dataclasses.asdict(cfg))
  return harness.finish(multi, res["ok"])


if __name__ == "__main__":
  import launch
  if launch.launched():
    sys.exit(main_distributed())
  configure_jax()
  sys.exit(main())
