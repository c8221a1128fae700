// The environment knobs of the native code (docs/env.md lists every variable the
// project reads). Each is read once per process, on first use: a function-local
// static is initialised exactly once even when several threads (XLA's, the
// codec's) get there together, and the hot paths then read a constant instead of
// calling getenv (not thread-safe against setenv, and a linear scan of environ).
// Host code only.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <thread>

namespace zipccl {
namespace env {

// ZIPCCL_NUM_THREADS: threads for one large row (default: hardware threads), 1..256.
inline int num_threads() {
  static const int v = [] {
    const char* s = getenv("ZIPCCL_NUM_THREADS");
    int n = s ? atoi(s) : 0;
    if (n <= 0) n = (int)std::thread::hardware_concurrency();
    return std::max(1, std::min(n, 256));
  }();
  return v;
}

// ZIPCCL_DISABLE_SIMD (set: the portable block code instead of the AVX2 kernels).
inline bool simd_disabled() {
  static const bool v = getenv("ZIPCCL_DISABLE_SIMD") != nullptr;
  return v;
}

// ZIPCCL_NO_HUGEPAGES (set: no madvise(MADV_HUGEPAGE) on large outputs).
inline bool no_hugepages() {
  static const bool v = getenv("ZIPCCL_NO_HUGEPAGES") != nullptr;
  return v;
}

// ZIPCCL_CUDA_GROUPS: 1, 2 or 4 groups of 8 elements per thread in the CUDA tile
// kernels; 0 when unset or anything else (the kernels' default then).
inline int cuda_groups() {
  static const int v = [] {
    const char* s = getenv("ZIPCCL_CUDA_GROUPS");
    return (s && s[0] && !s[1] && (s[0] == '1' || s[0] == '2' || s[0] == '4')) ? s[0] - '0' : 0;
  }();
  return v;
}

}  // namespace env
}  // namespace zipccl
