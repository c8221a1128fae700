"""The training examples across processes (examples/launch.py), and the launcher itself.

Each example runs as 2 jax.distributed processes (one CPU device each, gloo) on
a tiny config for a few steps with codecs zipccl and raw, and must report
bit-identical losses and parameters (zipccl vs raw, in every process) and the
same losses in both processes: its JSON carries the bits every process gathered.
The launcher tests check that a dead worker is reported with its output, that the
deadline kills hung workers, and (as root, with iproute2) that --netns shapes the
namespace's loopback and removes the namespace afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import launch  # noqa: E402

TINY = {
    "train_dp.py": ["--quick", "--steps", "4", "--seq-len", "32", "--layers", "1"],
    "train_moe.py": ["--quick", "--steps", "4", "--seq-len", "16"],
    "train_fsdp.py": ["--quick", "--steps", "4", "--seq-len", "32", "--layers", "1"],
}


# XLA:CPU's LLVM back end takes most of these tiny steps' compile time (~6 s of CPU per
# variant and process); level 0 roughly halves it. zipccl and raw are compiled alike.
FAST_COMPILE = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}


def _run_example(tmp_path, script, nproc=2):
  out = tmp_path / "res.json"
  cmd = [sys.executable, str(ROOT / "examples" / script), *TINY[script], "--codecs",
         "zipccl,raw", "--warmup-steps", "1", "--log-every", "0", "--json", str(out)]
  launch.launch(cmd, nproc, deadline_s=150, logdir=tmp_path / "logs", echo=False, cwd=str(ROOT),
                env=FAST_COMPILE)
  return json.loads(out.read_text())


@pytest.mark.parametrize("script", sorted(TINY))
def test_example_is_bit_identical_across_processes(tmp_path, script):
  res = _run_example(tmp_path, script)
  assert res["processes"] == 2 and res["devices"] == 2
  checks = res["checks"]
  assert checks["losses_same_in_every_process"] == {"zipccl": True, "raw": True}, checks
  assert checks["zipccl_raw_losses_identical"] is True, checks
  assert checks["zipccl_raw_params_identical"] is True, checks
  assert res["ok"] is True
  z, r = res["variants"]["zipccl"], res["variants"]["raw"]
  assert len(z["losses"]) == 4 and len(z["step_ms"]) == 4
  zw = np.asarray(z["losses"], np.float32).view(np.uint32)
  rw = np.asarray(r["losses"], np.float32).view(np.uint32)
  np.testing.assert_array_equal(zw, rw)
  assert np.all(np.isfinite(z["losses"]))
  # Compressing moves fewer bytes when no call falls back (the compiled HLO's count).
  assert 0 < z["sent_bytes"] < r["sent_bytes"]
  assert z["median_ms"] > 0 and r["median_ms"] > 0


def test_the_identity_check_sees_a_difference():
  """summarize() compares loss words and parameter digests: one flipped loss bit fails it."""
  import harness

  class FakeArray:   # what digest() reads of a jax.Array
    def __init__(self, a):
      self.addressable_shards = [type("S", (), dict(device=type("D", (), dict(id=0))(),
                                                    index=(slice(None),), data=a))()]

  def variant(label, losses):
    v = harness.Variant(label, None, (FakeArray(np.arange(4, dtype=np.float32)),), 0.0, 1.0, 2.0)
    v.losses, v.times, v.wire = list(losses), [0.01] * len(losses), [0] * len(losses)
    return v

  same = harness.summarize([variant("zipccl", [2.0, 1.5]), variant("raw", [2.0, 1.5])],
                           warmup=1, params_of=lambda s: s)
  assert same["ok"] is True
  flipped = np.float32(1.5).view(np.uint32) ^ np.uint32(1)
  diff = harness.summarize(
      [variant("zipccl", [2.0, 1.5]), variant("raw", [2.0, float(flipped.view(np.float32))])],
      warmup=1, params_of=lambda s: s)
  assert diff["ok"] is False
  assert diff["checks"]["zipccl_raw_losses_identical"] is False
  assert diff["checks"]["zipccl_first_loss_difference"] == "step 2: 0x3fc00000 vs 0x3fc00001"


def test_lockstep_order_gives_each_variant_each_predecessor_equally_often():
  """Over a Williams design's rows, each variant takes each position, and follows
  each other variant within a row, the same number of times (a rotation gives each
  the same predecessor every step)."""
  import collections

  import harness
  for n in range(1, 8):
    rows = [harness.lockstep_order(i, n) for i in range(2 * n)]
    assert all(sorted(r) == list(range(n)) for r in rows)
    positions = collections.Counter((v, k) for r in rows for k, v in enumerate(r))
    assert len(positions) == n * n and len(set(positions.values())) == 1
    if n > 1:
      pairs = collections.Counter(p for r in rows for p in zip(r, r[1:]))
      assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1, (n, pairs)
  assert [harness.lockstep_order(i, 3)[0] for i in range(6)] == [0, 1, 2, 2, 0, 1]


def test_ratio_interval_brackets_the_ratio_of_medians():
  """The bootstrap interval of median(a) / median(b): around the true ratio for
  paired times, a point for equal times, reproducible, and None for too few steps."""
  import harness
  rng = np.random.default_rng(3)
  drift = np.repeat(rng.normal(0, 1, 40), 25)            # the machine's load, in stretches
  b = 30 + drift + rng.normal(0, 3, drift.size)
  a = 1.05 * (30 + drift) + rng.normal(0, 3, drift.size)
  lo, hi = harness.ratio_interval(a, b)
  assert lo < 1.05 < hi and hi - lo < 0.05
  assert lo <= np.median(a) / np.median(b) <= hi
  assert harness.ratio_interval(a, b) == [lo, hi]
  assert harness.ratio_interval(b, b) == [1.0, 1.0]
  lo, hi = harness.ratio_interval(a[:40], b[:40])   # blocks of 10 steps
  assert lo <= np.median(a[:40]) / np.median(b[:40]) <= hi
  assert harness.ratio_interval(a[:7], b[:7]) is None


def test_summarize_gives_ratio_intervals_to_raw_and_to_the_ladder_twin():
  """Each variant's step-time ratio to raw carries an interval, and a planned
  variant's to its ladder twin's (harness.LADDER_TWIN) too, over the steps neither
  left out."""
  import harness
  rng = np.random.default_rng(5)
  base = 30 + rng.normal(0, 1, 120)
  variants = []
  for label, scale in (("entropy", 0.8), ("planned-entropy", 0.88), ("raw", 1.0)):
    v = harness.Variant(label, None, (np.arange(4, dtype=np.float32),), 0.0, 1.0, 2.0)
    v.times = list(scale * base / 1e3)
    v.losses, v.wire, v.disturbed = [1.0] * 120, [0] * 120, [False] * 120
    variants.append(v)
  res = harness.summarize(variants, warmup=20, params_of=lambda s: ())
  planned = res["variants"]["planned-entropy"]
  lo, hi = planned["vs_ladder_interval"]
  assert lo <= 1.1 <= hi and hi - lo < 1e-9 and planned["ladder_twin"] == "entropy"
  lo, hi = planned["vs_raw_interval"]
  assert lo <= 0.88 <= hi
  assert "vs_ladder_interval" not in res["variants"]["entropy"]


def test_steps_during_another_variants_build_ahead_are_left_out():
  """train_lockstep marks a variant's steps during which another variant compiled
  ahead (`building()`), not those during its own builds; summarize's medians leave
  the marked steps out, and keep them all when every timed step is marked."""
  import harness
  import jax.numpy as jnp

  class Step:   # a zipccl_jax.jit stand-in: builds ahead after its 2nd and 3rd steps
    def __init__(self):
      self.calls, self.busy = 0, False

    def __call__(self, state, batch):
      self.calls += 1
      self.busy = self.calls in (2, 3)
      return state, jnp.float32(1.0), {}

    def building(self):
      return self.busy

  planned = harness.Variant("planned", Step(), (), 0.0, 1.0, 2.0)
  plain = harness.Variant("raw", lambda state, batch: (state, jnp.float32(1.0), {}), (),
                          0.0, 1.0, 2.0)
  harness.train_lockstep([planned, plain], [None] * 5)
  # the order alternates (planned first on even batches): raw's 3rd and 4th steps
  # run while planned's build is in flight
  assert planned.disturbed == [False] * 5
  assert plain.disturbed == [False, False, True, True, False]
  plain.times = [0.01, 0.01, 9.0, 9.0, 0.01]
  planned.times = [0.02, 0.02, 0.02, 9.0, 9.0]
  for v in (planned, plain):
    v.state = (np.arange(4, dtype=np.float32),)
  res = harness.summarize([planned, plain], warmup=1, params_of=lambda s: ())
  assert res["variants"]["raw"]["median_ms"] == pytest.approx(10.0)
  assert res["variants"]["raw"]["timed_steps"] == 2
  assert res["variants"]["raw"]["disturbed_steps"] == [3, 4]
  assert res["variants"]["planned"]["median_ms"] == pytest.approx(4510.0)   # its own count
  plain.disturbed = [True] * 5
  res = harness.summarize([planned, plain], warmup=1, params_of=lambda s: ())
  assert res["variants"]["raw"]["timed_steps"] == 0
  assert res["variants"]["raw"]["median_ms"] == pytest.approx(4505.0)


def test_codec_bytes_counts_the_common_path_of_the_compiled_step():
  """harness.codec_bytes reads the encode/decode FFI calls of the compiled HLO.

  A compressed psum of m = 3 x 4096 bf16 elements per device over 4 devices:
  its reduce-scatter encodes the 3 rows of m/4 for the others and decodes the 3
  that arrive from them, its all-gather encodes 1 row of m/4 and decodes the 3 of
  the others (the own row is not coded); each slot-ladder switch has a decode in
  every rung but one rung runs (only the first is counted). raw encodes nothing.
  """
  import harness
  import jax
  import jax.numpy as jnp
  from jax.sharding import AxisType, PartitionSpec as P

  import zipccl_jax
  mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:4])
  m = 3 * 4096

  def compiled(codec):
    f = jax.jit(jax.shard_map(
        lambda v: zipccl_jax.compressed_psum(v, "d", codec=codec, policy="always"),
        mesh=mesh, in_specs=P("d"), out_specs=P()))
    x = jax.device_put(jnp.ones(4 * m, jnp.bfloat16), jax.NamedSharding(mesh, P("d")))
    return f.lower(x).compile().as_text()

  row = 2 * m // 4                                   # bytes of one bf16 row
  assert harness.codec_bytes(compiled("zipccl")) == {
      "encoded": 3 * row + row, "decoded": 3 * row + 3 * row, "encode_calls": 2,
      "decode_calls": 2}
  assert harness.codec_bytes(compiled("raw")) == {
      "encoded": 0, "decoded": 0, "encode_calls": 0, "decode_calls": 0}


def test_dead_worker_is_reported_with_its_output(tmp_path):
  code = ("import os, sys, time; i = os.environ['ZIPCCL_PROCESS_ID']; "
          "print('worker says', i, os.environ['ZIPCCL_NUM_PROCESSES'], flush=True); "
          "sys.exit(3) if i == '1' else time.sleep(60)")
  start = time.monotonic()
  with pytest.raises(launch.LaunchError, match=r"worker 1 of 2 exited with code 3") as e:
    launch.launch([sys.executable, "-c", code], 2, logdir=tmp_path, echo=False)
  assert "worker says 1 2" in str(e.value)
  assert e.value.returncode == 3
  assert time.monotonic() - start < 30          # worker 0 (sleeping) was killed
  assert "worker says 0 2" in (tmp_path / "worker0.log").read_text()


def test_deadline_kills_hung_workers(tmp_path):
  code = "import time; print('waiting', flush=True); time.sleep(60)"
  start = time.monotonic()
  with pytest.raises(launch.LaunchError, match=r"deadline of 2 s passed; workers \[0, 1\]") as e:
    launch.launch([sys.executable, "-c", code], 2, deadline_s=2, logdir=tmp_path, echo=False)
  assert e.value.returncode == 124
  assert "waiting" in str(e.value)
  assert time.monotonic() - start < 30


def test_pin_sets_affinity_and_one_codec_thread(tmp_path):
  code = ("import os; print(sorted(os.sched_getaffinity(0)), os.environ['ZIPCCL_NUM_THREADS'], "
          "flush=True)")
  res = launch.launch([sys.executable, "-c", code], 2, pin=True, logdir=tmp_path, echo=False)
  cores = sorted(os.sched_getaffinity(0))
  threads = os.environ.get("ZIPCCL_NUM_THREADS", "1")   # pin keeps a setting it finds
  for i, out in enumerate(res.outputs):
    assert out.strip() == f"[{cores[i % len(cores)]}] {threads}", out


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")),
                    reason="--netns needs root and iproute2")
def test_netns_shapes_the_loopback_and_is_removed(tmp_path):
  code = ("import socket, subprocess; print(subprocess.run(['tc', 'qdisc', 'show', 'dev', 'lo'], "
          "capture_output=True, text=True).stdout); "
          "print('interfaces', sorted(n for _, n in socket.if_nameindex()))")
  before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  res = launch.launch([sys.executable, "-c", code], 1, netns="200mbit", logdir=tmp_path,
                      echo=False)
  out = res.outputs[0]
  assert "tbf" in out and "rate 200Mbit" in out, out
  assert "interfaces ['lo']" in out, out     # a fresh namespace: loopback only
  after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  assert after == before
