// Part of the CPU entropy codec (entropy_cpu.cc, through entropy_cpu_decode.h): the
// stores that build a block's decode table (DecScratch::tab: uint64 entries, one per
// value of the next 11 bits of a stream; a code's region is the 2^(11 - length)
// entries after it, laid out in entropy_cpu_decode.h). Internal linkage, like the
// other parts (entropy_cpu_planes.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "entropy_cpu_planes.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

// Fills dst[0, cnt) with v, cnt a power of two or a multiple of 8. GCC
// vector types: 32-byte stores where the caller is compiled for AVX2.
typedef uint64_t u64x4 __attribute__((vector_size(32)));
EZ_INLINE void fill64(uint64_t* dst, uint32_t cnt, uint64_t v) {
  if (cnt < 4) {
    dst[0] = v;
    dst[cnt >> 1] = v;
    return;
  }
  const u64x4 v4 = {v, v, v, v};
  if (cnt == 4) {
    std::memcpy(dst, &v4, sizeof v4);
    return;
  }
  // 8 entries an iteration: half the loop overhead (the fills were ~9% of
  // decode time; runs of >= 8 fill most of a table on Gaussian data).
  for (uint32_t i = 0; i < cnt; i += 8) {
    std::memcpy(dst + i, &v4, sizeof v4);
    std::memcpy(dst + i + 4, &v4, sizeof v4);
  }
}

// dst[i] = b + src[i] for i < cnt, cnt 8 or a multiple of 16 (16 entries an
// iteration: four 32-byte adds and stores where the caller is compiled for AVX2).
EZ_INLINE void add_fill64(uint64_t* dst, const uint64_t* src, uint32_t cnt, uint64_t b) {
  const u64x4 b4 = {b, b, b, b};
  uint32_t i = 0;
  if (cnt & 8) {
    u64x4 v0, v1;
    std::memcpy(&v0, src, sizeof v0);
    std::memcpy(&v1, src + 4, sizeof v1);
    v0 += b4;
    v1 += b4;
    std::memcpy(dst, &v0, sizeof v0);
    std::memcpy(dst + 4, &v1, sizeof v1);
    i = 8;
  }
  // 16 entries, then 32 an iteration (the copies of whole regions, 32 to 512
  // entries, are most of a table's entries: half the loop overhead).
  const uint32_t step = cnt - i >= 32 && (cnt & 16) == 0 ? 32 : 16;
  for (; i < cnt; i += step) {
    u64x4 v0, v1, v2, v3;
    std::memcpy(&v0, src + i, sizeof v0);
    std::memcpy(&v1, src + i + 4, sizeof v1);
    std::memcpy(&v2, src + i + 8, sizeof v2);
    std::memcpy(&v3, src + i + 12, sizeof v3);
    v0 += b4;
    v1 += b4;
    v2 += b4;
    v3 += b4;
    std::memcpy(dst + i, &v0, sizeof v0);
    std::memcpy(dst + i + 4, &v1, sizeof v1);
    std::memcpy(dst + i + 8, &v2, sizeof v2);
    std::memcpy(dst + i + 12, &v3, sizeof v3);
    if (step == 32) {
      std::memcpy(&v0, src + i + 16, sizeof v0);
      std::memcpy(&v1, src + i + 20, sizeof v1);
      std::memcpy(&v2, src + i + 24, sizeof v2);
      std::memcpy(&v3, src + i + 28, sizeof v3);
      v0 += b4;
      v1 += b4;
      v2 += b4;
      v3 += b4;
      std::memcpy(dst + i + 16, &v0, sizeof v0);
      std::memcpy(dst + i + 20, &v1, sizeof v1);
      std::memcpy(dst + i + 24, &v2, sizeof v2);
      std::memcpy(dst + i + 28, &v3, sizeof v3);
    }
  }
}

// Runs of the table build, one call per code length (the symbols of one length
// take equal-sized regions, in canonical order): a loop over the symbols with the
// region size a constant per case (small regions were ~20 instructions of call
// and loop overhead each, more than their stores).
typedef uint64_t u64x2 __attribute__((vector_size(16)));

// nv regions of 2^lg entries, region i = v[i] repeated. Returns the end.
EZ_INLINE uint64_t* fill_runs(uint64_t* d, uint32_t lg, const uint64_t* v, uint32_t nv) {
  switch (lg) {
    case 0:
      for (uint32_t i = 0; i < nv; ++i) d[i] = v[i];
      return d + nv;
    case 1:
      for (uint32_t i = 0; i < nv; ++i, d += 2) {
        const u64x2 x = {v[i], v[i]};
        std::memcpy(d, &x, sizeof x);
      }
      return d;
    case 2:
      for (uint32_t i = 0; i < nv; ++i, d += 4) {
        const u64x4 x = {v[i], v[i], v[i], v[i]};
        std::memcpy(d, &x, sizeof x);
      }
      return d;
    case 3:
      for (uint32_t i = 0; i < nv; ++i, d += 8) {
        const u64x4 x = {v[i], v[i], v[i], v[i]};
        std::memcpy(d, &x, sizeof x);
        std::memcpy(d + 4, &x, sizeof x);
      }
      return d;
    default:
      for (uint32_t i = 0; i < nv; ++i, d += 1u << lg) fill64(d, 1u << lg, v[i]);
      return d;
  }
}

// nv regions of 2^lg entries, region i = src[0, 2^lg) + b + v[i] (the pair
// regions of one s2 length: the same third-symbol table, c1 + c2 added). Returns
// the end.
EZ_INLINE uint64_t* add_runs(uint64_t* d, uint32_t lg, const uint64_t* src, const uint64_t* v, uint32_t nv,
                             uint64_t b) {
  switch (lg) {
    case 0: {
      const uint64_t x = src[0] + b;
      for (uint32_t i = 0; i < nv; ++i) d[i] = x + v[i];
      return d + nv;
    }
    case 1: {
      u64x2 x;
      std::memcpy(&x, src, sizeof x);
      x += b;
      for (uint32_t i = 0; i < nv; ++i, d += 2) {
        const u64x2 y = x + v[i];
        std::memcpy(d, &y, sizeof y);
      }
      return d;
    }
    case 2: {
      u64x4 x;
      std::memcpy(&x, src, sizeof x);
      x += b;
      for (uint32_t i = 0; i < nv; ++i, d += 4) {
        const u64x4 y = x + v[i];
        std::memcpy(d, &y, sizeof y);
      }
      return d;
    }
    case 3: {
      u64x4 x0, x1;
      std::memcpy(&x0, src, sizeof x0);
      std::memcpy(&x1, src + 4, sizeof x1);
      x0 += b;
      x1 += b;
      for (uint32_t i = 0; i < nv; ++i, d += 8) {
        const u64x4 y0 = x0 + v[i], y1 = x1 + v[i];
        std::memcpy(d, &y0, sizeof y0);
        std::memcpy(d + 4, &y1, sizeof y1);
      }
      return d;
    }
    case 4: {
      u64x4 x0, x1, x2, x3;
      std::memcpy(&x0, src, sizeof x0);
      std::memcpy(&x1, src + 4, sizeof x1);
      std::memcpy(&x2, src + 8, sizeof x2);
      std::memcpy(&x3, src + 12, sizeof x3);
      x0 += b;
      x1 += b;
      x2 += b;
      x3 += b;
      for (uint32_t i = 0; i < nv; ++i, d += 16) {
        const u64x4 y0 = x0 + v[i], y1 = x1 + v[i], y2 = x2 + v[i], y3 = x3 + v[i];
        std::memcpy(d, &y0, sizeof y0);
        std::memcpy(d + 4, &y1, sizeof y1);
        std::memcpy(d + 8, &y2, sizeof y2);
        std::memcpy(d + 12, &y3, sizeof y3);
      }
      return d;
    }
    default:
      for (uint32_t i = 0; i < nv; ++i, d += 1u << lg) add_fill64(d, src, 1u << lg, b + v[i]);
      return d;
  }
}

}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
