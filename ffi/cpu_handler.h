// What the CPU FFI handlers of both codecs (ffi/window_cpu.cc, ffi/entropy_cpu.cc)
// share beyond handler_common.h: the huge-page hint on large outputs and the
// zeroing of a row's unused tail.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if defined(__x86_64__)
#include <emmintrin.h>
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

constexpr uint64_t kStreamZeroMin = 1u << 20;  // tails this large are zeroed with NT stores

// Zeroes [p, p + nbytes) with stores: non-temporal ones when large. Nothing
// reads a row's unused tail back here, so NT stores skip the read-for-ownership
// of each line and do not evict the blocks just written (this VM: 12 GB/s
// instead of 5 GB/s for plain stores on 4 KiB pages).
inline void zero_stores(uint8_t* p, uint64_t nbytes) {
#if defined(__x86_64__)
  if (nbytes >= kStreamZeroMin) {
    const uint64_t head = (16 - ((uintptr_t)p & 15)) & 15;
    std::memset(p, 0, head);
    uint8_t* q = p + head;
    uint8_t* const e = p + nbytes;
    const __m128i z = _mm_setzero_si128();
    for (; e - q >= 64; q += 64) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(q), z);
      _mm_stream_si128(reinterpret_cast<__m128i*>(q + 16), z);
      _mm_stream_si128(reinterpret_cast<__m128i*>(q + 32), z);
      _mm_stream_si128(reinterpret_cast<__m128i*>(q + 48), z);
    }
    _mm_sfence();
    std::memset(q, 0, e - q);
    return;
  }
#endif
  std::memset(p, 0, nbytes);
}

// Zeroes [p, p + nbytes), the unused tail of a row (about 1/3 of max_nbytes on
// Gaussian bf16: 22 MB for 64 MiB of input), without first-touching pages that
// the kernel can zero-fill instead. XLA:CPU hands the encoder a freshly mapped
// payload buffer every call (glibc mmaps allocations this large), and the first
// write to each page costs a fault in which the kernel zeroes it: for the tail
// that was ~1/3 of the fresh-buffer cost, with our own stores on top.
//
// Safety: only whole pages that mincore reports non-resident are left to the
// kernel, and only after two madvise calls on exactly that run succeed:
//   1. MADV_FREE, used as a type check: it applies to private anonymous memory
//      only and fails with EINVAL on file-backed, shared (shmem, SysV), hugetlb
//      and locked mappings, whose absent pages would read back their contents;
//   2. MADV_DONTNEED, whose documented effect on private anonymous mappings is
//      that later accesses get zero-fill-on-demand pages, whatever the page held
//      before (swapped out, in the swap cache, lazily freed by step 1, or
//      collapsed into a huge page by khugepaged in between).
// Everything else (resident pages, the partial pages at both ends, any run where
// a call fails) is zeroed with stores. A reused heap buffer is resident: no
// madvise at all. (One assumption: nobody serves the buffer's missing pages
// through userfaultfd, which would replace the zero fill.)
inline void zero_tail(uint8_t* p, uint64_t nbytes) {
#if defined(__linux__) && defined(MADV_FREE) && defined(MADV_DONTNEED)
  static const uint64_t page = [] {
    const long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? (uint64_t)v : 0;
  }();
  if (nbytes >= kStreamZeroMin && page && !(page & (page - 1)) && nbytes >= 4 * page) {
    uint8_t* const a = reinterpret_cast<uint8_t*>(((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1));
    uint8_t* const b = reinterpret_cast<uint8_t*>(((uintptr_t)p + nbytes) & ~(uintptr_t)(page - 1));
    zero_stores(p, (uint64_t)(a - p));
    // Whole pages [a, b) (b > a: nbytes >= 4 pages) in chunks of up to kChunk
    // pages (a fixed buffer: nothing to allocate here).
    constexpr uint64_t kChunk = 4096;
    unsigned char res[kChunk];
    for (uint8_t* c = a; c < b;) {
      const uint64_t np = std::min<uint64_t>(kChunk, (uint64_t)(b - c) / page);
      if (mincore(c, np * page, res) != 0) {
        zero_stores(c, np * page);
      } else {
        uint64_t i = 0;
        while (i < np) {
          const bool in = res[i] & 1;
          uint64_t j = i + 1;
          while (j < np && (bool)(res[j] & 1) == in) ++j;
          uint8_t* const r = c + i * page;
          const uint64_t rn = (j - i) * page;
          if (in || madvise(r, rn, MADV_FREE) != 0 || madvise(r, rn, MADV_DONTNEED) != 0) zero_stores(r, rn);
          i = j;
        }
      }
      c += np * page;
    }
    zero_stores(b, (uint64_t)(p + nbytes - b));
    return;
  }
#endif
  zero_stores(p, nbytes);
}

}  // namespace cpu_handler
}  // namespace zipccl
