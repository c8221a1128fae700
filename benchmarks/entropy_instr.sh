#!/bin/bash
# Instructions per element of the entropy codec's CPU row encoder and decoder
# (valgrind --tool=callgrind, one thread), independent of machine load.
# Usage: benchmarks/entropy_instr.sh [n = 2097152] [dtype 1 bf16 / 2 fp16] [gauss / relu / skew]
# (ZIPCCL_DISABLE_SIMD=1 measures the portable path.) Needs g++, valgrind and the
# project's .venv (for the XLA FFI headers).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2097152}
DT=${2:-1}
DATA=${3:-gauss}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
INC=$(.venv/bin/python -c "import jax; print(jax.ffi.include_dir())")
g++ -std=c++17 -O3 -g -Wall -Wno-unused-parameter -Iffi -isystem "$INC" benchmarks/entropy_instr.cc \
  ffi/entropy_cpu.cc -o "$TMP/entropy_instr" -lpthread
ZIPCCL_NUM_THREADS=1 "$TMP/entropy_instr" "$N" 5 "$DT" "$DATA"
for f in encode_row decode_row; do
  ZIPCCL_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$f" \
    --toggle-collect="zipccl::ent::cpu::${f}*" "$TMP/entropy_instr" "$N" 1 "$DT" "$DATA" >/dev/null 2>"$TMP/err.$f"
  ir=$(grep -E "^(summary|totals):" "$TMP/cg.$f" | head -1 | awk '{print $2}')
  awk -v f="$f" -v ir="$ir" -v n="$N" 'BEGIN { printf "%s: %d instructions, %.2f per element\n", f, ir, ir / n }'
done
