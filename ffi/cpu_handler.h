// What the CPU FFI handlers of both codecs (ffi/codec_cpu.cc, ffi/entropy_cpu.cc)
// share beyond handler_common.h: the huge-page hint on large outputs.
#pragma once

#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "env.h"

namespace zipccl {
namespace cpu_handler {

// XLA:CPU allocates every call's outputs afresh; glibc gives allocations over its
// mmap threshold (<= 32 MiB) a new mapping each time, so a handler would first-touch
// its whole output in 4 KiB pages: 16,384 page faults for a 64 MiB output, more
// time than the codec (benchmarks/results/codec_*.md). Asking for transparent huge
// pages on the 2 MiB-aligned interior of a large output cuts that ~512-fold. A hint
// only: errors are ignored, and ZIPCCL_NO_HUGEPAGES (docs/env.md) turns it off.
inline void advise_hugepages(void* p, uint64_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uint64_t kHuge = 2ull << 20;
  if (nbytes < 4 * kHuge || env::no_hugepages()) return;
  const uint64_t a = ((uint64_t)p + kHuge - 1) & ~(kHuge - 1);
  const uint64_t b = ((uint64_t)p + nbytes) & ~(kHuge - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#endif
}

}  // namespace cpu_handler
}  // namespace zipccl
