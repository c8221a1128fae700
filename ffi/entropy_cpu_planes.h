// Part of the CPU entropy codec (entropy_cpu.cc, the only file that includes it): the
// ISA selection (baseline vs AVX2/BMI2, chosen at run time), the block constants and
// checksum, the raw byte and packed planes (kind Z: entropy_cpu_kindz.h).
// Internal linkage: one translation unit, split by section to keep files readable.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "entropy_format.h"
#include "env.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {


static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the CPU codec assumes a little-endian host");

// The block codecs are compiled twice: for the baseline ISA and with AVX2/BMI2
// (shlx/shrx instead of 3-uop variable shifts, wider vectors for the byte planes),
// chosen at run time (no -march flags: the module runs on any x86-64 or aarch64).
#define EZ_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__)
#define EZ_X86 1
#define EZ_TARGET_FAST __attribute__((target("avx2,bmi,bmi2,lzcnt,popcnt,movbe")))
// MOVBE (a byte-swapping load/store: one instruction for each big-endian bit-stream
// read and write) is read from CPUID directly: GCC 12's __builtin_cpu_supports
// does not report it.
inline bool have_movbe() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_MOVBE);
}
inline bool have_fast_isa() {
  static const bool v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && have_movbe() &&
                        !env::simd_disabled();
  return v;
}
#endif

constexpr uint64_t kParallelMinElems = 1u << 20;  // below this one thread is faster
constexpr uint64_t kMinBlocksPerThread = 32;       // 128 K elements
constexpr uint32_t kMaxAreaBytes = kBlock * kMaxLen / 8;  // largest bit area of a block (5632)
constexpr uint32_t kSymsPerRefill = 5;  // lookups per refill: 5 * 11 = 55 <= 57 valid bits
constexpr uint32_t kLenMask = 15;       // a decode entry's length fields (DecScratch::tab)
constexpr uint32_t kPfBytes = 8192;     // bytes prefetched per block, input and output each
static_assert(kMaxLen <= kLenMask, "entry layout");

// Hides a value's constness from the optimizer (keeps it in a register).
inline void opaque(uint32_t& v) {
#if defined(__GNUC__)
  asm("" : "+r"(v));
#endif
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store_be64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

// Checksum of the u32 words [w0, w1) of the row (byte offset 4 w): sum (2j + 1) w_j
// = (2 w0 + 1) sum w + 2 sum i w (i = j - w0), all mod 2^64 (portable form).
inline uint64_t cs_words_base(const uint8_t* row, uint64_t w0, uint64_t w1) {
  uint64_t s0 = 0, s1 = 0;
  const uint8_t* p = row + 4 * w0;
  for (uint64_t i = 0; i < w1 - w0; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    s0 += w;
    s1 += (uint64_t)w * i;
  }
  return (2 * w0 + 1) * s0 + 2 * s1;
}

#if EZ_X86
// AVX2: word i = 8 q + l goes to u64 lane l (two vectors of 4 lanes). Running sums
// A_l = sum_q w, B_l = sum_q A_l (after each step) give sum_q q w = Q A_l - B_l over
// Q steps, so sum i w = sum_l 8 (Q A_l - B_l) + l A_l: 6 vector instructions per
// 8 words instead of a 64-bit multiply per word. Exact mod 2^64 like the base form.
EZ_TARGET_FAST uint64_t cs_words_fast(const uint8_t* row, uint64_t w0, uint64_t w1) {
  const uint8_t* p = row + 4 * w0;
  const uint64_t cnt = w1 - w0, Q = cnt / 8;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
  // Widening loads straight from memory (vpmovzxdq ymm, m128), a pointer loop. (A
  // macro: lambdas do not inherit the function's target attribute.)
#define EZ_CS_STEP(q)                                                                                       \
  a0 = _mm256_add_epi64(a0, _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));      \
  a1 = _mm256_add_epi64(a1, _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>((q) + 16))));\
  b0 = _mm256_add_epi64(b0, a0);                                                                            \
  b1 = _mm256_add_epi64(b1, a1)
  const uint8_t* q = p;
  const uint8_t* const q2 = p + 32 * (Q & ~1ull);
  for (; q < q2; q += 64) {
    EZ_CS_STEP(q);
    EZ_CS_STEP(q + 32);
  }
  if (Q & 1) {
    EZ_CS_STEP(q);
  }
#undef EZ_CS_STEP
  uint64_t A[8], B[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(A), a0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + 4), a1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(B), b0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(B + 4), b1);
  uint64_t s0 = 0, s1 = 0;
  for (uint64_t l = 0; l < 8; ++l) {
    s0 += A[l];
    s1 += 8 * (Q * A[l] - B[l]) + l * A[l];
  }
  for (uint64_t i = 8 * Q; i < cnt; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    s0 += w;
    s1 += (uint64_t)w * i;
  }
  return (2 * w0 + 1) * s0 + 2 * s1;
}
#endif

inline uint64_t cs_words(const uint8_t* row, uint64_t w0, uint64_t w1) {
#if EZ_X86
  if (have_fast_isa()) return cs_words_fast(row, w0, w1);
#endif
  return cs_words_base(row, w0, w1);
}

template <DtypeCode D>
constexpr Traits traits() {
  return traits_of(D);
}

// ---------------------------------------------------------------------------------
// Raw planes (entropy_format.h: byte plane, then the packed plane).

#if EZ_X86
// bf16 kind E byte plane, 32 elements a step (AVX2): raw byte = s << 7 | m =
// (v & 0x7F) | (v >> 8 & 0x80). Returns the elements done (a multiple of 32).
EZ_TARGET_FAST uint32_t write_raw_bf16e_fast(const uint16_t* x, uint32_t len, uint8_t* out) {
  const __m256i m7f = _mm256_set1_epi16(0x7F), m80 = _mm256_set1_epi16(0x80);
  uint32_t j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + 16));
    const __m256i ra = _mm256_or_si256(_mm256_and_si256(a, m7f), _mm256_and_si256(_mm256_srli_epi16(a, 8), m80));
    const __m256i rb = _mm256_or_si256(_mm256_and_si256(b, m7f), _mm256_and_si256(_mm256_srli_epi16(b, 8), m80));
    // packus interleaves the 128-bit lanes (a0-7 b0-7 a8-15 b8-15): restore order
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(ra, rb), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), p);
  }
  return j;
}

// fp16 byte plane (both kinds: raw & 0xFF = m[7:0], the word's low byte), 32
// elements a step. Returns the elements done (a multiple of 32).
EZ_TARGET_FAST uint32_t write_raw_low8_fast(const uint16_t* x, uint32_t len, uint8_t* out) {
  const __m256i mff = _mm256_set1_epi16(0xFF);
  uint32_t j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)), mff);
    const __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + 16)), mff);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), p);
  }
  return j;
}

// Packed planes by AVX2, 4 groups of 8 elements a step: fp16 kind E (s m8, w =
// 2) and kind J (m8, w = 1) from the words' high bytes (s << 7 | e << 2 | m9
// m8, no saturation in packus); bf16 kind J (m, w = 7) from the low bytes masked
// to m (v & 0x7F). Then PEXT with the mask of the raw bits of each byte (0x81 /
// 0x01 / 0x7F: for fp16 E bits in order m8, s = the packed value's bits 0..1;
// m9 is the coded exponent's, format version 4). The 4 groups' w bytes are
// stored as 8-byte words at g w, each next one overwriting the previous one's
// zero bytes: the caller keeps the last store inside the plane (g w + 3 w + 8 <=
// its end). Returns the groups done.
template <DtypeCode D, uint32_t K>
EZ_TARGET_FAST uint32_t write_packed_fast(const uint16_t* x, uint32_t groups, uint8_t* out) {
  constexpr bool hi = D == kF16;  // fp16: high bytes; bf16 (kind J only): low bytes
  constexpr uint32_t w = !hi ? 7 : K == kKindE ? 2 : 1;
  constexpr uint64_t mask = 0x0101010101010101ull * (!hi ? 0x7F : K == kKindE ? 0x81 : 0x01);
  static_assert(w == traits<D>().packed_width(K), "the format's packed width");
  static_assert(hi || K == kKindJ, "bf16 kind E has no packed plane");
  const __m256i m7f = _mm256_set1_epi16(0x7F);
  uint32_t g = 0;
  for (; (g + 3) * w + 8 <= groups * w; g += 4) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * g));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * g + 16));
    if constexpr (hi) {
      a = _mm256_srli_epi16(a, 8);
      b = _mm256_srli_epi16(b, 8);
    } else {
      a = _mm256_and_si256(a, m7f);
      b = _mm256_and_si256(b, m7f);
    }
    // packus interleaves the 128-bit lanes (a0-7 b0-7 a8-15 b8-15): restore order
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
    const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
    uint8_t* const o = out + g * w;
    const uint64_t r0 = _pext_u64((uint64_t)_mm_cvtsi128_si64(lo), mask);
    const uint64_t r1 = _pext_u64((uint64_t)_mm_extract_epi64(lo, 1), mask);
    const uint64_t r2 = _pext_u64((uint64_t)_mm_cvtsi128_si64(hi), mask);
    const uint64_t r3 = _pext_u64((uint64_t)_mm_extract_epi64(hi, 1), mask);
    std::memcpy(o, &r0, 8);
    std::memcpy(o + w, &r1, 8);
    std::memcpy(o + 2 * w, &r2, 8);
    std::memcpy(o + 3 * w, &r3, 8);
  }
  return g;
}
#endif

// Stores the low W (0..8) bytes of v at p, little-endian, from the register (a
// W-byte memcpy of a local went through the stack: a store and narrow reloads).
template <uint32_t W>
EZ_INLINE void store_le(uint8_t* p, uint64_t v) {
  static_assert(W <= 8, "at most 8 bytes");
  if constexpr (W >= 4) {
    const uint32_t lo = (uint32_t)v;
    std::memcpy(p, &lo, 4);
    store_le<W - 4>(p + 4, v >> 32);
  } else if constexpr (W >= 2) {
    const uint16_t lo = (uint16_t)v;
    std::memcpy(p, &lo, 2);
    store_le<W - 2>(p + 2, v >> 16);
  } else if constexpr (W == 1) {
    p[0] = (uint8_t)v;
  }
}

template <DtypeCode D, uint32_t K, bool Fast>
EZ_INLINE void write_raw(const uint16_t* x, uint32_t len, uint8_t* out) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t rw = t.raw_width(K);
  constexpr bool bp = rw >= 8;
  constexpr uint32_t w = bp ? rw - 8 : rw;
  if (bp) {
    uint32_t j = 0;
#if EZ_X86
    if constexpr (Fast && K == kKindE && D == kBF16) j = write_raw_bf16e_fast(x, len, out);
    if constexpr (Fast && D == kF16) j = write_raw_low8_fast(x, len, out);
#endif
    for (; j < len; ++j) out[j] = (uint8_t)t.raw(K, x[j]);
    out += len;
  }
  if (w) {
    const uint32_t groups = (len + 7) / 8;
    uint32_t g = 0;
#if EZ_X86
    if constexpr (Fast) {
      if constexpr (D == kF16 || K == kKindJ) g = write_packed_fast<D, K>(x, len / 8, out);
      // 8 elements at a time: their packed values as 8 bytes (SSE2), PEXT gathers
      // the low w bits of each byte into the group's w bytes. Whole groups only.
      constexpr uint64_t spread = 0x0101010101010101ull * ((1ull << w) - 1);
      const __m128i mlow = _mm_set1_epi16((short)((1u << t.lbits()) - 1));
      for (; g + 1 < groups || (g < groups && len % 8 == 0); ++g) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 8 * g));
        __m128i r = _mm_and_si128(v, mlow);  // kind J: raw = m_low
        if (K == kKindE) r = _mm_or_si128(r, _mm_slli_epi16(_mm_srli_epi16(v, 15), t.lbits()));
        if (bp) r = _mm_srli_epi16(r, 8);
        const uint64_t bytes = (uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(r, r));
        uint64_t acc;  // PEXT by inline asm: the intrinsic needs a target attribute here
        asm("pext %2, %1, %0" : "=r"(acc) : "r"(bytes), "r"(spread));
        store_le<w>(out + g * w, acc);
      }
    }
#endif
    for (; g < groups; ++g) {
      uint64_t acc = 0;
      const uint32_t kend = std::min<uint32_t>(8, len - 8 * g);
      for (uint32_t k = 0; k < kend; ++k)
        acc |= (uint64_t)(t.raw(K, x[8 * g + k]) >> (bp ? 8 : 0)) << (k * w);
      for (uint32_t i = 0; i < w; ++i) out[g * w + i] = (uint8_t)(acc >> (8 * i));
    }
  }
}

// The W (1..8) bytes at p as a little-endian value, by one 8-byte load that ends
// at p + W. The 8 - W bytes before p must be readable: in or_raw they are the
// previous group, the byte plane, the block's head or, for the first block, the
// row's header (>= 128 bytes before it). A W-byte memcpy into a zeroed u64
// instead went through the stack (2 narrow stores, then an 8-byte load: a
// store-forwarding stall per 8 elements, ~40% of fp16 decode time).
template <uint32_t W>
EZ_INLINE uint64_t load_ending(const uint8_t* p) {
  static_assert(W <= 8, "at most 8 bytes");
  if constexpr (W == 0) return 0;  // (no packed plane: not called)
  else return load64(p + W - 8) >> (64 - 8 * W);
}

#if EZ_X86
// The join of 32 elements a step (AVX2; returns the elements done, a multiple of
// 32). Every kind's raw word is (high byte << 8 | low byte) (masked for bf16
// kind E):
//   bf16 E: low = high = the byte plane's s << 7 | m, masked by 0x807F (s to
//           bit 15, m to bits 0..6);
//   bf16 J: low = the packed 7-bit m, high = 0;
//   fp16 E: low = the byte plane (m[7:0]), high = the packed mantissa bits and
//           s spread by PDEP to bits 0.. and 7 (s to bit 15): no shifts after
//           the join;
//   fp16 J: low = the byte plane, high = the packed mantissa bits.
// The 4 groups' PDEP results go to qwords in the order 0, 2, 1, 3, and the byte
// plane is loaded permuted the same way (vpermq), so that the in-lane byte
// unpacks give elements 0..15 (low) and 16..31 (high). Reads the byte plane at
// in[j, j + 32) and each group's packed bytes by load_ending (bytes before it are
// readable, see there). ~0.4 (bf16 E) to ~0.9 (fp16 E) instructions an element
// instead of ~0.9 to ~2.2 for 16 or 8 elements a step.
template <DtypeCode D, uint32_t K>
EZ_TARGET_FAST uint32_t or_raw_fast32(const uint8_t* in, uint32_t len, const uint16_t* sv, uint16_t* y,
                                      uint16_t keep) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t rw = t.raw_width(K);
  constexpr bool bp = rw >= 8;
  constexpr uint32_t w = bp ? rw - 8 : rw;
  // PDEP spread: w bits into each byte; kind E with a byte plane (fp16) has the
  // sign as the packed value's top bit, spread to bit 7 (word bit 15), the
  // mantissa bits below it to bits 0.. (word bits 8..).
  constexpr uint64_t spread =
      0x0101010101010101ull *
      (w == 0 ? 0 : (K == kKindE && bp) ? (0x80u | ((1u << (w - 1)) - 1)) : ((1u << w) - 1));
  const uint8_t* packed = in + (bp ? len : 0);
  const __m256i k16 = _mm256_set1_epi16((short)keep);
  const __m256i m807f = _mm256_set1_epi16((short)0x807F);
  uint32_t j = 0;
  if constexpr (D == kF16) {
    // fp16 (byte plane + w = 2 (E) or 1 (J) packed bits an element): no PDEP.
    // The 32 elements' packed bits are one u64 X (element j's at bits [w j, w j +
    // w)), broadcast; VPSHUFB brings each element's byte (w j / 8) to its word's
    // low byte, masked to its w bits (at bit p = w j % 8), and one VPMULLW by a
    // sum of powers of two copies each bit to its place in the word: E (m8 at p,
    // s at p + 1) by 2^(8-p) + 2^(14-p): m8 to bit 8, s to 15 (the other two
    // partial products, bits 9 and 14, are masked off; no two share a bit, so no
    // carries); J (m8 at p) by 2^(8-p): m8 to bit 8.
    constexpr bool E = K == kKindE;
    static_assert(bp && w == (E ? 2u : 1u), "fp16 planes");
    auto kv = [](uint32_t j) -> short {
      const uint32_t p = (w * j) % 8;
      return (short)(E ? (1u << (8 - p)) + (1u << (14 - p)) : 1u << (8 - p));
    };
    auto mv = [](uint32_t j) -> short { return (short)(((1u << w) - 1) << ((w * j) % 8)); };
    // VPSHUFB indexes within each 128-bit half; X is in both halves.
    auto bi = [](uint32_t j) -> short { return (short)(0x8000u | ((w * j) / 8)); };
    const __m256i shA = _mm256_setr_epi16(bi(0), bi(1), bi(2), bi(3), bi(4), bi(5), bi(6), bi(7), bi(8), bi(9),
                                          bi(10), bi(11), bi(12), bi(13), bi(14), bi(15));
    const __m256i shB = _mm256_setr_epi16(bi(16), bi(17), bi(18), bi(19), bi(20), bi(21), bi(22), bi(23), bi(24),
                                          bi(25), bi(26), bi(27), bi(28), bi(29), bi(30), bi(31));
    const __m256i mA = _mm256_setr_epi16(mv(0), mv(1), mv(2), mv(3), mv(4), mv(5), mv(6), mv(7), mv(8), mv(9),
                                         mv(10), mv(11), mv(12), mv(13), mv(14), mv(15));
    const __m256i kA = _mm256_setr_epi16(kv(0), kv(1), kv(2), kv(3), kv(4), kv(5), kv(6), kv(7), kv(8), kv(9),
                                         kv(10), kv(11), kv(12), kv(13), kv(14), kv(15));
    const __m256i keepbits = _mm256_set1_epi16(E ? (short)0x8100 : (short)0x0100);
    // Pointers stepped (indexes made GCC recompute addresses each step).
    const uint32_t steps = len / 32;
    const uint8_t* b = in;
    const uint8_t* g = packed;
    const uint16_t* sp = sv;
    uint16_t* yp = y;
    for (uint32_t i = 0; i < steps; ++i, b += 32, g += 4 * w, sp += 32, yp += 32) {
      const __m256i x = _mm256_set1_epi64x((long long)load_ending<4 * w>(g));
      __m256i h0 = _mm256_and_si256(_mm256_shuffle_epi8(x, shA), mA);
      __m256i h1 = _mm256_and_si256(_mm256_shuffle_epi8(x, shB), mA);
      h0 = _mm256_mullo_epi16(h0, kA);
      h1 = _mm256_mullo_epi16(h1, kA);
      if constexpr (E) {
        h0 = _mm256_and_si256(h0, keepbits);
        h1 = _mm256_and_si256(h1, keepbits);
      }
      const __m256i l0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
      const __m256i l1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
      const __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp));
      const __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(yp),
                          _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(s0, k16), l0), h0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(yp + 16),
                          _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(s1, k16), l1), h1));
    }
    return 32 * steps;
  }
  const uint8_t* g = packed;  // the 4 groups' packed bytes
  for (; j + 32 <= len; j += 32, g += 4 * w) {
    __m256i lo = _mm256_setzero_si256(), hi = lo;
    if constexpr (bp) {
      lo = _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j)), 0xD8);
    }
    if constexpr (w > 0) {
      uint64_t d0, d1, d2, d3;
      asm("pdep %2, %1, %0" : "=r"(d0) : "r"(load_ending<w>(g)), "r"(spread));
      asm("pdep %2, %1, %0" : "=r"(d1) : "r"(load_ending<w>(g + w)), "r"(spread));
      asm("pdep %2, %1, %0" : "=r"(d2) : "r"(load_ending<w>(g + 2 * w)), "r"(spread));
      asm("pdep %2, %1, %0" : "=r"(d3) : "r"(load_ending<w>(g + 3 * w)), "r"(spread));
      const __m128i a = _mm_insert_epi64(_mm_cvtsi64_si128((long long)d0), (long long)d2, 1);
      const __m128i c = _mm_insert_epi64(_mm_cvtsi64_si128((long long)d1), (long long)d3, 1);
      hi = _mm256_inserti128_si256(_mm256_castsi128_si256(a), c, 1);
      if constexpr (!bp) {  // bf16 J: the packed value is the low byte
        lo = hi;
        hi = _mm256_setzero_si256();
      }
    } else {
      hi = lo;  // bf16 E
    }
    __m256i r0 = _mm256_unpacklo_epi8(lo, hi), r1 = _mm256_unpackhi_epi8(lo, hi);
    if constexpr (w == 0) {
      r0 = _mm256_and_si256(r0, m807f);
      r1 = _mm256_and_si256(r1, m807f);
    }
    const __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sv + j));
    const __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sv + j + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), _mm256_or_si256(_mm256_and_si256(s0, k16), r0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j + 16), _mm256_or_si256(_mm256_and_si256(s1, k16), r1));
  }
  return j;
}
#endif

// y[j] = (sv[j] & keep) | the raw bits of element j, for j < len (sv may be y).
// keep clears what a decoded symbol entry holds besides the symbol's value bits
// (its code length, in bits that the raw bits own: see DecScratch::tab).
template <DtypeCode D, uint32_t K, bool Fast>
EZ_INLINE void or_raw(const uint8_t* in, uint32_t len, const uint16_t* sv, uint16_t* y, uint16_t keep) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t rw = t.raw_width(K);
  constexpr bool bp = rw >= 8;
  constexpr uint32_t w = bp ? rw - 8 : rw;
  const uint8_t* packed = in + (bp ? len : 0);
  uint32_t j32 = 0;  // elements joined 32 a step
#if EZ_X86
  if constexpr (Fast) j32 = or_raw_fast32<D, K>(in, len, sv, y, keep);
#endif
  if (!w) {
    for (uint32_t j = j32; j < len; ++j) y[j] = (uint16_t)((sv[j] & keep) | t.raw_bits(K, in[j]));
    return;
  }
  constexpr uint64_t mask = (1ull << w) - 1;
  const uint32_t groups = (len + 7) / 8;
  uint32_t g = j32 / 8;
#if EZ_X86
  if constexpr (Fast) {
    // 8 elements at a time: PDEP spreads the group's 8 w-bit values into 8 bytes,
    // interleaved with the byte plane they form 8 16-bit raw values (SSE2), then
    // raw_bits and the OR with the symbols' bits (instead of ~18 scalar
    // instructions an element). Whole groups only; reads w bytes per group.
    constexpr uint64_t spread = 0x0101010101010101ull * mask;
    const __m128i keep8 = _mm_set1_epi16((short)keep);
    const __m128i mlow = _mm_set1_epi16((short)((1u << t.lbits()) - 1));
    for (; g + 1 < groups || (g < groups && len % 8 == 0); ++g) {
      const uint64_t acc = load_ending<w>(packed + g * w);
      uint64_t bytes;  // PDEP by inline asm: the intrinsic needs a target attribute here
      asm("pdep %2, %1, %0" : "=r"(bytes) : "r"(acc), "r"(spread));
      const __m128i hi = _mm_cvtsi64_si128((long long)bytes);
      __m128i r;
      if (bp) {
        uint64_t lo;
        std::memcpy(&lo, in + 8 * g, 8);
        r = _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)lo), hi);
      } else {
        r = _mm_unpacklo_epi8(hi, _mm_setzero_si128());
      }
      if (K == kKindE)  // raw = s << L | m_low -> s << 15 | m_low
        r = _mm_or_si128(_mm_slli_epi16(_mm_srli_epi16(r, t.lbits()), 15), _mm_and_si128(r, mlow));
      const __m128i sv8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sv + 8 * g));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 8 * g), _mm_or_si128(_mm_and_si128(sv8, keep8), r));
    }
  }
#endif
  for (; g < groups; ++g) {
    const uint64_t acc = load_ending<w>(packed + g * w);
    const uint32_t kend = g + 1 < groups ? 8 : len - 8 * g;
    for (uint32_t k = 0; k < kend; ++k) {
      const uint32_t j = 8 * g + k;
      const uint32_t pv = (uint32_t)((acc >> (k * w)) & mask);
      const uint32_t r = bp ? (uint32_t)in[j] | (pv << 8) : pv;
      y[j] = (uint16_t)((sv[j] & keep) | t.raw_bits(K, r));
    }
  }
}

template <DtypeCode D, bool Fast>
EZ_INLINE void write_raw_kind(uint32_t kind, const uint16_t* x, uint32_t len, uint8_t* out) {
  if (kind == kKindE) write_raw<D, kKindE, Fast>(x, len, out);
  else write_raw<D, kKindJ, Fast>(x, len, out);
}

template <DtypeCode D, bool Fast>
EZ_INLINE void or_raw_kind(uint32_t kind, const uint8_t* in, uint32_t len, const uint16_t* sv,
                           uint16_t* y, uint16_t keep) {
  if (kind == kKindE) or_raw<D, kKindE, Fast>(in, len, sv, y, keep);
  else or_raw<D, kKindJ, Fast>(in, len, sv, y, keep);
}

}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
