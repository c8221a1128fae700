"""What the training examples share: placing data, timing steps, checking bits, reporting.

Every example builds one jitted step per codec variant ("zipccl", "raw", and
"lax" = codec=None, the plain jax.lax collectives) with the contract

    step(state, batch) -> (state, loss, stats)

(state: any pytree, donated; loss: a float32 scalar replicated on every device;
stats: a pytree of zipccl_jax.CollectiveStats, replicated), and hands them to
`run()`. `run()` compiles each variant, reads the bytes its collectives move
from the compiled HLO, then trains all variants from the same initial state *in
lockstep*: step i of every variant, in an order from a Williams design
(`lockstep_order`), each timed alone up to `block_until_ready`. Interleaving
spreads machine noise (other jobs, the shared cores) evenly over the variants, and
the design spreads what a step leaves to the next one too (a slower variant's late
traffic, its freed memory): each variant follows each other equally often. Works
in one process with simulated devices and across processes under
examples/launch.py: step times are the slowest process's, and the checks gather
every process's bits.

Checks (a failed one makes the example exit with status 1):
  * each variant's losses are the same bits in every process;
  * zipccl and raw losses are bit-identical (as uint32 words), and so are their
    final parameters in every process (a digest of every local shard).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import zipccl_jax

# label -> (codec, policy) of the collectives. "auto" is the library's defaults: it
# decides per call whether to compress and with which codec (codec="auto",
# policy="auto": from its calibration, if any, else its static rules); its bits
# must equal raw's whichever path it takes.
VARIANTS = {"zipccl": ("zipccl", "always"), "entropy": ("entropy", "always"), "raw": ("raw", "always"),
            "lax": (None, "always"), "auto": ("auto", "auto"),
            # the same collectives under zipccl_jax.jit: slots planned ahead (`jit_for`)
            "planned": ("zipccl", "always"), "planned-entropy": ("entropy", "always"),
            "planned-auto": ("auto", "auto"),
            # codec="raw" under zipccl_jax.jit (no call site: nothing to validate or
            # exchange): the wrapper's own cost per call
            "planned-raw": ("raw", "always")}


# a planned variant -> the ladder variant of the same collectives under jax.jit
LADDER_TWIN = {"planned": "zipccl", "planned-entropy": "entropy", "planned-auto": "auto"}


def jit_for(label: str, step, donate=0):
  """The step jitted for variant `label`, with `donate` donated: zipccl_jax.jit for
  the planned variants (whose planned steps keep the state for a re-run, and whose
  steps of raw words donate it), else jax.jit."""
  if label.startswith("planned"):
    return zipccl_jax.jit(step, donate_argnums=donate)
  return jax.jit(step, donate_argnums=donate)


def parse_codecs(text: str) -> list:
  """'zipccl,raw,lax' -> labels, validated."""
  labels = [c.strip() for c in text.split(",") if c.strip()]
  bad = [c for c in labels if c not in VARIANTS]
  if bad or not labels or len(set(labels)) != len(labels):
    raise ValueError(f"--codecs must be distinct names from {sorted(VARIANTS)}, got {text!r}")
  return labels


def add_common_args(ap, *, devices: int) -> None:
  """The options every training example shares."""
  ap.add_argument("--codecs", default="zipccl,raw,lax", type=parse_codecs,
                  help="variants to train in lockstep, from zipccl, entropy, raw, lax (codec=None), "
                       "auto (the library's defaults: codec='auto', policy='auto') and planned / "
                       "planned-entropy / planned-auto (zipccl / entropy / the defaults under "
                       "zipccl_jax.jit); default zipccl,raw,lax")
  ap.add_argument("--warmup-steps", type=int, default=3, metavar="K",
                  help="leading steps left out of the step-time medians (default 3)")
  ap.add_argument("--devices", type=int, default=devices,
                  help=f"simulated CPU devices when run as one process (default {devices}); "
                       "under examples/launch.py every process's devices are used")
  ap.add_argument("--log-every", type=int, default=10, metavar="K",
                  help="print the losses every K steps (0: only the last)")
  ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
  ap.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                  help="tuned (the default): zipccl_jax.tune_host_allocator() before JAX starts, "
                       "so XLA's large buffers are reused instead of mapped and faulted in every "
                       "step (FSDP over 1 Gbit/s, 2 processes: 5%% faster raw, 9%% faster "
                       "compressed); default: glibc's own settings")
  ap.add_argument("--calibrate", action="store_true",
                  help="first run zipccl_jax.calibrate on this mesh axis (bfloat16; not saved, "
                       "active for this run), so the 'auto' variant decides with numbers "
                       "measured on this link")


def maybe_calibrate(args, mesh, axis: str) -> None:
  """`--calibrate`: zipccl_jax.calibrate(mesh, axis) before any step is traced.

  policy="auto" decides when a step is traced, so the calibration must be active
  before the variants are compiled; every process calls this (it runs collectives).
  """
  if not getattr(args, "calibrate", False):
    return
  t0 = time.perf_counter()
  cal = zipccl_jax.calibrate(mesh, axis, dtypes=("bfloat16",), save=False, activate=True)
  say(f"calibrated on axis {axis!r} in {time.perf_counter() - t0:.1f} s:\n{cal.summary()}")


def varying(tree, axis: str):
  """Types a pytree as varying over `axis` inside shard_map (no data movement).

  Differentiating with respect to the varying copy of replicated parameters
  gives each device its own gradient: differentiating through the replicated
  value would make JAX insert its own psum (the transpose of that cast).
  """
  from jax import lax
  pcast = getattr(lax, "pcast", None)
  if pcast is not None:
    return jax.tree.map(lambda x: pcast(x, (axis,), to="varying"), tree)
  return jax.tree.map(lambda x: lax.pvary(x, (axis,)), tree)  # pragma: no cover - older jax


def is_main() -> bool:
  return jax.process_index() == 0


def say(*a, **kw) -> None:
  """print() on process 0 only."""
  if is_main():
    print(*a, **kw, flush=True)


def put(tree, mesh, specs):
  """Host arrays (identical on every process) -> global arrays with PartitionSpecs `specs`.

  `specs` is one PartitionSpec for every leaf or a pytree of them matching `tree`.
  Works across processes: each process only materialises its own shards.
  """
  from jax.sharding import NamedSharding, PartitionSpec
  if isinstance(specs, PartitionSpec):
    specs = jax.tree.map(lambda _: specs, tree)

  def one(x, spec):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])

  return jax.tree.map(one, tree, specs)


def local(x) -> np.ndarray:
  """The value of a replicated array, read from this process's first shard (numpy
  values, e.g. the exact byte counts of CollectiveStats, pass through)."""
  return np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else np.asarray(x)


def digest(tree) -> bytes:
  """sha256 over the bytes of every shard this process holds, in a fixed order."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    for shard in sorted(leaf.addressable_shards, key=lambda s: s.device.id):
      h.update(repr(shard.index).encode())
      h.update(np.ascontiguousarray(np.asarray(shard.data)).tobytes())
  return h.digest()


def all_processes(x: np.ndarray) -> np.ndarray:
  """Stacks a same-shaped host array from every process: [processes, ...]."""
  if jax.process_count() == 1:
    return np.asarray(x)[None]
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def _stats_leaves(stats) -> list:
  """[(name, CollectiveStats)] of a stats pytree; name = its path, e.g. "layer0/dispatch"."""
  is_stats = lambda s: isinstance(s, zipccl_jax.CollectiveStats)
  leaves = jax.tree_util.tree_flatten_with_path(stats, is_leaf=is_stats)[0]
  return [("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), s)
          for path, s in leaves if is_stats(s)]


_CODEC_CALL_RE = re.compile(r'custom_call_target="zipccl_(\w+?)_(encode|decode)"')
_COMP_HEADER_RE = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")


def codec_bytes(hlo_text: str) -> dict:
  """Raw bytes the codec calls of a compiled step encode and decode, on the common path.

  Reads the zipccl FFI custom calls (`zipccl_<codec>_encode` / `_decode`) of the
  HLO text; a slot ladder's `lax.switch` has a decode in every rung, so only the
  first branch of each conditional is followed (the smallest rung; any compressed
  rung decodes the same rows). Encoded bytes = the encode operand (the raw rows),
  decoded bytes = the decode's first result (the rows it writes), less one row
  per call whose skip operand is not a constant: the transport's own row, which
  the CPU handlers do not code (docs/design.md, "Transport: the slot ladder").

  Returns:
    {"encoded": bytes, "decoded": bytes, "encode_calls": count, "decode_calls": count}.
  """
  comps, entry, cur = {}, None, None
  for line in hlo_text.splitlines():
    m = _COMP_HEADER_RE.match(line)
    if m:
      cur = m.group(2)
      comps[cur] = []
      entry = cur if m.group(1) else entry
    elif cur is not None and line.strip() == "}":
      cur = None
    elif cur is not None and "=" in line:
      comps[cur].append(line)
  out = {"encoded": 0, "decoded": 0, "encode_calls": 0, "decode_calls": 0}

  def first_array_bytes(text: str) -> int:
    m = re.search(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\]", text)
    if not m:
      return 0
    dt = m.group(1)
    size = 1 if dt == "pred" else 2 if dt == "bf16" else max(int(dt[1:]) // 8, 1)
    for d in filter(None, m.group(2).split(",")):
      size *= int(d)
    return size

  def walk(comp, seen):
    if comp in seen or comp not in comps:
      return
    seen = seen | {comp}
    consts = {re.match(r"\s*(?:ROOT\s+)?%([\w.\-]+)", ln).group(1) for ln in comps[comp]
              if re.search(r"=\s*\S+\s+constant\(", ln) and re.match(r"\s*(?:ROOT\s+)?%", ln)}
    for line in comps[comp]:
      m = _CODEC_CALL_RE.search(line)
      if m:
        rhs = line.split("=", 1)[1]
        operands = re.findall(r"%([\w.\-]+)", rhs.split("custom-call(", 1)[1].split(")", 1)[0])

        def coded(nbytes, shape_text):
          # one row fewer when the skip operand (the second) is computed, not constant
          dims = re.search(r"\[([\d,]*)\]", shape_text)
          lead = [int(d) for d in dims.group(1).split(",")[:-1]] if dims and dims.group(1) else []
          rows = int(np.prod(lead)) if lead else 1
          skipped = len(operands) > 1 and operands[1] not in consts and rows > 0
          return nbytes - (nbytes // rows if skipped else 0)

        if m.group(2) == "encode":
          ops = re.search(r"operand_layout_constraints=\{(.*?)\}\s*,", line)
          text = ops.group(1) if ops else ""
          out["encoded"] += coded(first_array_bytes(text), text)
          out["encode_calls"] += 1
        else:
          out["decoded"] += coded(first_array_bytes(rhs), rhs)
          out["decode_calls"] += 1
      b = re.search(r"branch_computations=\{([^}]*)\}", line)
      if b:
        walk(re.findall(r"%([\w.\-]+)", b.group(1))[0], seen)
        continue
      f = re.search(r"false_computation=%([\w.\-]+)", line)
      if f:
        walk(f.group(1), seen)
        continue
      for key in ("calls", "to_apply", "body", "condition"):
        for sub in re.findall(key + r"=%([\w.\-]+)", line):
          walk(sub, seen)

  if entry is not None:
    walk(entry, frozenset())
  return out


@dataclasses.dataclass
class Variant:
  """One codec variant of a training step, ready to run."""
  label: str
  step: object            # the compiled executable
  state: object
  compile_s: float
  sent: float | None      # bytes one device sends per step, no fallback (HLO model;
                          # a zipccl_jax.jit step's: read after training, `train_lockstep`)
  sent_fallback: float | None   # ... when every fallback fires
  codec: dict = dataclasses.field(default_factory=dict)   # codec_bytes() of the step
  losses: list = dataclasses.field(default_factory=list)
  times: list = dataclasses.field(default_factory=list)
  wire: list = dataclasses.field(default_factory=list)      # stats.wire_bytes per step
  wire_raw: list = dataclasses.field(default_factory=list)  # their raw paths' bytes per step
  # steps during which another variant's program compiled ahead (zipccl_jax.jit
  # builds on a background thread, which takes a core from every variant)
  disturbed: list = dataclasses.field(default_factory=list)
  fell_back: int = 0      # steps where some call took its uncompressed fallback
  fallbacks: dict = dataclasses.field(default_factory=dict)  # per call: steps it fell back


def compile_variant(label: str, jitted, state, batch) -> Variant:
  """AOT-compiles `jitted(state, batch)` and reads its collectives' bytes from the HLO.

  A zipccl_jax.jit step measures here with its first call (on a copy of the state,
  which the measuring step's donation consumes; the outputs are dropped); its next
  calls, the training's first steps, measure on and plan (measuring calls on one
  batch would see one size), and the step run is the wrapper itself, which
  validates every step. compile_s is then the first call's time (measuring program
  compile + run) plus the time to take the last plan's program after training
  (compiled ahead meanwhile, or now), and the bytes are those of that plan
  (`train_lockstep` reads them)."""
  t0 = time.perf_counter()
  if hasattr(jitted, "site_stats"):
    jax.block_until_ready(jitted(jax.tree.map(jnp.copy, state), batch))
    return Variant(label, jitted, state, time.perf_counter() - t0, None, None, None)
  compiled = jitted.lower(state, batch).compile()
  v = Variant(label, compiled, state, time.perf_counter() - t0, None, None, None)
  _read_bytes(v, compiled.as_text())
  return v


def _read_bytes(v: Variant, text: str) -> None:
  """A variant's bytes from its compiled step's HLO text."""
  hlo = zipccl_jax.hlo_wire_bytes(text)
  v.sent, v.sent_fallback, v.codec = hlo.common_sent, hlo.fallback_sent, codec_bytes(text)


def comparisons(v: Variant) -> list:
  """A zipccl_jax.jit variant's timed comparisons of its plan with raw words (none for
  jax.jit variants)."""
  return v.step.comparisons() if hasattr(v.step, "comparisons") else []


def plan_changes(v: Variant) -> dict:
  """A zipccl_jax.jit variant's re-plans (overflows), shrinks and grows, summed over its
  call sites (empty for jax.jit variants)."""
  if not hasattr(v.step, "site_stats"):
    return {}
  sites = v.step.site_stats()
  return {k: sum(getattr(s, k) for s in sites) for k in ("replans", "shrinks", "grows")}


def _others_building(v: Variant, variants: list) -> bool:
  """Whether a variant other than `v` has a program compiling ahead now."""
  return any(w is not v and hasattr(w.step, "building") and w.step.building()
             for w in variants)


def lockstep_order(i: int, n: int) -> list[int]:
  """The order in which step i runs n variants: the rows of a Williams design in turn.

  A rotation (step i runs variants i, i+1, ... mod n) gives each variant each
  position equally often but the same predecessor every time, so what a step leaves
  behind lands on one variant only. A Williams design's rows
  (n rows for an even n, 2n for an odd one: the rows and their reverses) give each
  variant each position and each other variant as its predecessor within a row
  equally often. Row r is (r, r+1, r-1, r+2, r-2, ...) mod n. The same on every
  process, as the lockstep's collectives need."""
  rows = n if n % 2 == 0 else 2 * n
  r = i % rows
  first = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
  row = [(x + r) % n for x in first]
  return row if r < n else row[::-1]


def train_lockstep(variants: list, batches: list, *, log_every: int = 0) -> None:
  """Runs every variant over `batches` in lockstep (`lockstep_order`), timing each step.

  A step is marked disturbed when another variant's program was compiling ahead at
  its start or end: that build shares the process's cores with the step (with one
  pinned core, it doubles a short step's time). A variant's own builds ahead are
  its cost and leave its steps unmarked."""
  n = len(variants)
  for i, batch in enumerate(batches):
    for k in lockstep_order(i, n):
      v = variants[k]
      busy = _others_building(v, variants)
      t0 = time.perf_counter()
      state, loss, stats = v.step(v.state, batch)
      jax.block_until_ready((state, loss))
      v.times.append(time.perf_counter() - t0)
      v.disturbed.append(busy or _others_building(v, variants))
      v.state = state
      v.losses.append(float(local(loss)))
      leaves = _stats_leaves(stats)
      v.wire.append(sum(int(local(s.wire_bytes)) for _, s in leaves))
      v.wire_raw.append(sum(int(s.raw_bytes) for _, s in leaves))   # static
      fell = {name: bool(local(s.fell_back)) for name, s in leaves}
      v.fell_back += any(fell.values())
      for name, f in fell.items():
        v.fallbacks[name] = v.fallbacks.get(name, 0) + f
    if log_every and (i + 1) % log_every == 0 or i + 1 == len(batches):
      say(f"  step {i + 1:>4}/{len(batches)}  " + "  ".join(
          f"{v.label} {v.losses[-1]:.4f} ({v.times[-1] * 1e3:.0f} ms)" for v in variants))
  for v in variants:
    if v.sent is None:   # a zipccl_jax.jit step: the bytes of its last plan
      t0 = time.perf_counter()
      text = v.step.compiled(v.state, batches[0]).as_text()
      v.compile_s += time.perf_counter() - t0
      _read_bytes(v, text)
  for v in variants:   # zipccl_jax.jit's timed comparisons of its plan with raw words
    for c in comparisons(v):
      say(f"  {v.label}: step {c.step}, planned {c.planned_s * 1e3:.1f} ms/step, "
          f"raw words {c.raw_s * 1e3:.1f} ms/step (medians), paired difference "
          f"{c.difference_s * 1e3:+.2f} ms -> {c.chosen}")


# The interval of a step-time ratio: a moving-block bootstrap over the paired steps.
# Steps are not independent draws: the machine's load drifts over tens of steps
# (medians of 125-step stretches of one variant move by 2-3%), so resampling single
# steps would make the interval too narrow; blocks of BLOCK_STEPS consecutive steps
# keep that drift inside each draw. Fewer than 4 blocks' worth of steps (the
# examples' 40 timed steps of ~1 s over 1 Gbit/s) take blocks of a quarter of them.
BLOCK_STEPS = 25
DRAWS = 2000


def ratio_interval(a: np.ndarray, b: np.ndarray, *, level: float = 0.95,
                   seed: int = 0) -> list[float] | None:
  """[low, high] of median(a) / median(b) at `level`, for step times a and b paired
  by step (the same steps of two variants in lockstep), by a moving-block bootstrap
  (blocks of BLOCK_STEPS, or a quarter of the steps if fewer; DRAWS; a fixed seed,
  so the same times give the same interval). None with fewer than 8 steps."""
  n = min(len(a), len(b))
  block = min(BLOCK_STEPS, n // 4)
  if block < 2:
    return None
  a, b = np.asarray(a[:n], np.float64), np.asarray(b[:n], np.float64)
  rng = np.random.default_rng(seed)
  k = -(-n // block)
  starts = rng.integers(0, n - block + 1, size=(DRAWS, k))
  idx = (starts[:, :, None] + np.arange(block)).reshape(DRAWS, -1)[:, :n]
  ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
  tail = 100 * (1 - level) / 2
  return [float(x) for x in np.percentile(ratios, [tail, 100 - tail])]


def summarize(variants: list, *, warmup: int, params_of) -> dict:
  """Gathers every process's bits and times; returns the results (same on every process).

  Args:
    variants: trained `Variant`s.
    warmup: leading steps left out of the timing medians (gloo connects, caches).
    params_of: state -> the parameter pytree whose digest is compared.
  """
  steps = len(variants[0].times)
  labels = [v.label for v in variants]
  times = all_processes(np.array([v.times for v in variants], np.float64))      # [P, V, steps]
  disturbed = all_processes(np.array([v.disturbed for v in variants], np.uint8)).any(axis=0)
  words = all_processes(np.array([v.losses for v in variants], np.float32).view(np.uint32))
  digests = all_processes(np.array([list(digest(params_of(v.state))) for v in variants],
                                   np.uint8))                                   # [P, V, 32]
  nproc = times.shape[0]
  slowest = times.max(axis=0)                                                   # [V, steps]
  timed = slice(min(warmup, steps - 1), steps)
  out = dict(processes=nproc, devices=jax.device_count(), steps=steps, warmup=timed.start,
             variants={}, checks={})
  for j, v in enumerate(variants):
    # the timed steps no other variant's build ahead disturbed on any process (all
    # of them if every one was)
    clean = np.flatnonzero(~disturbed[j, timed])
    t = slowest[j, timed][clean] if clean.size else slowest[j, timed]
    out["variants"][v.label] = dict(
        median_ms=1e3 * statistics.median(t), p25_ms=1e3 * float(np.percentile(t, 25)),
        p75_ms=1e3 * float(np.percentile(t, 75)), min_ms=1e3 * float(t.min()),
        compile_s=v.compile_s, sent_bytes=v.sent, sent_bytes_fallback=v.sent_fallback,
        wire_bytes_mean=float(np.mean(v.wire)),
        wire_raw_bytes_mean=float(np.mean(v.wire_raw)) if v.wire_raw else 0.0,
        fallback_steps=v.fell_back,
        fallbacks=v.fallbacks, codec_bytes=v.codec,
        losses=[float(x) for x in words[0, j].view(np.float32)],
        step_ms=[1e3 * float(x) for x in slowest[j]],
        disturbed_steps=[int(k) + 1 for k in np.flatnonzero(disturbed[j])],
        timed_steps=int(clean.size),   # 0: every timed step was disturbed, the median keeps them
        # zipccl_jax.jit's decisions between its plan and raw words (the same on
        # every process: they decide from exchanged times)
        comparisons=[list(c) for c in comparisons(v)],
        # zipccl_jax.jit's plan changes, summed over its call sites
        plan_changes=plan_changes(v))
  # step-time ratios with their intervals, over the steps neither variant left out:
  # each variant's to raw's, and a planned variant's to its ladder twin's
  pairs = [(lab, "raw", "vs_raw_interval") for lab in labels if "raw" in labels]
  pairs += [(lab, LADDER_TWIN[lab], "vs_ladder_interval") for lab in labels
            if LADDER_TWIN.get(lab) in labels]
  for a, b, name in pairs:
    i, k = labels.index(a), labels.index(b)
    both = ~(disturbed[i, timed] | disturbed[k, timed])
    out["variants"][a][name] = ratio_interval(slowest[i, timed][both], slowest[k, timed][both])
    if b != "raw":
      out["variants"][a]["ladder_twin"] = b
  same_across = {lab: bool((words[:, j] == words[0, j]).all()) for j, lab in enumerate(labels)}
  out["checks"]["losses_same_in_every_process"] = same_across
  exact = [k for k in VARIANTS if k not in ("raw", "lax") and k in labels] \
      if "raw" in labels else []
  for name in exact:
    z, r = labels.index(name), labels.index("raw")
    loss_eq = bool((words[:, z] == words[:, r]).all())
    param_eq = bool((digests[:, z] == digests[:, r]).all())
    out["checks"][f"{name}_raw_losses_identical"] = loss_eq
    out["checks"][f"{name}_raw_params_identical"] = param_eq
    if not loss_eq:
      bad = np.flatnonzero(words[0, z] != words[0, r])
      k = int(bad[0]) if bad.size else 0
      out["checks"][f"{name}_first_loss_difference"] = (
          f"step {k + 1}: 0x{int(words[0, z, k]):08x} vs 0x{int(words[0, r, k]):08x}")
  if "lax" in labels and "raw" in labels:
    a = words[0, labels.index("lax")].view(np.float32)
    b = words[0, labels.index("raw")].view(np.float32)
    out["lax_vs_raw_max_loss_diff"] = float(np.max(np.abs(a - b)))
  out["ok"] = all(same_across.values()) and all(
      out["checks"][f"{name}_raw_{what}_identical"] for name in exact
      for what in ("losses", "params"))
  return out


def _mib(b: float) -> str:
  return f"{b / 2**20:.3f}"


def print_report(title: str, res: dict) -> None:
  """The step-time and bytes table and the checks (process 0 prints)."""
  vs = res["variants"]
  base = vs.get("raw")
  say(f"\n{title}: {res['processes']} process(es), {res['devices']} device(s), "
      f"{res['steps']} steps (timing: median over steps {res['warmup'] + 1}-{res['steps']}, "
      "the slowest process per step)")
  say(f"  {'codec':<7} {'step ms':>9} {'p25-p75 ms':>15} {'vs raw (95% interval)':>21} "
      f"{'sent MiB/dev':>12} {'bytes vs raw':>12} {'stats MiB':>9} {'fallbacks':>9} "
      f"{'last loss':>10}")
  for label, v in vs.items():
    speed = f"{v['median_ms'] / base['median_ms']:.3f}" if base else "-"
    ci = v.get("vs_raw_interval")
    speed += f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci and label != "raw" else ""
    ratio = f"{v['sent_bytes'] / base['sent_bytes']:.3f}" if base and base["sent_bytes"] else "-"
    say(f"  {label:<7} {v['median_ms']:>9.1f} {v['p25_ms']:>7.1f}-{v['p75_ms']:<7.1f} "
        f"{speed:>21} {_mib(v['sent_bytes']):>12} {ratio:>12} {_mib(v['wire_bytes_mean']):>9} "
        f"{v['fallback_steps']:>4}/{res['steps']:<4} {v['losses'][-1]:>10.4f}")
  say("  (sent = bytes one device's collectives send per step, by zipccl_jax.hlo_wire_bytes "
      "on the compiled step if no call falls back; stats MiB = mean operand bytes per step "
      "of the calls with stats, on the path taken (CollectiveStats.wire_bytes); fallbacks = "
      "steps where some call with stats took its uncompressed path)")
  timed = res["steps"] - res["warmup"]
  left_out = {label: timed - v["timed_steps"] for label, v in vs.items() if v["timed_steps"] < timed}
  if left_out:
    say("  timed steps left out (another variant compiling ahead, which shares the cores): "
        + ", ".join(f"{label} {k}/{timed}" + (" (all: the median keeps them)" if k == timed else "")
                    for label, k in left_out.items()))
  for label, v in vs.items():
    if v["fallback_steps"]:
      say(f"  {label} fallbacks per call: " + ", ".join(
          f"{k} {c}/{res['steps']}" for k, c in v["fallbacks"].items() if c))
  for k, v in res["checks"].items():
    say(f"  check {k}: {v}")
  if "lax_vs_raw_max_loss_diff" in res:
    say(f"  lax vs raw: largest loss difference {res['lax_vs_raw_max_loss_diff']:.3g} "
        "(lax sums in XLA's order; zipccl/raw in rank order)")
  say(f"  bit-identical: {'yes' if res['ok'] else 'NO'}")


def _plain(x):
  """numpy scalars and arrays as JSON values."""
  if isinstance(x, (np.generic, np.ndarray)):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_json(path: str | None, res: dict, **extra) -> None:
  if path and is_main():
    with open(path, "w") as f:
      json.dump(dict(res, **extra), f, indent=1, default=_plain)


def finish(multi: bool, ok: bool) -> int:
  """Exit status; shuts jax.distributed down cleanly (every process gets here)."""
  sys.stdout.flush()
  if multi:
    jax.distributed.shutdown()
  return 0 if ok else 1
