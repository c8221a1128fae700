# Sourced by entropy_ab.sh and entropy_same.sh: build_against_base BASE_REV OPT MAIN OUT
# compiles BASE_REV's ffi/entropy_cpu.cc (namespace and FFI handler symbols renamed,
# benchmarks/entropy_base.h), this tree's, and benchmarks/MAIN.cc with -OPT, and
# links them into OUT. Needs g++, git and the project's .venv (XLA FFI headers).
build_against_base() {
  local base=$1 opt=$2 main=$3 out=$4 dir
  dir=$(dirname "$out")
  git archive "$base" ffi | tar -x -C "$dir"
  local inc
  inc=$(.venv/bin/python -c "import jax; print(jax.ffi.include_dir())")
  g++ -std=c++17 "-$opt" -c -I"$dir/ffi" -isystem "$inc" -Dzipccl=zbase -DZipcclEntropyEncodeCpu=ZbaseEnc \
    -DZipcclEntropyDecodeCpu=ZbaseDec "$dir/ffi/entropy_cpu.cc" -o "$dir/base.o"
  g++ -std=c++17 "-$opt" -c -Iffi -isystem "$inc" ffi/entropy_cpu.cc -o "$dir/new.o"
  g++ -std=c++17 "-$opt" -c -Iffi -isystem "$inc" "benchmarks/$main.cc" -o "$dir/main.o"
  g++ "$dir/main.o" "$dir/base.o" "$dir/new.o" -o "$out" -lpthread
}

# write_rows DIR SIZE...: one row file per (dtype, distribution of tests/test_entropy.py,
# size) in DIR, little-endian u16 words named <dist>_<n>.<bf16|fp16> (read_row in
# entropy_base.h reads them).
write_rows() {
  local dir=$1
  shift
  mkdir -p "$dir"
  .venv/bin/python - "$dir" "$@" <<'PY'
import sys
import numpy as np
from tests.test_entropy import BF16, DISTS, F16, make
out, sizes = sys.argv[1], [int(s) for s in sys.argv[2:]]
for dtype, ext in ((BF16, "bf16"), (F16, "fp16")):
  for dist in DISTS:
    for k, n in enumerate(sizes):
      make(dist, n, dtype, seed=7 + k).view(np.uint16).astype("<u2").tofile(f"{out}/{dist}_{n}.{ext}")
PY
}
