#!/bin/bash
# A/B timing of the entropy codec's CPU row encoder/decoder: a base revision
# against this tree, in one process (benchmarks/entropy_ab.cc), one thread.
# Usage: benchmarks/entropy_ab.sh BASE_REV [n = 33554432] [rounds = 8] [reps = 5] [dtype 1 bf16 / 2 fp16]
#   [fresh 0 / 1: a newly mapped output buffer every call, as through jax.jit]
# (ZIPCCL_DISABLE_SIMD=1 times the portable paths.) Needs g++, git and the
# project's .venv (for the XLA FFI headers).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?base revision}
N=${2:-33554432}
ROUNDS=${3:-8}
REPS=${4:-5}
DT=${5:-1}
FRESH=${6:-0}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The base's namespace and FFI handler symbols are renamed so both link into one binary.
. benchmarks/entropy_base.sh
build_against_base "$BASE" O3 entropy_ab "$TMP/entropy_ab"
ZIPCCL_NUM_THREADS=1 "$TMP/entropy_ab" "$N" "$ROUNDS" "$REPS" "$DT" "$FRESH"
