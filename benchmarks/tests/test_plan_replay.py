"""benchmarks/plan_replay.py: its replay of a record on scripted sizes (every number
checked by hand), and the suite end to end on the MoE example's shortest run."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import plan_replay

ROOT = Path(__file__).resolve().parents[2]


def test_replay_counts_slots_reruns_and_the_hindsight_bound(monkeypatch):
  """One site, rungs every 128 bytes up to a raw row of 1280: a measuring step (raw
  words), then 3 steps on a 640-byte slot, the third of which overflows (its slot and
  its raw re-run move), then 2 steps on a 768-byte slot."""
  monkeypatch.setattr(plan_replay, "WINDOW", 3)
  rungs, raw = [128 * u for u in range(1, 10)], 1280
  step = lambda plan, used: {"wrapper": 1, "plan": plan, "used": [used], "raw": [raw], "rungs": [rungs],
                             "wire_rows": [1]}
  log = [step(None, 4), step([640], 4), step([640], 5), step([640], 6), step([768], 6), step([768], 5),
         {"wrapper": 2, "plan": None, "used": [], "raw": [], "rungs": [], "wire_rows": []}]   # ignored
  r = plan_replay.replay(log)
  ladder = 512 + 512 + 640 + 768 + 768 + 640            # the rung at or above each used size
  planned = raw + 640 + 640 + (640 + raw) + 768 + 768    # the measuring step moves raw words
  hindsight = 3 * 640 + 3 * 768                          # windows [4, 4, 5] and [6, 6, 5]
  assert r["steps"] == 6 and r["measuring_steps"] == 1 and r["sites"] == 1
  assert r["wire_vs_ladder"] == planned / ladder
  assert r["hindsight_vs_ladder"] == hindsight / ladder
  assert (r["overflows"], r["plan_changes"]) == (1, 1)
  assert (r["overflow_steps"], r["change_steps"]) == ([4], [5])


def test_replay_weighs_each_site_by_the_rows_it_puts_on_the_wire():
  """Over 8 devices, a psum_scatter's all_to_all site and an all_gather site each put
  7 rows on the wire (7 of 8 rows sent; 1 row to 7 peers), a ppermute's 1: slots,
  rungs and raw rows count 7, 7 and 1 times."""
  rungs, raw = [128 * u for u in range(1, 10)], 1280
  step = lambda plan, used: {"wrapper": 1, "plan": plan, "used": used, "raw": [raw] * 3,
                             "rungs": [rungs] * 3, "wire_rows": [7, 7, 1]}
  log = [step(None, [4, 2, 3]), step([640, 384, 512], [4, 2, 3])]
  r = plan_replay.replay(log)
  planned = 15 * raw + 7 * 640 + 7 * 384 + 512
  assert r["wire_vs_ladder"] == planned / (2 * (7 * 512 + 7 * 256 + 384))
  assert r["planned_mib_per_step"] == planned / 2 / 2**20


def test_replan_runs_the_current_planner_on_recorded_sizes():
  """A record's sizes through the planner: MEASURE_STEPS measuring steps, a plan from
  them, an overflow where the sizes jump (re-planned, the step counted once), and the
  recorded sizes unchanged."""
  from zipccl_jax._src import planned_slots
  rungs, raw = [128 * u for u in range(1, 40)], 40 * 128
  sizes = [10] * 6 + [14] + [14] * 5
  log = [{"wrapper": 1, "plan": None, "used": [u], "raw": [raw], "rungs": [rungs], "wire_rows": [7]}
         for u in sizes]
  out = plan_replay.replan(log, step_s=1.0, compile_s=5.0)
  m = planned_slots.MEASURE_STEPS
  assert [e["used"] for e in out] == [[u] for u in sizes]
  assert all(e["plan"] is None for e in out[:m]) and out[m]["plan"] == [11 * 128]
  r = plan_replay.replay(out)
  assert (r["steps"], r["measuring_steps"]) == (len(sizes), m)
  assert r["overflow_steps"] == [7] and r["change_steps"] == [8]
  assert out[7]["plan"][0] >= 14 * 128


def test_plan_replay_suite_smoke(tmp_path):
  cmd = [sys.executable, str(ROOT / "benchmarks" / "plan_replay.py"), "--examples", "moe",
         "--steps", "8", "--out", str(tmp_path)]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert res.returncode == 0, res.stderr[-3000:]
  doc = json.loads((tmp_path / "plan_replay.json").read_text())
  moe = doc["results"]["moe"]
  # the harness's measuring call of its own, then the 8 training steps, the first of
  # which measure on
  from zipccl_jax._src import planned_slots
  assert moe["steps"] == 1 + 8
  assert moe["measuring_steps"] >= planned_slots.MEASURE_STEPS and moe["sites"] > 0
  assert moe["wire_vs_ladder"] >= 1 and moe["hindsight_vs_ladder"] >= 1
  assert "| moe |" in (tmp_path / "plan_replay.md").read_text()
