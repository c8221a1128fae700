"""benchmarks/planned.py end to end at its smallest settings: it runs, writes its
report, and the planned programs it measures are exact (its own bookkeeping)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_planned_suite_smoke(tmp_path):
  cmd = [sys.executable, str(ROOT / "benchmarks" / "planned.py"), "--layers", "1", "--leaves", "3",
         "--rounds", "1", "--steps", "1", "--state-mib", "4", "--out", str(tmp_path)]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert res.returncode == 0, res.stderr[-3000:]
  doc = json.loads((tmp_path / "planned.json").read_text())
  assert set(doc["compile"]) == {"fsdp 1 layers", "dp psum 3 leaves, buckets (default)",
                                 "dp psum 3 leaves, bucket_bytes=0"}
  assert all(w["planned"] >= w["ladder"] * 0.99 for w in doc["wire"])   # slot >= the rung
  # the same update donated and kept, under either allocator: the same bits, both timed
  assert set(doc["donation_s"]) == {"default", "tuned"}
  for d in doc["donation_s"].values():
    assert d["same_bits"] is True and d["donated"] > 0 and d["kept"] > 0
  assert "| planned |" in (tmp_path / "planned.md").read_text() or "planned" in res.stdout
