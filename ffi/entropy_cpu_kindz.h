// Part of the CPU entropy codec (entropy_cpu.cc): kind Z, the compaction of the words
// with exponent bits (encoder) and the expansion of their raw values back to the
// elements (decoder). Internal linkage, like the other parts (entropy_cpu_planes.h).
#pragma once

#include <cstdint>

#include "entropy_cpu_planes.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

// ---------------------------------------------------------------------------------
// Kind Z: compaction of the words with e != 0 (encoder) and expansion of the raw
// values to their elements (decoder), 8 u16 lanes at a time by byte shuffles.

// For an 8-bit lane mask m (bit i = lane i kept): kCompress[m] moves the kept lanes
// to lanes 0 .. popcount(m) - 1 in order; kExpand[m] moves lanes 0 .. popcount(m) -
// 1 to the kept lanes in order and zeroes the others (shuffle byte 0x80).
struct ZShuffles {
  alignas(16) uint8_t compress[256][16];
  alignas(16) uint8_t expand[256][16];
  constexpr ZShuffles() : compress(), expand() {
    for (uint32_t m = 0; m < 256; ++m) {
      uint32_t k = 0;
      for (uint32_t i = 0; i < 8; ++i) {
        compress[m][2 * i] = compress[m][2 * i + 1] = 0x80;
        expand[m][2 * i] = expand[m][2 * i + 1] = 0x80;
      }
      for (uint32_t i = 0; i < 8; ++i) {
        if (!(m >> i & 1)) continue;
        compress[m][2 * k] = (uint8_t)(2 * i);
        compress[m][2 * k + 1] = (uint8_t)(2 * i + 1);
        expand[m][2 * i] = (uint8_t)(2 * k);
        expand[m][2 * i + 1] = (uint8_t)(2 * k + 1);
        ++k;
      }
    }
  }
};
constexpr ZShuffles kZShuffles{};

#if EZ_X86
// Kind Z's compaction: the words x[j] with (x[j] & 0x7FFF) != 0 (e != 0 in a
// Z-valid block), in order, to out[0, nz); returns nz. Writes out[0, len) only
// (a 16-byte store at k <= j ends by j + 8 <= len), garbage past nz.
EZ_TARGET_FAST uint32_t compact_nonzero_fast(const uint16_t* x, uint32_t len, uint16_t* out) {
  const __m128i mag = _mm_set1_epi16(0x7FFF), zero = _mm_setzero_si128();
  const __m256i mag2 = _mm256_set1_epi16(0x7FFF), zero2 = _mm256_setzero_si256();
  uint32_t k = 0, j = 0;
  // 16 lanes a step: one mask for both halves (PEXT keeps one of movemask's two
  // bits per 16-bit lane), then two 8-lane shuffles.
  for (; j + 16 <= len; j += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    const __m256i isz = _mm256_cmpeq_epi16(_mm256_and_si256(v, mag2), zero2);
    const uint32_t m = _pext_u32(~(uint32_t)_mm256_movemask_epi8(isz), 0x55555555u);
    const uint32_t m0 = m & 0xFF, m1 = m >> 8;
    const __m128i s0 = _mm_load_si128(reinterpret_cast<const __m128i*>(kZShuffles.compress[m0]));
    const __m128i s1 = _mm_load_si128(reinterpret_cast<const __m128i*>(kZShuffles.compress[m1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_shuffle_epi8(_mm256_castsi256_si128(v), s0));
    k += (uint32_t)_mm_popcnt_u32(m0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_shuffle_epi8(_mm256_extracti128_si256(v, 1), s1));
    k += (uint32_t)_mm_popcnt_u32(m1);
  }
  for (; j + 8 <= len; j += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j));
    const __m128i isz = _mm_cmpeq_epi16(_mm_and_si128(v, mag), zero);
    const uint32_t m = ~(uint32_t)_mm_movemask_epi8(_mm_packs_epi16(isz, isz)) & 0xFF;
    const __m128i sh = _mm_load_si128(reinterpret_cast<const __m128i*>(kZShuffles.compress[m]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_shuffle_epi8(v, sh));
    k += (uint32_t)_mm_popcnt_u32(m);
  }
  for (; j < len; ++j) {
    out[k] = x[j];
    k += (x[j] & 0x7FFF) != 0;
  }
  return k;
}

// Kind Z's expansion: y[j] = (sv[j] & keep) | (the next raw value if sv[j] has
// exponent bits, else 0), raw values raw[0, ..) in order. Reads up to 8 words past
// the last raw value used (16-byte loads; their lanes are shuffled out).
EZ_TARGET_FAST void expand_nonzero_fast(const uint16_t* sv, uint32_t len, const uint16_t* raw, uint16_t emask,
                                        uint16_t keep, uint16_t* y) {
  const __m128i em = _mm_set1_epi16((short)emask), kp = _mm_set1_epi16((short)keep), zero = _mm_setzero_si128();
  const __m256i em2 = _mm256_set1_epi16((short)emask), kp2 = _mm256_set1_epi16((short)keep);
  const __m256i zero2 = _mm256_setzero_si256();
  uint32_t k = 0, j = 0;
  // 16 lanes a step (as in compact_nonzero_fast).
  for (; j + 16 <= len; j += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sv + j));
    const __m256i isz = _mm256_cmpeq_epi16(_mm256_and_si256(v, em2), zero2);
    const uint32_t m = _pext_u32(~(uint32_t)_mm256_movemask_epi8(isz), 0x55555555u);
    const uint32_t m0 = m & 0xFF, m1 = m >> 8;
    const __m128i s0 = _mm_load_si128(reinterpret_cast<const __m128i*>(kZShuffles.expand[m0]));
    const __m128i s1 = _mm_load_si128(reinterpret_cast<const __m128i*>(kZShuffles.expand[m1]));
    const __m128i r0 = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + k)), s0);
    k += (uint32_t)_mm_popcnt_u32(m0);
    const __m128i r1 = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + k)), s1);
    k += (uint32_t)_mm_popcnt_u32(m1);
    const __m256i r = _mm256_inserti128_si256(_mm256_castsi128_si256(r0), r1, 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), _mm256_or_si256(_mm256_and_si256(v, kp2), r));
  }
  for (; j + 8 <= len; j += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sv + j));
    const __m128i isz = _mm_cmpeq_epi16(_mm_and_si128(v, em), zero);
    const uint32_t m = ~(uint32_t)_mm_movemask_epi8(_mm_packs_epi16(isz, isz)) & 0xFF;
    const __m128i sh = _mm_load_si128(reinterpret_cast<const __m128i*>(kZShuffles.expand[m]));
    const __m128i r = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + k)), sh);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j), _mm_or_si128(_mm_and_si128(v, kp), r));
    k += (uint32_t)_mm_popcnt_u32(m);
  }
  for (; j < len; ++j) {
    const uint16_t v = sv[j];
    const uint16_t nzj = (uint16_t)-(uint16_t)((v & emask) != 0);  // 0xFFFF or 0
    y[j] = (uint16_t)((v & keep) | (raw[k] & nzj));
    k += nzj & 1;
  }
}

// The number of sv[0, len) with exponent bits (sv & emask != 0), 32 a step.
EZ_TARGET_FAST uint32_t count_nonzero_fast(const uint16_t* sv, uint32_t len, uint16_t emask) {
  const __m256i em = _mm256_set1_epi16((short)emask), zero = _mm256_setzero_si256();
  uint32_t zeros = 0, j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sv + j));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sv + j + 16));
    // packs keeps each lane's 0 / -1 as a byte (in another order: a count only)
    const __m256i z = _mm256_packs_epi16(_mm256_cmpeq_epi16(_mm256_and_si256(a, em), zero),
                                         _mm256_cmpeq_epi16(_mm256_and_si256(b, em), zero));
    zeros += (uint32_t)_mm_popcnt_u32((uint32_t)_mm256_movemask_epi8(z));
  }
  uint32_t nz = j - zeros;
  for (; j < len; ++j) nz += (sv[j] & emask) != 0;
  return nz;
}
#endif

// Portable forms (branch-free: the zeros of ReLU data fall at random).
inline uint32_t compact_nonzero(const uint16_t* x, uint32_t len, uint16_t* out) {
  uint32_t k = 0;
  for (uint32_t j = 0; j < len; ++j) {
    out[k] = x[j];
    k += (x[j] & 0x7FFF) != 0;
  }
  return k;
}
inline void expand_nonzero(const uint16_t* sv, uint32_t len, const uint16_t* raw, uint16_t emask, uint16_t keep,
                           uint16_t* y) {
  uint32_t k = 0;
  for (uint32_t j = 0; j < len; ++j) {
    const uint16_t v = sv[j];
    const uint16_t nzj = (uint16_t)-(uint16_t)((v & emask) != 0);
    y[j] = (uint16_t)((v & keep) | (raw[k] & nzj));
    k += nzj & 1;
  }
}

// Kind Z's join: sv[0, len) holds the decoded symbols' value bits (and code
// lengths in the low nibble, which the raw bits own); the nz elements with e != 0
// take the nz raw values of the planes in[0, r) in order, the others (+-0) none.
// r != raw_bytes(J, nz) is a stream error (the planes do not match the symbols);
// nothing past in + r is read. The planes are unpacked into zraw[0, nz) (kind J's
// join with no symbol bits; zraw has room for nz + 8 words), then spread by a
// running count.
template <DtypeCode D, bool Fast>
EZ_INLINE int32_t zero_join(const uint8_t* in, uint32_t r, uint32_t len, const uint16_t* sv, uint16_t* zraw,
                            uint16_t* y) {
  constexpr Traits t = traits<D>();
  constexpr uint16_t emask = (uint16_t)t.cmask();  // symbols >= 2 (c != 0) have raw values
  uint32_t nz = 0;
#if EZ_X86
  if (Fast) nz = count_nonzero_fast(sv, len, emask);
  else
#endif
    for (uint32_t j = 0; j < len; ++j) nz += (sv[j] & emask) != 0;
  if (r != t.raw_bytes(kKindJ, nz)) return kDecBadStream;
  or_raw<D, kKindJ, Fast>(in, nz, sv, zraw, 0);  // zraw[k] = the k-th raw value
  // Words past nz are read (masked off): defined values for them.
  std::memset(zraw + nz, 0, 2 * 8);
#if EZ_X86
  if (Fast) {
    expand_nonzero_fast(sv, len, zraw, emask, (uint16_t)~kLenMask, y);
    return kDecOk;
  }
#endif
  expand_nonzero(sv, len, zraw, emask, (uint16_t)~kLenMask, y);
  return kDecOk;
}

}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
