"""examples/train_fsdp.py: a few FSDP steps, compressed vs raw, bit-identical; and the
bytes its compiled steps move against a model built from the codecs' ladders.

Runs the example in this process (tests/conftest.py has already configured the 8
simulated CPU devices), on its tiny --quick config for 3 steps.
"""
import contextlib
import importlib.util
import io
import json
import pathlib
import sys

import numpy as np
import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_fsdp.py"


@pytest.fixture(scope="module")
def example():
  sys.path.insert(0, str(EXAMPLE.parent))   # its sibling transformer.py
  spec = importlib.util.spec_from_file_location("train_fsdp", EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up while it executes
  spec.loader.exec_module(module)
  yield module
  sys.modules.pop(spec.name, None)
  sys.path.remove(str(EXAMPLE.parent))


@pytest.fixture(scope="module")
def quick_run(example, tmp_path_factory):
  """(exit status, results JSON, printed text) of a 3-step --quick run of the window
  codec under zipccl_jax.jit (the entropy codec on the ladder: `entropy_run`)."""
  out = tmp_path_factory.mktemp("example") / "results.json"
  text = io.StringIO()
  with contextlib.redirect_stdout(text):
    status = example.main(["--quick", "--steps", "3", "--codec", "zipccl", "--no-progress",
                           "--json", str(out)])
  return status, json.loads(out.read_text()), text.getvalue()


def _same_words(a, b):
  np.testing.assert_array_equal(np.asarray(a, np.float32).view(np.uint32),
                                np.asarray(b, np.float32).view(np.uint32))


def test_compressed_and_raw_training_are_bit_identical(quick_run):
  status, res, text = quick_run
  assert status == 0, text
  assert res["identical"] is True and res["planned"] is True
  z, r = res["runs"]["zipccl"], res["runs"]["raw"]
  assert len(z["losses"]) == 3
  _same_words(z["losses"], r["losses"])
  assert "bit-identical" in text and "wire ratio (raw / zipccl)" in text


def test_the_codec_round_trips_in_the_analysis_table(quick_run):
  _, _, text = quick_run
  table = [line for line in text.splitlines()
           if line.strip().startswith(("weight ", "gradient ", "activation "))]
  assert len(table) >= 5
  assert all(line.rstrip().endswith("yes") for line in table), "\n".join(table)


def test_planned_run_sends_fewer_bytes_and_exactly_its_slots(quick_run):
  _, res, _ = quick_run
  z, r = res["runs"]["zipccl"], res["runs"]["raw"]
  # planned: no conditional, so the smallest and the largest paths are the same
  assert z["sent"] == z["sent_fallback"] < r["sent"] == r["sent_fallback"]
  assert res["ratio"] == pytest.approx(r["sent"] / z["sent"])
  assert r["replans"] == 0


def test_mismatch_detection_sees_one_flipped_bit(example):
  a = {"w": np.arange(10, dtype=np.float32)}
  b = {"w": a["w"].copy()}
  assert example.first_mismatch(a, b) is None
  b["w"].view(np.uint32)[7] ^= 1
  assert example.first_mismatch(a, b).startswith("w[7]: 0x40e00000 vs 0x40e00001")


@pytest.fixture(scope="module")
def entropy_run(example, tmp_path_factory):
  """(exit status, results JSON, printed text) of a 3-step --quick --codec entropy
  run on the slot ladder (jax.jit)."""
  out = tmp_path_factory.mktemp("example_entropy") / "results.json"
  text = io.StringIO()
  with contextlib.redirect_stdout(text):
    status = example.main(["--quick", "--steps", "3", "--codec", "entropy", "--ladder",
                           "--no-progress", "--json", str(out)])
  return status, json.loads(out.read_text()), text.getvalue()


def test_entropy_codec_on_the_ladder_is_bit_identical(entropy_run):
  status, res, text = entropy_run
  assert status == 0, text
  assert res["codec"] == "entropy" and res["identical"] is True and res["planned"] is False
  assert set(res["runs"]) == {"entropy", "raw"}
  e, r = res["runs"]["entropy"], res["runs"]["raw"]
  assert len(e["losses"]) == 3
  _same_words(e["losses"], r["losses"])
  # the ladder's smallest rungs send less than raw, its raw rungs more (the agreement)
  assert e["sent"] < r["sent"] < e["sent_fallback"]
  assert "wire ratio (raw / entropy)" in text and "mean loss (entropy | raw)" in text


def _ladders(units, codec):
  """{unit: (gather rungs, reduce-scatter rungs)}, raw rows last: what the transport
  compiles for each unit's collectives (one bf16 row of `shard` elements each)."""
  import jax.numpy as jnp
  import zipccl_jax
  return {u.name: (zipccl_jax.codec_ladder(codec, jnp.bfloat16, u.shard) + (2 * u.shard,),
                   zipccl_jax.codec_ladder(codec, jnp.bfloat16, u.shard, all_to_all=True)
                   + (2 * u.shard,)) for u in units}


def _compiled_step(example, codec, planned):
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P
  import zipccl_jax
  from zipccl_jax._src import planned_slots
  cfg = example.Config(**example.QUICK)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), (example.AXIS,),
                           axis_types=(jax.sharding.AxisType.Auto,))
  units, buffers = example.init_model(cfg, 8)
  shards = {k: jax.device_put(v, NamedSharding(mesh, P(example.AXIS))) for k, v in buffers.items()}
  opt_state = jax.jit(example.make_optimizer(cfg).init)(shards)
  batch = jax.device_put(example.make_batches(example.load_corpus(), cfg, 8)[0],
                         NamedSharding(mesh, P(example.AXIS)))
  step = example.make_train_step(cfg, units, mesh, codec, opt_state)
  if planned:
    step = zipccl_jax.jit(step)
    for _ in range(planned_slots.MEASURE_STEPS):   # measures, then plans
      step(shards, opt_state, batch)
    return units, step.compiled(shards, opt_state, batch).as_text(), step
  return units, jax.jit(step).lower(shards, opt_state, batch).compile().as_text(), None


@pytest.mark.parametrize("codec", ["zipccl", "entropy"])
def test_ladder_step_moves_the_bytes_of_the_codec_ladders(example, codec):
  """The compiled ladder step's collectives equal a model built from the codec's
  ladders: per unit, an all-gather of one row per device and a reduce-scatter over
  an all-to-all of one row per destination, each with the agreement (an
  all-gather of int32[6]); plus the loss's all-reduce of one float32. Sent bytes
  per device: all-gather (n-1) x operand, all-to-all (n-1)/n x operand,
  all-reduce 2(n-1)/n x operand (hlo_wire_bytes' model)."""
  import zipccl_jax
  n = 8
  units, text, _ = _compiled_step(example, codec, planned=False)
  ladders = _ladders(units, codec)
  agree = (n - 1) * 24
  loss = 2 * (n - 1) / n * 4
  common = sum(2 * agree + (n - 1) * (g[0] + s[0]) for g, s in ladders.values()) + loss
  worst = sum(2 * agree + (n - 1) * (g[-1] + s[-1]) for g, s in ladders.values()) + loss
  hlo = zipccl_jax.hlo_wire_bytes(text)
  assert hlo.common_sent == pytest.approx(common, abs=1)
  assert hlo.fallback_sent == pytest.approx(worst, abs=1)
  assert len(hlo.conditionals) == 2 * len(units)


def test_planned_step_moves_one_collective_per_call_and_its_slots(example):
  """Planned: no conditional, one collective per unit and direction (+ the loss),
  each moving its site's planned slot."""
  import zipccl_jax
  n = 8
  units, text, step = _compiled_step(example, "zipccl", planned=True)
  hlo = zipccl_jax.hlo_wire_bytes(text)
  assert not hlo.conditionals and "conditional(" not in text
  sites = step.site_stats()
  assert len(sites) == 2 * len(units)
  assert all(s.slot_bytes is not None and s.used_bytes <= s.slot_bytes < s.raw_bytes
             for s in sites)
  assert hlo.common_sent == pytest.approx(
      sum((n - 1) * s.slot_bytes for s in sites) + 2 * (n - 1) / n * 4, abs=1)


def test_ladders_follow_the_chosen_codec(example):
  import jax.numpy as jnp
  import zipccl_jax
  from zipccl_jax._src import ladder as ladder_lib
  from zipccl_jax._src.codecs import entropy
  units, _ = example.init_model(example.Config(**example.QUICK), 8)
  for codec in ("zipccl", "entropy"):
    ladders = _ladders(units, codec)
    for u in units:
      gather, scatter = ladders[u.name]
      assert gather[-1] == scatter[-1] == 2 * u.shard
      low = (entropy.ladder_floor(jnp.bfloat16, u.shard) if codec == "entropy"
             else zipccl_jax.codecs.get("zipccl").min_nbytes(jnp.bfloat16, u.shard))
      start = -(-low // 128) * 128
      assert start in gather and start in scatter, (codec, u.name, gather)
      # the entropy codec's ladder also reaches below its floor (ladder_lib.LOW_RUNGS)
      below = (ladder_lib.LOW_RUNGS, ladder_lib.ALL_TO_ALL_LOW_RUNGS) if codec == "entropy" else (0, 0)
      assert gather.index(start) == below[0] and scatter.index(start) == below[1], (codec, gather)
      assert gather[:-1] == zipccl_jax.codec_ladder(codec, jnp.bfloat16, u.shard)
