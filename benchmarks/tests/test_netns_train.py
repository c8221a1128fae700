"""benchmarks/netns_train.py: its cost breakdown and its replot, on made-up numbers."""
from __future__ import annotations

import pytest


def test_netns_train_breakdown_arithmetic():
  """C + wire + codec of benchmarks/netns_train.py, on made-up numbers."""
  from benchmarks import netns_train as nt
  assert nt.parse_rate("1gbit") == 1e9 / 8 and nt.parse_rate("500mbit") == 500e6 / 8
  assert nt.parse_rate("125mbps") == 125e6 and nt.parse_rate("none") is None
  mib = 2**20
  res = {"procs": 2,
         "variants": {"raw": {"median_ms": 1000.0, "sent_bytes": 50 * mib},
                      "zipccl": {"median_ms": 900.0, "sent_bytes": 35 * mib,
                                 "codec_bytes": {"encoded": 75e6, "decoded": 100e6}}},
         "unshaped": {"variants": {"raw": {"median_ms": 200.0}, "zipccl": {"median_ms": 260.0}}}}
  b = nt.breakdown_row(res, 1e9 / 8, {"encode_Bps": 2.5e9, "decode_Bps": 5e9})
  wire_raw, wire_zip, codec = 2 * 50 * mib / 125e6, 2 * 35 * mib / 125e6, 0.03 + 0.02
  assert b["w_raw"] == pytest.approx(wire_raw) and b["w_zip"] == pytest.approx(wire_zip)
  assert b["codec"] == pytest.approx(codec)
  assert b["pred_raw"] == pytest.approx(0.2 + wire_raw)
  assert b["pred_zip"] == pytest.approx(0.2 + wire_zip + codec)
  assert b["meas_ratio"] == pytest.approx(0.9)
  assert b["bound"] == pytest.approx((wire_zip + codec) / wire_raw)
  assert b["unshaped_extra"] == pytest.approx(0.06)
  del res["unshaped"]
  assert nt.breakdown_row(res, 1e9 / 8, {"encode_Bps": 1, "decode_Bps": 1}) is None


def test_netns_train_replot(tmp_path):
  """--replot draws an earlier result next to its JSON; a file that is not one is refused."""
  import importlib.util
  import json
  from benchmarks import netns_train as nt
  row = {"procs": 2, "example": "train_dp", "variants": {
      c: {"median_ms": t, "p25_ms": t * 0.99, "p75_ms": t * 1.01}
      for c, t in (("raw", 100.0), ("entropy", 80.0), ("zipccl", 85.0))}}
  res = tmp_path / "train_x.json"
  res.write_text(json.dumps({"rate": "1gbit", "procs": [2, 4], "pin": True, "rows": [row]}))
  has_mpl = importlib.util.find_spec("matplotlib") is not None
  assert nt.main(["--replot", str(res)]) == (0 if has_mpl else 1)
  assert (tmp_path / "train_x.png").exists() == has_mpl
  bad = tmp_path / "bad.json"
  bad.write_text("[]")
  with pytest.raises(SystemExit, match="not a netns_train result"):
    nt.main(["--replot", str(bad)])


def test_netns_train_lists_the_plan_or_raw_comparisons():
  """The report names each zipccl_jax.jit variant's comparisons of its plan with raw
  words (from the examples' JSON), and nothing when none ran."""
  from benchmarks import netns_train as nt
  row = {"example": "train_moe", "variants": {
      "raw": {"median_ms": 30.0},
      "planned-auto": {"median_ms": 31.0, "comparisons": [[57, 0.0389, 0.0352, 0.0021, "raw"]]}}}
  assert nt._comparisons([row])[2:] == [   # pylint: disable=protected-access
      "- train_moe planned-auto: at step 57, 38.9 ms a planned step vs 35.2 ms raw, paired "
      "difference +2.10 ms -> raw", ""]
  del row["variants"]["planned-auto"]["comparisons"]
  assert nt._comparisons([row]) == []   # pylint: disable=protected-access


def test_netns_train_lists_the_steps_timed_and_left_out():
  """Under the table, each example's timed steps, and the steps a variant's median left
  out (another variant compiling ahead), saying so when they were all of them."""
  from benchmarks import netns_train as nt
  row = {"example": "train_moe", "steps": 100, "warmup": 60, "variants": {
      "raw": {"timed_steps": 31}, "planned-auto": {"timed_steps": 40},
      "lax": {"timed_steps": 0}, "old": {}}}
  assert nt._timing([row]) == [   # pylint: disable=protected-access
      "- train_moe: median over steps 61-100; left out (another variant compiling ahead on "
      "the same cores): raw 9, lax 40 (all: the median keeps them)", ""]
  row["variants"] = {"raw": {"timed_steps": 40}}
  assert nt._timing([row]) == ["- train_moe: median over steps 61-100", ""]   # pylint: disable=protected-access


def test_netns_train_ladder_columns_read_the_first_ladder_variant():
  """'ladder taken / raw' and 'ladder fallbacks' come from the first of zipccl,
  entropy, auto the run has (the grid runs entropy), named in the cell."""
  from benchmarks import netns_train as nt
  entropy = {"wire_bytes_mean": 30.0, "wire_raw_bytes_mean": 40.0, "fallback_steps": 2}
  auto = {"wire_bytes_mean": 10.0, "wire_raw_bytes_mean": 40.0, "fallback_steps": 0}
  cells = nt._ladder_cells   # pylint: disable=protected-access
  assert cells({"raw": {}, "auto": auto, "entropy": entropy}, 100) == ("0.750 (entropy)", "2/100")
  assert cells({"raw": {}, "auto": auto}, 100) == ("0.250 (auto)", "0/100")
  assert cells({"raw": {}, "entropy": {"fallback_steps": 0}}, 50) == ("-", "0/50")
  assert cells({"raw": {}, "planned-entropy": entropy}, 100) == ("-", "-")


def test_netns_train_ratio_cells_carry_their_intervals():
  """A ratio cell is the ratio of the medians with its interval when the examples'
  JSON has one (to raw; a planned variant's to its ladder twin), the ratio alone
  otherwise."""
  from benchmarks import netns_train as nt
  row = {"variants": {
      "raw": {"median_ms": 40.0},
      "entropy": {"median_ms": 30.0, "vs_raw_interval": [0.74, 0.76]},
      "planned-entropy": {"median_ms": 33.0, "vs_raw_interval": [0.81, 0.84],
                          "vs_ladder_interval": [1.08, 1.12], "ladder_twin": "entropy"},
      "lax": {"median_ms": 80.0}}}
  cell = nt._ratio_cell   # pylint: disable=protected-access
  assert cell(row, "entropy") == "**0.750** (0.740-0.760)"
  assert cell(row, "planned-entropy", "entropy") == "**1.100** (1.080-1.120)"
  assert cell(row, "lax") == "**2.000**"
  assert cell(row, "auto") == "**-**"
