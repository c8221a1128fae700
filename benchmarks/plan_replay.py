"""Planned slots against the ladder's rungs over whole training runs of the examples.

    python benchmarks/plan_replay.py [--examples dp,moe,fsdp] [--steps 200] [--quick]
    -> benchmarks/results/plan_replay.md (+ .json)

Runs each example under `zipccl_jax.jit` (DP and MoE: the entropy codec on 2
simulated devices; FSDP: 8) and records, per step and call site, the plan the
step ran and the largest used size of its rows (the sizes every process agreed
on). From that record, per example:

* wire: the bytes the planned slots moved (a step that overflowed moved its slots,
  then its raw re-run) over the bytes the ladder would have moved (per step and
  site, the first rung at or above the used size: what `jax.jit` takes), each
  slot, rung or raw row counted once per row the site puts on the links
  (`planned_sites.wire_rows`: over 8 devices an all_gather's row goes to 7 peers, a
  psum_scatter's all-to-all sends 7 of its 8 rows);
* the bound no plan held for a window can beat: a slot set in hindsight to each 25-step
  window's largest size (rounded up to 128 bytes, as a planned slot is), over the
  same ladder bytes (sizes that swing from step to step cost a static slot their
  swing);
* overflows (steps re-run) and plan changes (each one compile).

The record needs no change to the library: a process started by this script
(`--record`) wraps `Planned.__call__` before it runs the example. Steps run on
shared-memory CPU devices: this measures sizes, not time.

A step's sizes do not depend on the plan (its results do not), so a record also
answers what another planner would have done with the same run, in seconds:

    python benchmarks/plan_replay.py --keep DIR        # train, keep the records
    python benchmarks/plan_replay.py --replan DIR      # the current planner on them
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__:
  from benchmarks import common
else:  # run as a script: its folder is on sys.path
  import common  # type: ignore[no-redef]

# The examples' runs: the configs netns_train.py times (DP and FSDP: width 1024, 2
# blocks, 1 x 32 tokens per device; MoE: its own config).
RUNS = {
    "dp": ["train_dp.py", "--codecs", "planned-entropy", "--devices", "2", "--d-model", "1024",
           "--layers", "2", "--heads", "8", "--seq-len", "32", "--batch-per-device", "1",
           "--log-every", "0"],
    "moe": ["train_moe.py", "--codecs", "planned-entropy", "--devices", "2", "--log-every", "0"],
    "fsdp": ["train_fsdp.py", "--codec", "entropy", "--d-model", "1024", "--layers", "2",
             "--heads", "8", "--seq-len", "32", "--no-analyze", "--no-progress"],
}
WINDOW = 25   # steps per window of the hindsight bound (planned_slots.SHRINK_WINDOW)


def record(out: str, argv: list) -> None:
  """Runs the example `argv` with every zipccl_jax.jit call recorded into `out`."""
  from zipccl_jax._src import planned
  log = []
  call = planned.Planned.__call__

  def recorded(self, *args, **kwargs):
    # the plan on every step (no timed steps of raw words), each plan from the step
    # after it was made (not compiled ahead: the shared-memory steps' time is not the
    # measured one): the suite measures slots
    self._compare_raw = self._compile_ahead = False   # pylint: disable=protected-access
    state = self._state_for(args, kwargs)   # pylint: disable=protected-access
    before = state.plan
    result = call(self, *args, **kwargs)
    log.append({"wrapper": id(self), "plan": list(before) if before is not None else None,
                "used": list(state.used or []), "raw": [s[2] for s in state.sites or ()],
                "rungs": [list(s[1]) for s in state.sites or ()],
                "wire_rows": [s[0][-1] for s in state.sites or ()]})
    return result

  planned.Planned.__call__ = recorded
  sys.argv = argv
  sys.path.insert(0, str(Path(argv[0]).parent))
  try:
    runpy.run_path(argv[0], run_name="__main__")
  except SystemExit as e:
    if e.code not in (None, 0):
      raise
  finally:
    with open(out, "w") as f:
      json.dump(log, f)


def _rung(used_units: int, rungs: list, raw: int) -> int:
  """The ladder's rung for a used size (units of 128 B): the first rung at or above
  it; the raw row above the ladder or for a site that did not run (-1)."""
  used = used_units * 128
  return next((r for r in rungs if r >= used), raw) if used_units >= 0 else raw


def _slot(used_units: int, rungs: list, raw: int) -> int:
  """The slot the planner gives a used size with no headroom (the raw row when none)."""
  from zipccl_jax._src import planned_slots
  slot = planned_slots.slot_for(used_units, tuple(rungs), 0.0)
  return raw if slot == planned_slots.RAW else slot


def _training_steps(log: list) -> list:
  """The entries of the training step's wrapper (the last one with sites)."""
  wrapper = [e["wrapper"] for e in log if e["raw"]][-1]
  return [e for e in log if e["wrapper"] == wrapper]


def replay(log: list) -> dict:
  """The record of one example's run -> wire ratios, overflows and plan changes."""
  steps = _training_steps(log)
  raws, rungs = steps[-1]["raw"], steps[-1]["rungs"]
  n = len(raws)
  sent = steps[-1]["wire_rows"]
  raw_b = sum(r * w for r, w in zip(raws, sent))
  planned_b = ladder_b = 0
  overflow_steps, change_steps = [], []
  used_by_step, prev = [], None
  measured = 0
  for e in steps:
    used = e["used"][:n]
    if len(used) < n:
      continue
    used_by_step.append(used)
    ladder_b += sum(sent[k] * _rung(u, rungs[k], raws[k]) for k, u in enumerate(used))
    if e["plan"] is None:   # a measuring step (before the first plan, or a probe): raw words
      planned_b += raw_b
      measured += 1
      continue
    plan = e["plan"]
    over = any(p > 0 and u * 128 > p for p, u in zip(plan, used))
    planned_b += sum(sent[k] * (raws[k] if p < 0 else p) for k, p in enumerate(plan))
    planned_b += raw_b if over else 0
    if over:
      overflow_steps.append(len(used_by_step))
    if prev is not None and plan != prev:
      change_steps.append(len(used_by_step))
    prev = plan
  bound = 0
  for s in range(0, len(used_by_step), WINDOW):
    window = used_by_step[s:s + WINDOW]
    for k in range(n):
      top = max(u[k] for u in window)
      bound += len(window) * sent[k] * _slot(top, rungs[k], raws[k])
  return {"sites": n, "steps": len(used_by_step), "measuring_steps": measured,
          "wire_vs_ladder": planned_b / max(ladder_b, 1),
          "hindsight_vs_ladder": bound / max(ladder_b, 1), "overflows": len(overflow_steps),
          "overflow_steps": overflow_steps, "plan_changes": len(change_steps),
          "change_steps": change_steps,
          "planned_mib_per_step": planned_b / max(len(used_by_step), 1) / 2**20}


def replan(log: list, step_s: float, compile_s: float) -> list:
  """The record `log` replayed through the current planner, for `replay`: a
  zipccl_jax.jit whose program is scripted to report each step's recorded sizes (an
  overflow's re-run: the same step's; the sizes do not depend on the plan, as the
  steps' results do not), with the clocks the shrink rule reads at step_s per step
  and compile_s per compile. No training: seconds per record."""
  import jax.numpy as jnp
  import zipccl_jax as zc
  steps = _training_steps(log)
  raws, rungs = steps[-1]["raw"], steps[-1]["rungs"]
  rows = steps[-1]["wire_rows"]
  n = len(raws)
  sizes = [e["used"][:n] for e in steps if len(e["used"]) >= n]
  sites = [(("replayed", "", "", (), (), False, r), tuple(g), raw) for r, g, raw in zip(rows, rungs, raws)]
  at = [0]

  def run(state, plan, args, kwargs):
    state.sites = sites
    state.window_s, state.compile_s = step_s * (len(state.window) + 1), compile_s
    return args[0], sizes[at[0]], [0] * n

  f = zc.jit(lambda v: v, compare_raw=False, compile_ahead=False)   # plans switch at once
  f._run = run   # pylint: disable=protected-access
  x = jnp.zeros(1)
  out = []
  for k, used in enumerate(sizes):
    at[0] = k
    before = f._state_for((x,), {}).plan   # pylint: disable=protected-access
    f(x)
    out.append({"wrapper": 1, "plan": None if before is None else list(before), "used": used,
                "raw": raws, "rungs": rungs, "wire_rows": rows})
  return out


def run_example(name: str, steps: int, tmp: str) -> dict:
  out = os.path.join(tmp, f"{name}.json")
  script, *args = RUNS[name]
  argv = [str(ROOT / "examples" / script), *args, "--steps", str(steps)]
  common.log(f"{name}: {' '.join(argv)}")
  proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--record", out, "--", *argv],
                        cwd=str(ROOT), capture_output=True, text=True)
  if proc.returncode != 0 or not os.path.exists(out):
    raise RuntimeError(f"plan_replay: {name} failed:\n{proc.stderr[-3000:]}")
  with open(out) as f:
    return replay(json.load(f))


def _at(steps: list) -> str:
  """"3: 2, 11, 19" (how many, then at which steps)."""
  return f"{len(steps)}: {', '.join(map(str, steps))}" if steps else "0"


def report(results: dict, args, what: str = "") -> str:
  info = common.machine_info()
  lines = [f"# Planned slots vs the ladder's rungs in training ({what or info['date']})", "",
           f"{info['cpu']}, {info['usable_cores']} cores; jax {info['versions'].get('jax')}. "
           f"Each example trains {args.steps} steps under `zipccl_jax.jit` (entropy codec); "
           "the ladder's bytes are, per step and call site, the first rung at or above the "
           "size every process agreed on; a site's bytes count once per row it puts on the "
           "links (N - 1 for an all_gather or an all_to_all over N devices). "
           "Shared-memory CPU devices: sizes, not time.", "",
           "| example | sites | steps (measuring) | planned / ladder | hindsight bound / ladder | overflows "
           "(re-runs): at steps | plan changes (compiles): at steps | planned MiB/step |",
           "|---|---:|---:|---:|---:|---|---|---:|"]
  for name, r in results.items():
    lines.append(f"| {name} | {r['sites']} | {r['steps']} ({r['measuring_steps']}) | "
                 f"**{r['wire_vs_ladder']:.3f}** | "
                 f"{r['hindsight_vs_ladder']:.3f} | {_at(r['overflow_steps'])} | {_at(r['change_steps'])} | "
                 f"{r['planned_mib_per_step']:.2f} |")
  lines += ["", "Steps count from 1, the first step; the measuring steps (before the first plan, "
            "and probes of raw sites) move raw words. "
            "planned / ladder counts a re-run step's slots and its raw re-run. The hindsight "
            f"bound takes, per {WINDOW}-step window and site, the slot of the window's largest "
            "size (the next multiple of 128 bytes): no plan held for a window moves less.", "",
            "Reproduce: `python benchmarks/plan_replay.py " + (
                f"--replan {args.replan}`" if getattr(args, "replan", None) else
                f"--examples {','.join(results)} --steps {args.steps}`")]
  return "\n".join(lines)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["--record"]:
    record(argv[1], argv[3:])   # --record OUT -- SCRIPT ARGS...
    return 0
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--examples", default="dp,moe,fsdp")
  ap.add_argument("--steps", type=int, default=200)
  ap.add_argument("--quick", action="store_true", help="30 steps (a smoke run)")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  ap.add_argument("--keep", metavar="DIR", help="write the runs' records (<example>.json) to DIR")
  ap.add_argument("--replan", metavar="DIR",
                  help="no training: replay the records in DIR (from --keep) through the current "
                       "planner and print the table (a what-if of a planning change)")
  ap.add_argument("--step-s", type=float, default=0.9,
                  help="--replan: the seconds of a step the shrink rule sees (default: a step "
                       "over 1 Gbit/s)")
  ap.add_argument("--compile-s", type=float, default=5.0,
                  help="--replan: the seconds of a compile the shrink rule sees")
  args = ap.parse_args(argv)
  if args.quick:
    args.steps = 30
  names = [x.strip() for x in args.examples.split(",") if x.strip()]
  bad = [x for x in names if x not in RUNS]
  if bad or not names:
    ap.error(f"--examples must name some of {sorted(RUNS)}, got {args.examples!r}")
  if args.replan:
    results = {}
    for name in names:
      path = Path(args.replan) / f"{name}.json"
      if path.exists():
        results[name] = replay(replan(json.loads(path.read_text()), args.step_s, args.compile_s))
    if not results:
      ap.error(f"--replan: no record of {names} in {args.replan}")
    print(report(results, args, f"replanned from {args.replan} (step {args.step_s} s, "
                                f"compile {args.compile_s} s)"))
    return 0
  if args.keep:
    os.makedirs(args.keep, exist_ok=True)
    results = {name: run_example(name, args.steps, args.keep) for name in names}
  else:
    with tempfile.TemporaryDirectory() as tmp:
      results = {name: run_example(name, args.steps, tmp) for name in names}
  common.write_report(args.out, "plan_replay", report(results, args),
                      {"steps": args.steps, "machine": common.machine_info(), "results": results})
  return 0


if __name__ == "__main__":
  sys.exit(main())
