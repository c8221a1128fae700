"""zipccl_jax.decide answers what the collectives do (policy="auto"), calibrated or not.

Uncalibrated it is the collectives' static rule (the dtype's default codec for rows
of at least AUTO_MIN_ROW_BYTES); the test compiles the collectives and reads which
codec's encoder the program calls, next to decide's answer for the same row.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc

N = 8


def _codec_in_program(mesh, collective, dtype, m, **kw):
  """The codec whose encoder the compiled collective calls for a local block of m
  elements (one row per peer), or None."""
  body = {"all_gather": lambda v: zc.compressed_all_gather(v, "x", tiled=True, **kw),
          "ppermute": lambda v: zc.compressed_ppermute(v, "x", [(i, (i + 1) % N)
                                                                for i in range(N)], **kw)}
  f = jax.jit(jax.shard_map(body[collective], mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  text = f.lower(jnp.zeros((N * m,), dtype)).compile().as_text()
  found = set(re.findall(r'custom_call_target="zipccl_(\w+)_encode"', text))
  assert len(found) <= 1, found
  return found.pop() if found else None


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("collective", ["all_gather", "ppermute"])
def test_uncalibrated_decide_matches_the_collectives(mesh8, dtype, collective):
  threshold = zc.AUTO_MIN_ROW_BYTES // np.dtype(dtype).itemsize
  for m in (1024, threshold - 128, threshold, 4 * threshold):
    ok, codec = zc.decide(collective, dtype, m, N)
    got = _codec_in_program(mesh8, collective, dtype, m)
    assert (codec if ok else None) == got, (collective, dtype, m, ok, codec, got)
  assert zc.decide(collective, dtype, 4 * threshold, N)[0] is True


def test_uncalibrated_decide_with_a_named_codec(mesh8):
  m = zc.AUTO_MIN_ROW_BYTES // 2
  assert zc.decide("all_gather", jnp.bfloat16, m, N, codecs=("zipccl",)) == (True, "zipccl")
  assert _codec_in_program(mesh8, "all_gather", jnp.bfloat16, m, codec="zipccl") == "zipccl"
  assert zc.decide("all_gather", jnp.bfloat16, m, 1) == (False, None)   # one peer: nothing to move
  assert zc.decide("all_gather", jnp.bfloat16, m, N, codecs=()) == (False, None)


def test_calibrated_decide_is_the_cost_model(tmp_path):
  """With a calibration, decide is zipccl_jax.costmodel.decide's answer."""
  cal = zc.costmodel.default_calibration()
  for m in (1024, 1 << 16, 1 << 22):
    assert zc.decide("psum", "bfloat16", m, N, cal) == zc.costmodel.decide(
        "psum", "bfloat16", m, N, cal)
  with pytest.raises(ValueError, match="collective must be one of"):
    zc.decide("gather", "bfloat16", 10, N)
