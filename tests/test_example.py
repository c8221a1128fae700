"""Smoke test of examples/train_fsdp.py: a few FSDP steps, compressed vs raw, bit-identical.

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
  spec = importlib.util.spec_from_file_location("train_fsdp", EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up while it executes
  spec.loader.exec_module(module)
  yield module
  sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def quick_run(example, tmp_path_factory):
  """(exit status, results JSON, printed text) of a 3-step --quick run of the window
  codec (the entropy codec, the default, has `entropy_run` below)."""
  out = tmp_path_factory.mktemp("example") / "results.json"
  text = io.StringIO()
  with contextlib.redirect_stdout(text):
    status = example.main(["--quick", "--steps", "3", "--codec", "zipccl", "--no-progress",
                           "--json", str(out)])
  return status, json.loads(out.read_text()), text.getvalue()


def test_compressed_and_raw_training_are_bit_identical(quick_run):
  status, res, text = quick_run
  assert status == 0, text
  assert res["identical"] is True
  z, r = res["runs"]["zipccl"], res["runs"]["raw"]
  assert len(z["losses"]) == 3
  zw = np.asarray(z["losses"], np.float32).view(np.uint32)
  rw = np.asarray(r["losses"], np.float32).view(np.uint32)
  np.testing.assert_array_equal(zw, rw)
  assert "bit-identical" in text and "summary" in text


def test_the_codec_round_trips_in_the_analysis_table(quick_run):
  _, _, text = quick_run
  table = [line for line in text.splitlines()
           if line.strip().startswith(("weight ", "gradient ", "activation "))]
  assert len(table) >= 5
  assert all(line.rstrip().endswith("yes") for line in table), "\n".join(table)


def test_compressed_run_sends_fewer_bytes(quick_run):
  _, res, _ = quick_run
  z, r = res["runs"]["zipccl"], res["runs"]["raw"]
  # Both totals were checked against the compiled HLO inside the example.
  assert z["bytes_common"] < r["bytes_common"]
  assert r["bytes_common"] == r["bytes_worst"] == pytest.approx(r["bytes_per_step"])
  assert z["bytes_common"] <= z["bytes_per_step"] <= z["bytes_worst"]
  assert res["ratio"] == pytest.approx(r["bytes_per_step"] / z["bytes_per_step"])
  assert r["fallbacks"] == {"gather": 0, "scatter": 0}


def test_mismatch_detection_sees_one_flipped_bit(example):
  a = {"w": np.arange(10, dtype=np.float32)}
  b = {"w": a["w"].copy()}
  assert example.first_mismatch(a, b) is None
  b["w"].view(np.uint32)[7] ^= 1
  assert example.first_mismatch(a, b).startswith("w[7]: 0x40e00000 vs 0x40e00001")


@pytest.fixture(scope="module")
def entropy_run(example, tmp_path_factory):
  """(exit status, results JSON, printed text) of a 3-step --quick --codec entropy run."""
  out = tmp_path_factory.mktemp("example_entropy") / "results.json"
  text = io.StringIO()
  with contextlib.redirect_stdout(text):
    status = example.main(["--quick", "--steps", "3", "--codec", "entropy", "--no-progress",
                           "--json", str(out)])
  return status, json.loads(out.read_text()), text.getvalue()


def test_entropy_codec_run_is_bit_identical_and_matches_the_hlo(entropy_run):
  # train() raises unless the wire model built from the entropy codec's ladders
  # (its ladder_floor, not min_nbytes) equals the compiled HLO's collectives.
  status, res, text = entropy_run
  assert status == 0, text
  assert res["codec"] == "entropy" and res["identical"] is True
  assert set(res["runs"]) == {"entropy", "raw"}
  e, r = res["runs"]["entropy"], res["runs"]["raw"]
  assert len(e["losses"]) == 3
  np.testing.assert_array_equal(np.asarray(e["losses"], np.float32).view(np.uint32),
                                np.asarray(r["losses"], np.float32).view(np.uint32))
  assert e["bytes_common"] < r["bytes_common"]
  assert e["bytes_common"] <= e["bytes_per_step"] <= e["bytes_worst"]
  assert res["ratio"] == pytest.approx(r["bytes_per_step"] / e["bytes_per_step"])
  # the printed tables name the codec and its count (raw blocks, not escapes)
  assert "wire ratio (raw / entropy)" in text and "mean loss (entropy | raw)" in text
  assert "raw blocks (of 4096 elements): weights" in text and "escape rate" not in text
  table = [line for line in text.splitlines()
           if line.strip().startswith(("weight ", "gradient ", "activation "))]
  assert len(table) >= 5
  assert all(line.rstrip().endswith("yes") for line in table), "\n".join(table)


def test_ladders_follow_the_chosen_codec(example):
  import jax.numpy as jnp
  import zipccl_jax
  from zipccl_jax._src import ladder as ladder_lib
  from zipccl_jax._src.codecs import entropy
  units, _ = example.init_model(example.Config(**example.QUICK), 8)
  for codec in ("zipccl", "entropy"):
    ladders = example.unit_capacities(units, codec=codec)
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
