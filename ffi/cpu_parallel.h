// Threads for the CPU codecs: the thread count (ZIPCCL_NUM_THREADS, default the
// hardware concurrency, at most 256) and a fork-join parallel_for. Rows are split
// by whole blocks; small rows stay on the calling thread (thread start-up costs
// ~20 us, more than encoding 64 K elements).
#pragma once

#include <thread>
#include <vector>

#include "env.h"

namespace zipccl {
namespace par {

// Threads allowed by the environment (ZIPCCL_NUM_THREADS, read once: ffi/env.h).
inline int max_threads() { return env::num_threads(); }

// Threads for `units` units of work when each thread should get >= min_per_thread.
inline int threads_for(unsigned long long units, unsigned long long min_per_thread) {
  unsigned long long by_size = units / (min_per_thread ? min_per_thread : 1);
  if (by_size < 1) by_size = 1;
  const unsigned long long hw = (unsigned long long)max_threads();
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

}  // namespace par
}  // namespace zipccl
