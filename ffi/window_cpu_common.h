// Part of the CPU window codec (window_cpu.cc and window_cpu_decode.h, the only files
// that include it): what its encoder and decoder share -- threading, plane-byte
// packing, the checksum's byte sums, the AVX2 probe and the plane section spans.
#pragma once

#include "cpu_parallel.h"
#include "window_format.h"

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define ZIPCCL_X86 1
#endif

namespace zipccl {
namespace cpu {
namespace {

constexpr uint64_t kParallelMinElems = 1u << 20;  // below this one thread is faster
constexpr uint64_t kMinBlocksPerThread = 64;       // 128 K elements

// Eight 0/1 bytes (byte k = element k's bit) -> one plane byte, bit k LSB first.
inline uint32_t pack8(uint64_t v01) { return (uint32_t)((v01 * 0x0102040810204080ull) >> 56); }

// One plane byte -> eight 0/1 bytes (inverse of pack8).
inline uint64_t spread8(uint32_t m) {
  uint64_t x = ((uint64_t)m * 0x0101010101010101ull) & 0x8040201008040201ull;
  return ((x + 0x7F7F7F7F7F7F7F7Full) >> 7) & 0x0101010101010101ull;
}

// Checksum contribution of nbytes (multiple of 4) at row byte offset byte_off (multiple
// of 4): sum (2j+1) w_j over its u32 words (window_format.h: checksum_span). Split into
// sum w and sum i*w (32x32->64 products) so that it vectorizes.
inline uint64_t cs_bytes(const uint8_t* p, uint64_t byte_off, uint64_t nbytes) {
  uint64_t s0 = 0, s1 = 0;
  const uint32_t cnt = (uint32_t)(nbytes / 4);
  for (uint32_t i = 0; i < cnt; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * (uint64_t)i, 4);
    s0 += w;
    s1 += (uint64_t)w * (uint64_t)i;
  }
  return (2 * (byte_off / 4) + 1) * s0 + 2 * s1;
}

// Larger spans (escape section, table): in chunks so the local index stays 32-bit.
inline uint64_t cs_span(const uint8_t* p, uint64_t byte_off, uint64_t nbytes) {
  uint64_t acc = 0;
  constexpr uint64_t kChunk = 1ull << 30;
  for (uint64_t o = 0; o < nbytes; o += kChunk)
    acc += cs_bytes(p + o, byte_off + o, std::min(kChunk, nbytes - o));
  return acc;
}

// Threads for a row of n elements (whole blocks per thread; cpu_parallel.h).
int num_threads_for(uint64_t n) {
  return n < kParallelMinElems ? 1 : par::threads_for(num_blocks(n), kMinBlocksPerThread);
}

using par::parallel_for;

#if ZIPCCL_X86
bool have_avx2() {
  static const bool v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                        __builtin_cpu_supports("popcnt");
  return v;
}
#endif

// Checksummed plane bytes of block b (of nb): P planes of 256 bytes for a block
// before the last; the last block's planes and the section's padding up to esc_off
// (as the last block's raw bytes take the raw section's padding).
inline uint64_t plane_span(const Layout& L, uint32_t P, uint64_t b, uint64_t nb) {
  const uint64_t start = L.plane_off + b * P * kPlaneBytes;
  return b + 1 == nb ? L.esc_off - start : (uint64_t)P * kPlaneBytes;
}

}  // namespace
}  // namespace cpu
}  // namespace zipccl
