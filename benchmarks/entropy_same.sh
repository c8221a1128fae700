#!/bin/bash
# Byte identity of the entropy codec's CPU encoder: BASE_REV's ffi/entropy_cpu.cc
# against this tree's on varied bf16 and fp16 rows (tests/test_entropy.py's
# distributions: Gaussian, Laplace, heavy tails, GELU, softmax, mixed scales, ReLU,
# zeros, constants, random bits, subnormals, specials, skewed streams, -ReLU (-0),
# mixed-sign zeros, all -0, ReLU with subnormals: kind Z) at several
# sizes, whole max_nbytes rows compared (benchmarks/entropy_same.cc).
# Usage: benchmarks/entropy_same.sh BASE_REV [sizes = "1 4097 100003 1048576 4194305"]
# (ZIPCCL_DISABLE_SIMD=1 checks the portable paths.) Needs g++, git and the .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?base revision}
SIZES=${2:-"1 4097 100003 1048576 4194305"}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. benchmarks/entropy_base.sh
build_against_base "$BASE" O2 entropy_same "$TMP/entropy_same"
write_rows "$TMP/rows" $SIZES
ZIPCCL_NUM_THREADS=${ZIPCCL_NUM_THREADS:-1} "$TMP/entropy_same" "$TMP"/rows/*
