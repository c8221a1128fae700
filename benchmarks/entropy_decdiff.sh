#!/bin/bash
# Differential corruption test of the entropy codec's CPU decoder: BASE_REV's
# ffi/entropy_cpu.cc against this tree's on corrupted rows (benchmarks/entropy_decdiff.cc):
# same status and same words on every trial, with and without the checksum fixed up.
# Usage: benchmarks/entropy_decdiff.sh BASE_REV [trials per row = 300] [sizes = "1 4097 100003"]
# (ZIPCCL_DISABLE_SIMD=1 checks the portable paths; RUNNER="valgrind -q --error-exitcode=3"
# checks every read, slowly: use few trials.) Needs g++, git and the .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?base revision}
TRIALS=${2:-300}
SIZES=${3:-"1 4097 100003"}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. benchmarks/entropy_base.sh
build_against_base "$BASE" O2 entropy_decdiff "$TMP/entropy_decdiff"
write_rows "$TMP/rows" $SIZES
ZIPCCL_NUM_THREADS=${ZIPCCL_NUM_THREADS:-1} ${RUNNER:-} "$TMP/entropy_decdiff" "$TRIALS" "$TMP"/rows/*
