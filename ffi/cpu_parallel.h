// CPU helpers shared by the two CPU codecs (ffi/codec_cpu.cc, ffi/entropy_cpu.cc):
// the thread count for a row (env::num_threads(): ZIPCCL_NUM_THREADS, default the
// hardware concurrency, at most 256), a fork-join parallel_for, and the huge-page
// hint for large outputs. Rows are split by whole blocks; small rows stay on the
// calling thread (thread start-up costs ~20 us, more than encoding 64 K elements).
#pragma once

#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "env.h"

namespace zipccl {
namespace par {

// Threads for `units` units of work when each thread should get >= min_per_thread.
inline int threads_for(unsigned long long units, unsigned long long min_per_thread) {
  unsigned long long by_size = units / (min_per_thread ? min_per_thread : 1);
  if (by_size < 1) by_size = 1;
  const unsigned long long hw = (unsigned long long)env::num_threads();
  return (int)(by_size < hw ? by_size : hw);
}

// Runs fn(t) for t in [0, nthreads): t = 0 on the calling thread.
template <typename F>
void parallel_for(int nthreads, F&& fn) {
  if (nthreads <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(nthreads - 1);
  for (int t = 1; t < nthreads; ++t) pool.emplace_back([&fn, t] { fn(t); });
  fn(0);
  for (auto& th : pool) th.join();
}

// XLA:CPU allocates every call's outputs afresh; glibc gives allocations over its
// mmap threshold (<= 32 MiB) a new mapping each time, so a handler would first-touch
// its whole output in 4 KiB pages: 16,384 page faults for a 64 MiB output, more
// time than the codec (benchmarks/results/codec_*.md). Asking for transparent huge
// pages on the 2 MiB-aligned interior of a large output cuts that ~512-fold. A hint
// only: errors are ignored, and ZIPCCL_NO_HUGEPAGES=1 turns it off.
inline void advise_hugepages(void* p, unsigned long long nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr unsigned long long kHuge = 2ull << 20;
  if (nbytes < 4 * kHuge) return;
  if (env::no_hugepages()) return;
  const unsigned long long a = ((unsigned long long)p + kHuge - 1) & ~(kHuge - 1);
  const unsigned long long b = ((unsigned long long)p + nbytes) & ~(kHuge - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#endif
}

}  // namespace par
}  // namespace zipccl
