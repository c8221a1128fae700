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
