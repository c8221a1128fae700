"""The slot ladder (zipccl_jax/_src/ladder.py): rungs close together and static, the
all-to-all's ladder the gather's, low starts and long ladders respaced uniformly, no
ladder for a row that cannot shrink. Pure Python: integer arithmetic on sizes.
"""
from __future__ import annotations

import numpy as np
import pytest

from zipccl_jax._src import ladder as ladder_lib


@pytest.mark.parametrize("min_nbytes, raw", [(128, 16384), (90_112, 131_072), (5_760, 8_192),
                                             (700_000, 1_048_576), (3 << 30, 4 << 30)])
def test_ladder_rungs_are_close_and_static(min_nbytes, raw):
  rungs = ladder_lib.ladder(min_nbytes, raw)
  assert rungs and rungs[0] == -(-min_nbytes // 128) * 128
  assert all(r % 128 == 0 for r in rungs) and rungs[-1] < raw
  assert list(rungs) == sorted(set(rungs))
  assert len(rungs) <= ladder_lib.MAX_RUNGS == 32
  if min_nbytes >= 4096:   # real codecs: 1% apart near min_nbytes, then 5%
    steps = list(zip(rungs, rungs[1:]))
    assert all(b <= max(a * 1.01, a + 128) for a, b in steps[:ladder_lib.FINE_RUNGS - 1])
    assert all(b <= max(a * 1.05, a + 128) for a, b in steps)
    assert raw <= max(rungs[-1] * 1.05, rungs[-1] + 128) + 128
  assert isinstance(rungs[-1], int)   # Python ints: exact above 2 GiB


def test_all_to_all_ladder_is_the_gather_ladder():
  """All-to-all rungs compile to no kernel on CPU now (N - 1 permutes, row_ops.a2a_slot):
  they get the gathers' 1% ladder (they had 8 rungs 2% apart, then 5%, at most 12)."""
  raw = 131_072
  full, a2a = ladder_lib.ladder(90_112, raw), ladder_lib.ladder(90_112, raw, all_to_all=True)
  assert a2a == full and len(a2a) > 12
  assert all(b <= max(a * 1.01, a + 128) for a, b in zip(a2a[:24], a2a[1:24]))   # 1% at the bottom
  assert a2a[-1] < raw and all(b <= a * 1.05 for a, b in zip(a2a, a2a[1:]))
  assert ladder_lib.ladder(5_760, 8_192, all_to_all=True, below=4_000) == ladder_lib.ladder(5_760, 8_192, below=4_000)


@pytest.mark.parametrize("raw", [16_384, 114_176, 1 << 20])
@pytest.mark.parametrize("all_to_all", [False, True])
def test_a_ladder_that_starts_low_is_respaced_uniformly(all_to_all, raw):
  """From 0.625 x raw (the entropy codec's bf16 floor) the ladder (32 rungs, all-to-all
  rows too) fits as it is and bounds the slack over every band of used sizes (the
  mean slot / used - 1 over the band stays under 2.5%). A ladder that does not fit
  is respaced uniformly: test_a_too_long_ladder_is_respaced_uniformly."""
  rungs = ladder_lib.ladder(raw * 5 // 8, raw, all_to_all=all_to_all)
  steps = [b / a for a, b in zip(rungs, rungs[1:])] + [raw / rungs[-1]]
  assert len(rungs) <= 32 and max(steps) <= 1.05, steps   # 24 at 1% then 5% fit in 32
  for lo, hi in ((0.64, 0.72), (0.66, 0.80), (0.72, 0.85)):
    used = np.linspace(lo * raw, hi * raw, 200)
    slack = [next((r for r in rungs if r >= u), raw) / u - 1 for u in used]
    assert np.mean(slack) < 0.025, (lo, hi, np.mean(slack))


@pytest.mark.parametrize("all_to_all", [False, True])
def test_a_too_long_ladder_is_respaced_uniformly(all_to_all):
  """From 0.25 x raw 24 rungs at 1% and 5% above need ~47 rungs: one uniform growth,
  the smallest in steps of 0.1% that fits in 32, spaces the whole range."""
  raw = 1 << 20
  rungs = ladder_lib.ladder(raw // 4, raw, all_to_all=all_to_all)
  steps = [b / a for a, b in zip(rungs, rungs[1:])]
  assert 30 <= len(rungs) <= 32 and rungs[0] == raw // 4, len(rungs)
  assert max(steps) - min(steps) < 0.002 and max(steps) < 1.05, steps   # uniform
  assert raw / rungs[-1] <= max(steps) + 0.001


def test_ladder_of_a_row_that_cannot_shrink_is_empty():
  assert ladder_lib.ladder(8192, 8192) == () and ladder_lib.ladder(9000, 8192) == ()
