"""benchmarks/netns_compare.py: the repeatability of netns grids.

The comparison is checked on made-up runs whose answers are known: the spread of
each variant, whether a cell's fastest variant is stable, and the ceiling of any
static policy (a cell admits a choice only if one variant is within the tolerance
of the fastest in every run).
"""
from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import netns_compare as nc


def _run(times: dict, auto: dict | None = None, args=None) -> dict:
  """A netns_bench result doc: times[(mib, collective)] = {variant: seconds}."""
  rows = []
  for (mib, coll), t in times.items():
    row = dict(procs=2, link="1", mib=mib, collective=coll, data="gaussian", rounds=5,
               times=dict(t))
    if auto and (mib, coll) in auto:
      row["auto"] = auto[(mib, coll)]
      row["auto_over_best"] = t[auto[(mib, coll)]] / min(t.values())
    rows.append(row)
  return dict(date="2026-12-02T00:00:00", machine=dict(cpu="test", cores=2, jax="x", load=0.5),
              args=dict(grid="2:1", links=["1"], rounds=5, **(args or {})),
              codecs=["raw", "entropy"], rows=rows)


def test_compare_spread_stability_and_ceiling():
  a = _run({(1, "psum"): dict(raw=1.00, entropy=0.70),        # entropy clearly faster
            (1, "ppermute"): dict(raw=1.00, entropy=0.98),    # a tie: both admissible
            (0.25, "psum"): dict(raw=1.00, entropy=0.80)},    # flips in run 2
           auto={(1, "psum"): "entropy", (1, "ppermute"): "raw", (0.25, "psum"): "entropy"})
  b = _run({(1, "psum"): dict(raw=1.10, entropy=0.70),
            (1, "ppermute"): dict(raw=0.99, entropy=1.00),
            (0.25, "psum"): dict(raw=0.70, entropy=0.80)},
           auto={(1, "psum"): "entropy", (1, "ppermute"): "entropy", (0.25, "psum"): "entropy"})
  res = nc.compare([a, b], 0.05)
  assert res["variants"] == ["raw", "entropy"]
  one, small = res["sizes"][1], res["sizes"][0.25]
  assert one["cells"] == 2 and one["admits"] == 2 and one["same_fastest"] == 1
  assert one["spread"]["raw"]["max"] == pytest.approx(0.10)
  assert one["spread"]["raw"]["beyond"] == 1 and one["spread"]["entropy"]["beyond"] == 0
  assert one["auto_hits"] == [2, 2] and one["auto_cells"] == [2, 2]
  # the 256 KiB cell: raw 1.43x entropy in run 1, entropy 1.14x raw in run 2
  assert small["admits"] == 0 and small["same_fastest"] == 0
  assert small["auto_hits"] == [1, 0]
  assert small["examples"][0]["ms"] == [{"raw": 1000.0, "entropy": 800.0},
                                        {"raw": 700.0, "entropy": 800.0}]


def test_compare_cli(tmp_path):
  a = _run({(1, "psum"): dict(raw=1.0, entropy=0.7)})
  b = _run({(1, "psum"): dict(raw=1.0, entropy=0.72)}, args=dict(pin="off"))
  pa, pb = tmp_path / "a.json", tmp_path / "b.json"
  pa.write_text(json.dumps(a))
  pb.write_text(json.dumps(b))
  assert nc.main([str(pa), str(pb), "--tag", "t", "--out", str(tmp_path)]) == 0
  text = (tmp_path / next(p.name for p in tmp_path.glob("netns_compare_t.md"))).read_text()
  assert "| 2 x 1 | 1 |" in text and "1 of 1" in text
  assert "arguments differ" in text and "pin" in text          # not the same grid: said
  has_mpl = importlib.util.find_spec("matplotlib") is not None
  assert any(tmp_path.glob("netns_compare_t.png")) == has_mpl
  with pytest.raises(SystemExit):
    nc.main([str(pa)])                                          # one run: nothing to compare
  (tmp_path / "bad.json").write_text("{}")
  with pytest.raises(SystemExit, match="not a netns_bench result"):
    nc.main([str(pa), str(tmp_path / "bad.json")])
