// "entropy" codec on the CPU: block encoder/decoder, rows, and the XLA FFI handlers
// (targets "zipccl_entropy_encode" / "zipccl_entropy_decode", platform "cpu").
//
// Format: docs/format.md ("Entropy codec (codec id 2)") and entropy_format.h. This
// file is the reference a CUDA port must reproduce byte for byte.
//
// Speed: a block's 8 bit streams are decoded interleaved (5 lookups per 64-bit
// refill in a 2048-entry table whose entries hold up to 3 symbols: about 2.85
// symbols a lookup on Gaussian data, ~4.6 instructions an element on bf16), so
// the latency of one stream's lookup chain hides behind the others. The encoder (AVX2 path) histograms and codes
// pairs of elements where a block's exponents span <= 32 values (kPairMaxR) and
// runs package-merge by sorting networks (pm_lists_net): ~8.6 instructions an
// element on Gaussian bf16. fp16 symbols carry the top mantissa
// bit (format version 4). Kind Z (zero elision, format version 3) compacts the
// raw words of nonzero elements and expands the decoded raw values by 8-lane
// byte shuffles (kZShuffles). Rows of >= kParallelMinElems elements are split
// across threads by whole blocks.
#include "entropy_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "cpu_handler.h"
#include "cpu_parallel.h"
#include "env.h"
#include "handler_common.h"

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

// ---------------------------------------------------------------------------------
// Block encoder.

// code_lengths (entropy_format.h, the normative package-merge) computed the same
// way with less work and latency per item: sentinels instead of bounds selects,
// the merge candidates carried in registers (below), a running
// count of the leaves taken instead of a recount per level, and the lengths from
// those counts by a difference array. Same leaves order, same lists, same result
// (tests/test_entropy.py compares whole encodings with the reference).
struct PMFast {
  uint32_t leaf_w[kMaxAlphabet + 3];
  uint32_t pk[kMaxAlphabet + 3];           // package weights of the list being built
  uint16_t leaf_sym[kMaxAlphabet];
  uint32_t w[2][2 * kMaxAlphabet];         // the previous and the current list's weights
  uint16_t cl[kMaxLen][2 * kMaxAlphabet];  // level L: leaves among its first o + 1 items
  uint32_t d[kMaxAlphabet + 1];
  uint32_t lk[64];            // the sorting networks' leaf keys (pm_lists_net)
  uint32_t pk0[64];           // their first packages
  uint32_t net[kMaxLen][128];  // their lists (keys, in network order: kNetSlot)
};

// Symbols below a0 have count 0 (their counts and lengths are not read or written:
// a bf16 block's exponents start ~100 symbols up).
// The leaves: present symbols of [a0, A) sorted by (count, symbol) into s.leaf_w /
// s.leaf_sym (insertion: symbols arrive ascending, so ties keep symbol order);
// len[a0, A) cleared. Returns k, the number of present symbols.
EZ_INLINE uint32_t pm_leaves(const uint32_t* counts, uint32_t a0, uint32_t A, uint8_t* len, PMFast& s) {
  uint32_t k = 0;
  for (uint32_t a = a0; a < A; ++a) {
    len[a] = 0;
    const uint32_t c = counts[a];
    if (c) {
      uint32_t i = k++;
      while (i > 0 && s.leaf_w[i - 1] > c) {
        s.leaf_w[i] = s.leaf_w[i - 1];
        s.leaf_sym[i] = s.leaf_sym[i - 1];
        --i;
      }
      s.leaf_w[i] = c;
      s.leaf_sym[i] = (uint16_t)a;
    }
  }
  return k;
}

// Lengths from s.d (d[c] = the levels whose first t items hold exactly c leaves:
// leaves [0, c) get one bit from each) by a running sum from the last leaf.
EZ_INLINE void pm_assign(uint32_t k, uint8_t* len, PMFast& s) {
  uint32_t run = 0;
  for (uint32_t i = k; i-- > 0;) {
    run += s.d[i + 1];
    len[s.leaf_sym[i]] = (uint8_t)run;
  }
}

EZ_INLINE uint32_t code_lengths_fast(const uint32_t* counts, uint32_t a0, uint32_t A, uint8_t* len, PMFast& s) {
  const uint32_t k = pm_leaves(counts, a0, A, len, s);
  if (k < 2) return k;
  // Weights stay below 2^16 * 11 (far below the sentinel).
  constexpr uint32_t kInf = 0x3FFFFFFFu;
  s.leaf_w[k] = s.leaf_w[k + 1] = s.leaf_w[k + 2] = kInf;
  uint32_t* prev = s.w[0];
  for (uint32_t i = 0; i < k; ++i) prev[i] = s.leaf_w[i];
  uint32_t size = k;
  for (uint32_t L = 1; L < kMaxLen; ++L) {
    const uint32_t np = size / 2;  // an unpaired last item is in no package
    uint32_t* const pk = s.pk;
    for (uint32_t j = 0; j < np; ++j) pk[j] = prev[2 * j] + prev[2 * j + 1];
    pk[np] = pk[np + 1] = pk[np + 2] = kInf;
    const uint32_t total = (L == kMaxLen - 1 && 2 * k - 2 < k + np) ? 2 * k - 2 : k + np;
    uint32_t* cur = s.w[L & 1];
    uint16_t* cl = s.cl[L];
    // The merge keeps the next two candidates of each list in registers: the
    // loads for step o + 1 are issued from the positions before step o's choice,
    // so a step's dependency chain is a compare and a few selects, not a load
    // (the latency that bounds a plain merge).
    const uint32_t* const lwp = s.leaf_w;
    uint32_t i = 0, j = 0;
    uint32_t lw = lwp[0], lw1 = lwp[1], pw = pk[0], pw1 = pk[1];
    for (uint32_t o = 0; o < total; ++o) {
      const bool take_leaf = lw <= pw;
      cur[o] = take_leaf ? lw : pw;
      const uint32_t lw2 = lwp[i + 2], pw2 = pk[j + 2];
      i += take_leaf;
      j += !take_leaf;
      cl[o] = (uint16_t)i;
      lw = take_leaf ? lw1 : lw;
      lw1 = take_leaf ? lw2 : lw1;
      pw = take_leaf ? pw : pw1;
      pw1 = take_leaf ? pw1 : pw2;
    }
    prev = cur;
    size = total;
  }
  for (uint32_t i = 0; i <= k; ++i) s.d[i] = 0;
  uint32_t t = 2 * k - 2;
  for (int L = (int)kMaxLen - 1; L >= 0 && t > 0; --L) {
    const uint32_t c = L == 0 ? t : s.cl[L][t - 1];  // list 0 is the leaves
    s.d[c]++;  // leaves [0, c) get one more bit
    t = 2 * (t - c);
  }
  pm_assign(k, len, s);
  return k;
}

#if EZ_X86
// code_lengths_fast's lists by sorting networks (AVX2), for k <= 8 NR leaves (NR =
// 2, 4 or 8 registers of 8 u32 per input). Every item is a key, weight << 7 | tag:
// a leaf's tag is its index i < 64 in (count, symbol) order, a package's is 64.
// Keys order items exactly as the merge does: by weight, a leaf before a package
// of equal weight, leaves of equal weight by index; packages of equal weight have
// equal keys and are interchangeable (the next list reads only their weights, the
// walk below only how many leaves precede a position). So each list, sorted by
// key, is the scalar merge's list item for item, and the lengths are the same
// (tests/test_entropy.py: test_code_lengths_network_equals_merge).
//
// A list is the bitonic merge of the leaves (ascending, NR registers) with the
// previous list's packages (descending, NR registers): half-cleaners at register
// distances NR .. 1 (lane-wise min / max), then the three in-register stages on
// register pairs (x, y), which leave x's sorted items X0..X7 (and y's) as lo3 =
// [X0 X4 X2 X6 | Y0 Y4 Y2 Y6], hi3 = [X1 X5 X3 X7 | Y1 Y5 Y3 Y7]: the next
// packages X0 + X1, X2 + X3, .. are lo3 + hi3 lane by lane (local packages
// [0 2 1 3 4 6 5 7]), permuted into the next merge's descending order in one
// step. Items past the list (at most 2k - 1 <= 16 NR - 1 items, 8 NR - 1
// packages) are sentinel keys (weight kNetSentW, above any real weight < 2^16 *
// 11); a package with a sentinel part is clamped to the sentinel. ~110
// instructions a list for NR = 4 instead of ~15 an item (~36 items), and no
// data-dependent branches.
constexpr uint32_t kNetSentW = 1u << 20;
// Stored position in a 16-item chunk (lo3 then hi3) of the list item of rank r.
constexpr uint8_t kNetSlot[16] = {0, 8, 2, 10, 1, 9, 3, 11, 4, 12, 6, 14, 5, 13, 7, 15};

template <uint32_t NR>
EZ_TARGET_FAST void pm_lists_net(uint32_t k, PMFast& s) {
  static_assert(NR == 2 || NR == 4 || NR == 8, "leaves in 2, 4 or 8 registers");
  constexpr uint32_t NM = 2 * NR;
  constexpr uint32_t kSentKey = kNetSentW << 7;
  for (uint32_t i = 0; i < 8 * NR; ++i) s.lk[i] = i < k ? s.leaf_w[i] << 7 | i : kSentKey;
  // List 1 (the leaves) gives packages leaf 2q + leaf 2q + 1.
  const uint32_t np0 = k / 2;
  for (uint32_t q = 0; q < 8 * NR; ++q)
    s.pk0[q] = q < np0 ? (s.leaf_w[2 * q] + s.leaf_w[2 * q + 1]) << 7 | 64 : kSentKey | 64;
  __m256i A[NR], B[NR];
  const __m256i rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
  for (uint32_t r = 0; r < NR; ++r) {
    A[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.lk + 8 * r));
    B[r] = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.pk0 + 8 * (NR - 1 - r))), rev);
  }
  const __m256i bperm = _mm256_setr_epi32(7, 5, 6, 4, 3, 1, 2, 0);
  const __m256i sentw = _mm256_set1_epi32((int)kNetSentW), ptag = _mm256_set1_epi32(64);
#pragma GCC unroll 10
  for (uint32_t L = 1; L < kMaxLen; ++L) {
    __m256i M[NM];
    for (uint32_t r = 0; r < NR; ++r) {
      M[r] = A[r];
      M[NR + r] = B[r];
    }
    for (uint32_t d = NR; d >= 1; d /= 2) {
      for (uint32_t i = 0; i < NM; ++i) {
        if (i & d) continue;
        const __m256i lo = _mm256_min_epu32(M[i], M[i + d]), hi = _mm256_max_epu32(M[i], M[i + d]);
        M[i] = lo;
        M[i + d] = hi;
      }
    }
    uint32_t* const out = s.net[L];
    for (uint32_t p = 0; p < NR; ++p) {
      const __m256i x = M[2 * p], y = M[2 * p + 1];
      const __m256i a = _mm256_permute2x128_si256(x, y, 0x20), b = _mm256_permute2x128_si256(x, y, 0x31);
      const __m256i lo = _mm256_min_epu32(a, b), hi = _mm256_max_epu32(a, b);
      const __m256i c = _mm256_unpacklo_epi64(lo, hi), dd = _mm256_unpackhi_epi64(lo, hi);
      const __m256i lo2 = _mm256_min_epu32(c, dd), hi2 = _mm256_max_epu32(c, dd);
      const __m256i e = _mm256_castps_si256(
          _mm256_shuffle_ps(_mm256_castsi256_ps(lo2), _mm256_castsi256_ps(hi2), _MM_SHUFFLE(2, 0, 2, 0)));
      const __m256i f = _mm256_castps_si256(
          _mm256_shuffle_ps(_mm256_castsi256_ps(lo2), _mm256_castsi256_ps(hi2), _MM_SHUFFLE(3, 1, 3, 1)));
      const __m256i lo3 = _mm256_min_epu32(e, f), hi3 = _mm256_max_epu32(e, f);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * p), lo3);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * p + 8), hi3);
      __m256i w = _mm256_add_epi32(_mm256_srli_epi32(lo3, 7), _mm256_srli_epi32(hi3, 7));
      w = _mm256_or_si256(_mm256_slli_epi32(_mm256_min_epu32(w, sentw), 7), ptag);
      B[NR - 1 - p] = _mm256_permutevar8x32_epi32(w, bperm);
    }
  }
  // The walk from the last list down (code_lengths_fast's), c = leaves among the
  // first t items: the item of rank t - 1 is leaf i (c = i + 1) or a package of
  // weight w (c = leaves of weight <= w, i.e. keys below the package's).
  for (uint32_t i = 0; i <= k; ++i) s.d[i] = 0;
  uint32_t t = 2 * k - 2;
  for (uint32_t L = kMaxLen - 1; L >= 1 && t > 0; --L) {
    const uint32_t r = t - 1;
    const uint32_t key = s.net[L][(r & ~15u) + kNetSlot[r & 15]];
    uint32_t c;
    if (!(key & 64)) {
      c = (key & 63) + 1;
    } else {
      const __m256i kv = _mm256_set1_epi32((int)key);
      c = 0;
      for (uint32_t q = 0; q < NR; ++q)
        c += (uint32_t)__builtin_popcount(
            (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(kv, A[q]))));
    }
    s.d[c]++;
    t = 2 * (t - c);
  }
  if (t > 0) s.d[t]++;  // list 0, the leaves: c = t
}
#endif

// code_lengths_fast, by the sorting networks where the leaves fit (AVX2 path).
template <bool Fast>
EZ_INLINE uint32_t code_lengths_pick(const uint32_t* counts, uint32_t a0, uint32_t A, uint8_t* len, PMFast& s) {
#if EZ_X86
  if (Fast) {
    const uint32_t k = pm_leaves(counts, a0, A, len, s);
    if (k < 2) return k;
    if (k <= 16) {
      pm_lists_net<2>(k, s);
      pm_assign(k, len, s);
      return k;
    }
    if (k <= 32) {
      pm_lists_net<4>(k, s);
      pm_assign(k, len, s);
      return k;
    }
    if (k <= 64) {  // kind J of sign-skewed data (GELU, softmax): 16 registers a list, some spilled
      pm_lists_net<8>(k, s);
      pm_assign(k, len, s);
      return k;
    }
  }
#endif
  return code_lengths_fast(counts, a0, A, len, s);
}

// The pair path (encode_block_impl, AVX2, full blocks whose exponents span R <=
// kPairMaxR values [emin, emin + R)). Histogram: one counter increment per 2
// elements over bins (sign, exponent) x (sign, exponent) (64 x 64 u16, 8 KiB),
// the per-symbol counts from its row and column sums. Writer (HUFF-E and
// HUFF-J): a table over symbol pairs holds the concatenated code (<= 22 bits) and
// its length, so a code push (an index load, a length load, a shift, an OR, an
// add: 5 instructions) serves 2 elements, and 2 pairs (<= 44 bits) go per flush
// instead of 5 single codes. Kind E's table has 32 x 32 entries in rows of 64
// (indexed by the bin without its sign bits), kind J's 64 x 64 (indexed by the
// bin); rows of present symbols only, ~R^2 / 4 resp. R^2 vector steps to build.
// Gaussian bf16 blocks span ~16-20 exponents; fp16 blocks (coded exponents: the
// exponent and the top mantissa bit) ~24 of their 64. The bytes are those of
// the single-code path.
constexpr uint32_t kPairMaxR = 32;
#if EZ_X86
#define EZ_PAIR_OK true
#else
#define EZ_PAIR_OK false  // the pair passes are AVX2 code
#endif

#if EZ_X86
// Pair indices of a full block, 32 elements a step. With us = s << 5 | (e -
// emin) (sign and coded-exponent offset, 6 bits; e = the coded exponent c, bits
// L .. L + E + q - 1 of the word, L = M - q: entropy_format.h Traits), pair i
// (elements 2i, 2i + 1) gets ps[i] = us_2i << 6 | us_2i+1 (12 bits: the pair
// histogram's bin) and pe[i] = ps[i] without the sign bits 11 and 5 = (e_2i -
// emin) * 64 + (e_2i+1 - emin) (the kind E pair writer's table index). vpmaddwd
// multiplies the even element's us by 64 and adds the odd one's in each 32-bit
// lane.
template <uint32_t L>
EZ_TARGET_FAST void pair_index_fast(const uint16_t* x, uint32_t emin, uint16_t* ps, uint16_t* pe) {
  static_assert(L == 7 || L == 9, "bf16 (L = 7) or fp16 (L = 9)");
  // |v| >= emin << L for every element: the subtraction stays out of the sign bit
  const __m256i vmin = _mm256_set1_epi16((short)(emin << L));
  const __m256i sbit = _mm256_set1_epi16(0x4000);
  const __m256i sw = _mm256_set1_epi16(0x2001);
  const __m256i mul = _mm256_set1_epi32((int)(64u | 1u << 16));
  const __m256i nosign = _mm256_set1_epi16(0x7DF);
  for (uint32_t j = 0; j < kBlock; j += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + 16));
    __m256i ua, ub;
    if constexpr (L == 9) {
      // fp16 (E + q = 6): d = v - emin << 9 holds s at bit 15, e' < 32 at bits
      // 9..13 (bit 14 zero): d - (d >> 1 & 0x4000) moves s to bit 14, then >> 9
      // gives s << 5 | e'
      const __m256i da = _mm256_sub_epi16(a, vmin), db = _mm256_sub_epi16(b, vmin);
      ua = _mm256_srli_epi16(_mm256_sub_epi16(da, _mm256_and_si256(_mm256_srli_epi16(da, 1), sbit)), L);
      ub = _mm256_srli_epi16(_mm256_sub_epi16(db, _mm256_and_si256(_mm256_srli_epi16(db, 1), sbit)), L);
    } else {
      // bf16 (E = 8): (v - emin << 7) >> 7 = s << 8 | e' (bytes e', s), then
      // vpmaddubsw with bytes (1, 32) gives e' + 32 s
      ua = _mm256_maddubs_epi16(_mm256_srli_epi16(_mm256_sub_epi16(a, vmin), L), sw);
      ub = _mm256_maddubs_epi16(_mm256_srli_epi16(_mm256_sub_epi16(b, vmin), L), sw);
    }
    // packus interleaves the 128-bit lanes (a0-3 b0-3 a4-7 b4-7): restore order
    const __m256i p = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_madd_epi16(ua, mul), _mm256_madd_epi16(ub, mul)), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ps + j / 2), p);
    const __m256i q = _mm256_and_si256(p, nosign);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pe + j / 2), q);
  }
}

// The largest and smallest |v| (v & 0x7FFF) of a full block, 64 elements a step.
EZ_TARGET_FAST void minmax_abs_fast(const uint16_t* x, uint16_t* mx, uint16_t* mn) {
  const __m256i m = _mm256_set1_epi16(0x7FFF);
  __m256i hi0 = _mm256_setzero_si256(), hi1 = hi0, lo0 = _mm256_set1_epi16(-1), lo1 = lo0;
  for (uint32_t j = 0; j < kBlock; j += 64) {
    const __m256i* p = reinterpret_cast<const __m256i*>(x + j);
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(p), m);
    const __m256i b = _mm256_and_si256(_mm256_loadu_si256(p + 1), m);
    const __m256i c = _mm256_and_si256(_mm256_loadu_si256(p + 2), m);
    const __m256i d = _mm256_and_si256(_mm256_loadu_si256(p + 3), m);
    hi0 = _mm256_max_epu16(hi0, _mm256_max_epu16(a, b));
    hi1 = _mm256_max_epu16(hi1, _mm256_max_epu16(c, d));
    lo0 = _mm256_min_epu16(lo0, _mm256_min_epu16(a, b));
    lo1 = _mm256_min_epu16(lo1, _mm256_min_epu16(c, d));
  }
  alignas(32) uint16_t h[16], l[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(h), _mm256_max_epu16(hi0, hi1));
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), _mm256_min_epu16(lo0, lo1));
  uint16_t vh = 0, vl = 0xFFFF;
  for (int i = 0; i < 16; ++i) {
    vh = h[i] > vh ? h[i] : vh;
    vl = l[i] < vl ? l[i] : vl;
  }
  *mx = vh;
  *mn = vl;
}

// The counts by sign and exponent from the pair histogram h[us0 << 6 | us1]:
// count(us) = row sum (us as the even element) + column sum (as the odd one),
// for us = sg << 5 | e', e' < R (other bins are zero); half[sg][emin + e'] gets
// it. The rows read are cleared for the next block.
EZ_TARGET_FAST void pair_hist_counts_fast(uint16_t* h, uint32_t emin, uint32_t R, uint16_t (*half)[kMaxAlphabet / 2 + 16]) {
  __m256i col[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  alignas(32) uint16_t rows[64] = {};
  const __m256i ones = _mm256_set1_epi16(1), zero = _mm256_setzero_si256();
  for (uint32_t sg = 0; sg < 2; ++sg) {
    for (uint32_t e = 0; e < R; ++e) {
      uint16_t* const r = h + (sg * 32 + e) * 64;
      __m256i sum = zero;
      for (uint32_t k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 16 * k));
        col[k] = _mm256_add_epi16(col[k], v);
        sum = _mm256_add_epi16(sum, v);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(r + 16 * k), zero);
      }
      // a row sums to <= 2048 (pairs in a block): 16-bit lanes do not overflow
      __m256i s32 = _mm256_madd_epi16(sum, ones);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      rows[sg * 32 + e] = (uint16_t)_mm_cvtsi128_si32(s4);
    }
  }
  alignas(32) uint16_t cols[64];
  for (uint32_t k = 0; k < 4; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(cols + 16 * k), col[k]);
  for (uint32_t sg = 0; sg < 2; ++sg)
    for (uint32_t e = 0; e < R; ++e) half[sg][emin + e] = (uint16_t)(rows[sg * 32 + e] + cols[sg * 32 + e]);
}

// The pair table over H halves of 32 symbol slots, rows of 64 entries (kind E: H =
// 1, slot e' = exponent e' + emin, index a * 64 + b = the bin without its sign
// bits; kind J: H = 2, slot us = s << 5 | e', index us_a * 64 + us_b = the pair
// histogram's bin): rows a with le[a] != 0
// (absent symbols' rows are never read), entries b in each half's [0, ceil(R /
// 4) * 4): code (ce[a] << le[b]) | ce[b], length le[a] + le[b] (a half's 32
// lengths in one byte vector). ce / le / le8 (le as bytes) hold 32 H values,
// zero for absent symbols and past R; 4 codes a vector.
template <uint32_t H>
EZ_TARGET_FAST void pair_table_fast(const uint64_t* ce, const uint64_t* le, const uint8_t* le8, uint32_t R,
                                    uint64_t* pcode, uint8_t* plen) {
  constexpr uint32_t S = 64;  // row stride
  const uint32_t nv = (R + 3) / 4;
  // A half without present symbols (kind J of one-signed data: ReLU, softmax) is
  // never a pair's second symbol: its entries are not written (half the table).
  bool half_present[H];
  for (uint32_t h = 0; h < H; ++h) {
    uint64_t any = 0;
    for (uint32_t b = 32 * h; b < 32 * h + R; ++b) any |= le[b];
    half_present[h] = any != 0;
  }
  for (uint32_t ha = 0; ha < H; ++ha) {
    if (!half_present[ha]) continue;
    for (uint32_t a = 32 * ha; a < 32 * ha + R; ++a) {
      if (!le[a]) continue;
      const __m256i ca = _mm256_set1_epi64x((long long)ce[a]);
      for (uint32_t hb = 0; hb < H; ++hb) {
        if (!half_present[hb]) continue;
        for (uint32_t v = 0; v < nv; ++v) {
          const uint32_t b = 32 * hb + 4 * v;
          const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(le + b));
          const __m256i cb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ce + b));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(pcode + a * S + b),
                              _mm256_or_si256(_mm256_sllv_epi64(ca, lb), cb));
        }
        const __m256i lb8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(le8 + 32 * hb));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(plen + a * S + 32 * hb),
                            _mm256_add_epi8(lb8, _mm256_set1_epi8((char)le8[a])));
      }
    }
  }
}
#endif

// True when no element of x[0, len) is a subnormal ((v & 0x7FFF) in [1, 2^M)): the
// smallest (|v| - 1) mod 2^16 (zeros wrap to 0xFFFF) is >= 2^M - 1. Min reductions
// that the compiler vectorizes (AVX2 in the fast build), 512 elements each, so that
// a block with subnormals (small fp16 activations: a few a block) stops early;
// called only for blocks whose smallest |v| is 0.
template <uint32_t M>
EZ_INLINE bool no_subnormal(const uint16_t* x, uint32_t len) {
  for (uint32_t j0 = 0; j0 < len; j0 += 512) {
    const uint32_t j1 = j0 + 512 < len ? j0 + 512 : len;
    uint16_t mn = 0xFFFF;
    for (uint32_t j = j0; j < j1; ++j) {
      const uint16_t a = (uint16_t)((x[j] & 0x7FFF) - 1);
      mn = a < mn ? a : mn;
    }
    if (mn < (1u << M) - 1) return false;
  }
  return true;
}

struct EncScratch {
  PMFast pm;
  // Elements are indexed by u = v >> L = sign << (E + q) | c (the word's top
  // bits: one shift a 16-element vector; c = the coded exponent, L = M - q,
  // entropy_format.h Traits; "e" below is c), not by the J symbol c << 1 | s: the
  // histogram and the code tables take u and the counts are permuted into
  // symbol order once per block (2 x 256 values), not per element.
  uint16_t sym[kBlock];              // u of every element of the block
  uint16_t cnt[4][kMaxAlphabet];     // histogram lanes over u (<= 1024 per lane); zero between blocks
  uint16_t half[2][kMaxAlphabet / 2 + 16];  // [sign] lane sums by exponent
  uint32_t c[2][kMaxAlphabet];       // [kind] counts by symbol
  uint8_t len[2][kMaxAlphabet];      // [kind] code lengths
  uint8_t nibs[2][kMaxAlphabet / 2 + 8];  // [kind] code-length nibble stream
  uint64_t ccode[kMaxAlphabet];      // [u] code (u64: OR-ed from memory)
  uint8_t clen[kMaxAlphabet];        // [u] code length
  uint8_t bits[kMaxAreaBytes + 64];  // bit streams before they are copied into place
  uint8_t bits2[kMaxAreaBytes / 2 + 64];  // streams 4..7 of a full block (second writer)
  uint16_t pidx[kBlock / 2];         // pair writer: kind E table indices of the block (pe)
  uint16_t pbin[kBlock / 2];         // pair histogram bins of the block (ps)
  uint16_t pcnt[64 * 64];            // pair histogram; zero between blocks
  uint64_t pcode[64 * 64];           // pair writer: codes of symbol pairs (pair_table_fast)
  uint8_t plen[64 * 64];             // pair writer: their total lengths (bits)
  // Prefetch targets for the histogram pass (see encode_row_t): the input of a
  // later block and the output bytes a later block will write (kPfBytes each).
  const uint8_t* pf_in;
  uint8_t* pf_out;
};

// An MSB-first bit writer: codes are shifted into a 64-bit accumulator and
// counted; a flush after every <= 5 codes (<= 55 bits + < 8 pending bits fit)
// stores the pending bits at the top of 8 big-endian bytes and advances by
// whole bytes. The flush only reads acc (the bits above the pending ones shift
// out of the stored word), so the accumulator's dependency chain is one shift
// and one OR a code.
struct BitWriter {
  uint64_t acc;
  uint32_t nacc;
  uint8_t* bp;
  EZ_INLINE void init(uint8_t* p) {
    acc = 0;
    nacc = 0;
    bp = p;
  }
  EZ_INLINE void flush() {
    store_be64(bp, acc << (63 - nacc) << 1);  // two shifts: nacc may be 0
    bp += nacc >> 3;
    nacc &= 7;
  }
  // Bits written since p (the init pointer).
  EZ_INLINE uint32_t bits_since(const uint8_t* p) const { return (uint32_t)(bp - p) * 8 + nacc; }
};

// Appends the nbits bits of src (MSB first from src[0]; src readable and zero
// for 16 bytes past nbits / 8) at bit `at` of dst, whose bits past `at` are
// zero. Writes bytes [at / 8, at / 8 + 8 * ceil((at % 8 + nbits) / 64)).
EZ_INLINE void append_bits(uint8_t* dst, uint32_t at, const uint8_t* src, uint32_t nbits) {
  uint8_t* d = dst + at / 8;
  const uint32_t sh = at & 7;
  const uint32_t nbytes = (sh + nbits + 7) / 8;
  if (!sh) {
    std::memcpy(d, src, (nbits + 7) / 8);
    return;
  }
  uint64_t carry = (uint64_t)d[0] << 56;  // the high sh bits of d[0] are dst's
  for (uint32_t i = 0; i < nbytes; i += 8) {
    const uint64_t w = __builtin_bswap64(load64(src + i));
    store_be64(d + i, carry | (w >> sh));
    carry = w << (64 - sh);
  }
}

// Two bit writers (streams 0..3 into one buffer, 4..7 into another) have ended
// stream st and st + kStreams / 2 at bit positions P_a and P_b: their bit lengths
// go into the block header, and the next streams start there.
EZ_INLINE void end_stream_pair(uint8_t* out, uint32_t st, uint32_t P_a, uint32_t P_b, uint32_t* before_a,
                               uint32_t* before_b) {
  st16(out + kBlockHead + 2 * st, P_a - *before_a);
  st16(out + kBlockHead + 2 * (st + kStreams / 2), P_b - *before_b);
  *before_a = P_a;
  *before_b = P_b;
}

// Joins the two writers' areas: bits_b's bits_b_n bits (its writer ended at bit P_b)
// after bits_a's bits_a_n. Returns the total bits. The writers' last flush stored 8
// bytes from its start byte (zeros after the pending bits); 16 more zero bytes from
// P_b / 8 + 8 cover append_bits' word reads.
EZ_INLINE uint32_t join_writers(uint8_t* bits_a, uint32_t bits_a_n, uint8_t* bits_b, uint32_t P_b,
                                uint32_t bits_b_n) {
  std::memset(bits_b + (P_b >> 3) + 8, 0, 16);
  append_bits(bits_a, bits_a_n, bits_b, bits_b_n);
  return bits_a_n + bits_b_n;
}

// Encodes one block into out (at most max_block_bytes(len) bytes, exactly the
// returned size written). *raw = the block was stored RAW.
template <DtypeCode D, bool Fast>
EZ_INLINE uint32_t encode_block_impl(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s,
                                     bool* raw) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t AE = 1u << t.cbits();  // kind E alphabet (coded exponents)
  // The largest and smallest |v| first (a vectorizable pass): their exponents
  // bound the symbols present.
  uint16_t mxa = 0, mna = 0xFFFF;  // u16 keeps the max / min in 16-bit lanes (vpmaxuw)
  bool have_sym = false;  // s.sym holds the block's u values
#if EZ_X86
  if (Fast && len == kBlock) {
    minmax_abs_fast(x, &mxa, &mna);
  } else
#endif
  {
    // Without the pair histogram (portable path, short blocks) every single-code
    // path needs u = v >> L: computed in the same pass.
    for (uint32_t j = 0; j < len; ++j) {
      const uint16_t v = x[j];
      s.sym[j] = (uint16_t)(v >> t.lbits());
      const uint16_t a = v & 0x7FFF;
      mxa = a > mxa ? a : mxa;
      mna = a < mna ? a : mna;
    }
    have_sym = true;
  }
  // Exponents below emin (the smallest |v|'s) have no elements: the counts,
  // lengths and codes of symbols below a0[kind] (emin, 2 emin) are neither
  // written nor read in this block.
  const uint32_t emax = mxa >> t.lbits(), emin = mna >> t.lbits();
  const uint32_t eend = emax + 1;
  const uint32_t a0[2] = {emin, 2 * emin};  // [kind] first symbol that may be present
  const uint32_t pair_r = eend - emin;      // exponents [emin, emax]
  // One input line and one output line are prefetched per 32 elements: 8 KiB
  // each per full block, spread over a long loop instead of a burst (a burst of
  // 128 prefetches stalls on the fill buffers like the demand misses it
  // replaces): the single-code path's histogram, the pair path's writer (its
  // histogram is half as long: the bursts cost ~10% at 64 MiB).
  static_assert(kPfBytes == kBlock * 2, "one line of each per 32 elements");
  const bool pair_hist = EZ_PAIR_OK && Fast && len == kBlock && pair_r <= kPairMaxR;
#if EZ_X86
  if (pair_hist) {
    // Pair histogram: one counter increment (2 instructions) per 2 elements
    // over (sign, exponent) pairs, the per-symbol counts from its row and column
    // sums; the pair indices serve the pair writer too.
    pair_index_fast<t.lbits()>(x, emin, s.pbin, s.pidx);
    for (uint32_t i = 0; i < kBlock / 2; i += 32) {  // 32 pairs = 64 elements
#pragma GCC unroll 32
      for (uint32_t q = i; q < i + 32; ++q) s.pcnt[s.pbin[q]]++;
    }
    pair_hist_counts_fast(s.pcnt, emin, pair_r, s.half);
  } else
#endif
  {
  // u = v >> L, then counts in 4 lanes (a run of equal symbols would otherwise
  // serialize on one counter's store-to-load latency).
  if (!have_sym)
    for (uint32_t j = 0; j < len; ++j) s.sym[j] = (uint16_t)(x[j] >> t.lbits());
  have_sym = true;
  uint32_t j = 0;
  for (; j + 32 <= len; j += 32) {
    __builtin_prefetch(s.pf_in + 2 * j, 0, 2);
    __builtin_prefetch(s.pf_out + 2 * j, 1, 2);
#pragma GCC unroll 4
    for (uint32_t i = j; i < j + 32; i += 8) {
      s.cnt[0][s.sym[i]]++;
      s.cnt[1][s.sym[i + 1]]++;
      s.cnt[2][s.sym[i + 2]]++;
      s.cnt[3][s.sym[i + 3]]++;
      s.cnt[0][s.sym[i + 4]]++;
      s.cnt[1][s.sym[i + 5]]++;
      s.cnt[2][s.sym[i + 6]]++;
      s.cnt[3][s.sym[i + 7]]++;
    }
  }
  for (; j < len; ++j) s.cnt[0][s.sym[j]]++;
  // Sum the lanes (and clear them for the next block) for exponents in [emin,
  // emax] (the lanes are zero elsewhere), each sign half contiguous (vector
  // loops).
  for (uint32_t sg = 0; sg < 2; ++sg) {
    uint16_t* const h = s.half[sg];
    for (uint32_t e = emin; e < eend; ++e) {
      const uint32_t u = sg * AE + e;
      h[e] = (uint16_t)(s.cnt[0][u] + s.cnt[1][u] + s.cnt[2][u] + s.cnt[3][u]);
      s.cnt[0][u] = s.cnt[1][u] = s.cnt[2][u] = s.cnt[3][u] = 0;
    }
  }
  }
  // Interleave the sign halves into J order (symbol 2 e + s) and kind E's.
  for (uint32_t e = emin; e < eend; ++e) {
    const uint32_t p = s.half[0][e], m = s.half[1][e];
    s.c[kKindJ][2 * e] = p;
    s.c[kKindJ][2 * e + 1] = m;
    s.c[kKindE][e] = p + m;
  }
  uint32_t sym_end[2];
  sym_end[kKindE] = eend;
  sym_end[kKindJ] = 2 * emax + 1 + (s.half[1][emax] != 0);  // 1 + the largest J symbol
  // Kind Z (zero elision) needs an element with exponent 0 and no subnormal: the
  // smallest |v| is then 0, and the smallest nonzero |v| is >= 2^M. Blocks whose
  // smallest |v| is not 0 (no zero, or a subnormal smallest) skip the scan.
  const bool zok = mna == 0 && no_subnormal<t.mbits>(x, len);
  const uint32_t z = zok ? s.half[0][0] + s.half[1][0] : 0;  // elements with e = 0 (+-0)

  // Candidate sizes in the tie order CONST-E, CONST-J, CONST-Z, HUFF-E, HUFF-J,
  // HUFF-Z, RAW.
  // RAW comes last in the tie order: a candidate of RAW's size wins (fp16 CONST-J
  // of one element, 6 bytes, since format version 4).
  uint32_t best = max_block_bytes(len) + 1;
  int best_kind = -1;  // -1 = RAW
  bool best_const = false;
  uint32_t nib[2] = {0, 0}, area[2] = {0, 0}, one_sym[2];
  for (uint32_t kind = 0; kind < 2; ++kind) one_sym[kind] = sym_end[kind] - 1;
  // Kind J can only pay when the sign is predictable from the exponent: the sign
  // costs at least 1 - |1 - 2p| bits, so J saves at most sum_e |c+ - c-| bits. It
  // is tried when 16 * that imbalance >= len (format rule; skipping package-merge
  // for J halves the code-length work on symmetric data), or when kind Z applies
  // and 16 z >= len (its raw planes drop z values of M bits).
  uint32_t imb = 0;
  for (uint32_t e = emin; e < sym_end[kKindE]; ++e) {
    const int32_t d = (int32_t)s.c[kKindJ][2 * e] - (int32_t)s.c[kKindJ][2 * e + 1];
    imb += (uint32_t)(d < 0 ? -d : d);
  }
  uint32_t k[2];
  k[kKindE] = code_lengths_pick<Fast>(s.c[kKindE], a0[kKindE], sym_end[kKindE], s.len[kKindE], s.pm);
  if (16 * imb >= len || (zok && 16 * z >= len)) {
    k[kKindJ] = code_lengths_pick<Fast>(s.c[kKindJ], a0[kKindJ], sym_end[kKindJ], s.len[kKindJ], s.pm);
  } else {
    k[kKindJ] = 0;
    for (uint32_t a = a0[kKindJ]; a < sym_end[kKindJ]; ++a) k[kKindJ] += s.c[kKindJ][a] != 0;
    if (k[kKindJ] >= 2) k[kKindJ] = 0;  // not a HUFF-J candidate (and not CONST-J)
  }
  // size[coding_index * 3 + kind]: CONST-E, CONST-J, CONST-Z, HUFF-E, HUFF-J, HUFF-Z.
  uint32_t size[6] = {~0u, ~0u, ~0u, ~0u, ~0u, ~0u};
  for (uint32_t kind = 0; kind < 2; ++kind)
    if (k[kind] == 1) size[kind] = kBlockHead + t.raw_bytes(kind, len);
  if (zok && k[kKindJ] == 1) size[kKindZ] = kBlockHead;  // all +0 or all -0: no raw planes
  for (uint32_t kind = 0; kind < 2; ++kind) {
    if (k[kind] < 2) continue;
    uint64_t bits = 0;
    for (uint32_t a = a0[kind]; a < sym_end[kind]; ++a) bits += (uint64_t)s.c[kind][a] * s.len[kind][a];
    nib[kind] = write_lengths(s.len[kind], sym_end[kind], s.nibs[kind], a0[kind]);
    area[kind] = (uint32_t)((bits + 7) / 8);
    size[3 + kind] = kHuffHead + nib[kind] + area[kind] + t.raw_bytes(kind, len);
  }
  // HUFF-Z: HUFF-J's code and streams, the raw planes of the len - z nonzero values.
  if (zok && k[kKindJ] >= 2) size[3 + kKindZ] = kHuffHead + nib[kKindJ] + area[kKindJ] + t.raw_bytes(kKindJ, len - z);
  for (int c = 0; c < 6; ++c)
    if (size[c] < best) {
      best = size[c];
      best_kind = c % 3;
      best_const = c < 3;
    }

  if (pair_hist && (best_kind < 0 || best_const)) {
    // The pair writer spreads the block's prefetches over its loop; RAW and CONST
    // blocks of the pair path issue them here (rare: a single exponent, or data
    // that does not compress).
    for (uint32_t o = 0; o < kPfBytes; o += 64) {
      __builtin_prefetch(s.pf_in + o, 0, 2);
      __builtin_prefetch(s.pf_out + o, 1, 2);
    }
  }
  if (best_kind < 0) {  // RAW: the words verbatim
    best = max_block_bytes(len);
    *raw = true;
    std::memset(out, 0, kBlockHead);
    std::memcpy(out + kBlockHead, x, 2 * (size_t)len);
    return best;
  }
  *raw = false;
  const uint32_t kind = (uint32_t)best_kind;  // the mode's kind (E, J or Z)
  const uint32_t ck = Traits::sym_kind(kind);  // the symbols' kind (Z codes J symbols)
  if (best_const) {
    out[0] = (uint8_t)(kConst | (kind << 2));
    out[1] = 0;
    st16(out + 2, one_sym[ck]);
    if (kind != kKindZ) write_raw_kind<D, Fast>(kind, x, len, out + kBlockHead);
    return best;
  }
  out[0] = (uint8_t)(kHuff | (kind << 2));
  out[1] = 0;
  st16(out + 2, sym_end[ck]);
  uint8_t* nib_out = out + kHuffHead;
  std::memcpy(nib_out, s.nibs[ck], nib[ck]);
  // Canonical codes (entropy_format.h canonical_codes: (length, symbol) order),
  // written straight into the J-symbol-indexed tables (kind E: both signs).
  {
    const uint8_t* ln = s.len[ck];
    // Lengths counted in 4 lanes: most symbols below sym_end are absent (length
    // 0), and one counter's store-to-load chain cost ~4% of the encoder's time.
    uint32_t nl4[4][kMaxLen + 1] = {}, nl[kMaxLen + 1], next[kMaxLen + 1];
    uint32_t a4 = a0[ck];
    for (; a4 + 4 <= sym_end[ck]; a4 += 4) {
      nl4[0][ln[a4]]++;
      nl4[1][ln[a4 + 1]]++;
      nl4[2][ln[a4 + 2]]++;
      nl4[3][ln[a4 + 3]]++;
    }
    for (; a4 < sym_end[ck]; ++a4) nl4[0][ln[a4]]++;
    for (uint32_t l = 0; l <= kMaxLen; ++l) nl[l] = nl4[0][l] + nl4[1][l] + nl4[2][l] + nl4[3][l];
    uint32_t c = 0;
    for (uint32_t l = 1; l <= kMaxLen; ++l) {
      next[l] = c;
      c = (c + nl[l]) << 1;
    }
    for (uint32_t a = a0[ck]; a < sym_end[ck]; ++a) {
      const uint32_t l = ln[a];
      if (!l) continue;
      const uint32_t code = next[l]++;
      if (ck == kKindE) {  // u = e and AE + e
        s.ccode[a] = s.ccode[AE + a] = code;
        s.clen[a] = s.clen[AE + a] = (uint8_t)l;
      } else {  // symbol a = e << 1 | s: u = s << (E + q) | e
        const uint32_t u = (a & 1) * AE + (a >> 1);
        s.ccode[u] = code;
        s.clen[u] = (uint8_t)l;
      }
    }
  }

  // Per code: load the symbol, its length, shift, OR the code from memory:
  // separate length and u64 code arrays avoid unpacking an entry.
  const uint64_t* const ccode = s.ccode;
  const uint8_t* const clen = s.clen;
  auto push = [ccode, clen](BitWriter& w, uint32_t a) {
    const uint32_t l = clen[a];
    w.acc = (w.acc << l) | ccode[a];
    w.nacc += l;
  };
  uint32_t bits_total;
  // The pair writer runs exactly when the histogram was by pairs and the block
  // is HUFF-E; the single-code writers read u per element.
  const bool pair_writer = pair_hist;  // HUFF-E or HUFF-J
  uint8_t* const area_out = nib_out + nib[ck];
  if (!pair_writer && !have_sym)
    for (uint32_t j = 0; j < len; ++j) s.sym[j] = (uint16_t)(x[j] >> t.lbits());
#if EZ_X86
  if (pair_writer) {
    // Pair writer (kPairMaxR): the same bits as the single-code writers below,
    // two elements a push. Table rows of absent symbols are never read; entries
    // with an absent second symbol are never read either (length 0 there).
    // Kind J: slots us = sg << 5 | e' are the J symbols 2 (emin + e') + sg, the
    // table indexed by the histogram's bins (s.pbin); kind E: slots e', indexed
    // by s.pidx. Both from the histogram pass.
    const uint32_t R = pair_r;
    uint64_t ce[64], le[64];
    uint8_t le8[64];
    const uint16_t* pair_at;
    if (ck == kKindE) {
      for (uint32_t b = 0; b < 32; ++b) {
        const uint32_t l = b < R ? s.len[kKindE][emin + b] : 0;
        le[b] = l;
        le8[b] = (uint8_t)l;
        ce[b] = l ? s.ccode[emin + b] : 0;
      }
      pair_table_fast<1>(ce, le, le8, R, s.pcode, s.plen);
      pair_at = s.pidx;
    } else {
      for (uint32_t b = 0; b < 64; ++b) {
        const uint32_t sg = b >> 5, e = emin + (b & 31);
        const uint32_t a = 2 * e + sg;  // the J symbol of slot b (< sym_end: its length is this block's)
        const uint32_t l = (b & 31) < R && a < sym_end[kKindJ] ? s.len[kKindJ][a] : 0;
        le[b] = l;
        le8[b] = (uint8_t)l;
        ce[b] = l ? s.ccode[sg * AE + e] : 0;  // ccode is indexed by u = s << (E + q) | e
      }
      pair_table_fast<2>(ce, le, le8, R, s.pcode, s.plen);
      pair_at = s.pbin;
    }
    // Two writers as below (streams 0..3 and 4..7), 2 pairs (<= 44 bits + < 8
    // pending <= 64) a flush: a stream's 512 elements are 128 groups of 4.
    uint64_t acc_a = 0, acc_b = 0;
    uint32_t P_a = 0, P_b = 0;
#define EZ_PUSH2(acc, P, pi)              \
  do {                                    \
    const uint32_t l_ = s.plen[pi];       \
    acc = (acc << l_) | s.pcode[pi];      \
    P += l_;                              \
  } while (0)
    // ANDN (BMI1; inline asm: GCC keeps ~7 in a register and still copies P0
    // before an AND, as P0 is needed for the byte offset too) clears P0's low 3
    // bits into a new register: 5 instructions a flush instead of 6. Only the
    // AVX2/BMI2 path gets here (pair_writer).
    uint32_t seven = 7;
#define EZ_FLUSH(acc, P0, P, buf)                                                  \
  do {                                                                             \
    uint32_t b_;                                                                   \
    asm("andn %[p0], %[m], %[b]" : [b] "=r"(b_) : [m] "r"(seven), [p0] "r"(P0)); \
    store_be64((buf) + ((P0) >> 3), (acc) << ((b_ - (P)) & 63));                   \
  } while (0)
    uint32_t before_a = 0, before_b = 0;
    constexpr uint32_t kHalfPairs = kStreams / 2 * kStreamLen / 2;  // stream st + 4's first pair
    const uint16_t* pa = pair_at;
    // The block's prefetches (EncScratch::pf_in / pf_out: one line of each per
    // iteration, 128 = 8 KiB each) are spread over this loop, the block's longest:
    // in the pair histogram (half the old histogram's length) they came in bursts.
    // Their addresses are affine in pa (8 pairs = 16 bytes of pa per 64-byte
    // line): bias + 4 pa, one addressing mode, no prefetch pointers to step (with
    // two writers' state GCC kept them on the stack: 5 more instructions an
    // iteration, 2 of them a reload and a store).
    const uintptr_t pf_in_bias = (uintptr_t)s.pf_in - 4 * (uintptr_t)pa;
    const uintptr_t pf_out_bias = (uintptr_t)s.pf_out - 4 * (uintptr_t)pa;
    static_assert(kStreams / 2 * (kStreamLen / 16) * 64 == kPfBytes, "one line of each an iteration");
    for (uint32_t st = 0; st < kStreams / 2; ++st) {
      // Four groups of each writer an iteration (the loop's own 3 instructions
      // were ~10% of it at one group).
#define EZ_GROUPS(q)                                  \
  do {                                                \
    const uint32_t p0a = P_a, p0b = P_b;              \
    EZ_PUSH2(acc_a, P_a, pa[q]);                      \
    EZ_PUSH2(acc_a, P_a, pa[(q) + 1]);                \
    EZ_FLUSH(acc_a, p0a, P_a, area_out);              \
    EZ_PUSH2(acc_b, P_b, pa[kHalfPairs + (q)]);       \
    EZ_PUSH2(acc_b, P_b, pa[kHalfPairs + (q) + 1]);   \
    EZ_FLUSH(acc_b, p0b, P_b, s.bits2);               \
  } while (0)
      const uint16_t* const pa_end = pa + kStreamLen / 2;
      for (; pa < pa_end; pa += 8) {
        __builtin_prefetch(reinterpret_cast<const void*>(pf_in_bias + 4 * (uintptr_t)pa), 0, 2);
        __builtin_prefetch(reinterpret_cast<const void*>(pf_out_bias + 4 * (uintptr_t)pa), 1, 2);
        EZ_GROUPS(0);
        EZ_GROUPS(2);
        EZ_GROUPS(4);
        EZ_GROUPS(6);
      }
#undef EZ_GROUPS
      end_stream_pair(out, st, P_a, P_b, &before_a, &before_b);
    }
#undef EZ_PUSH2
#undef EZ_FLUSH
    // The first writer wrote streams 0..3 in place (no copy of the area): its
    // flushes and the join store up to 16 bytes past the area's end, into the
    // raw planes written below or, for a HUFF-Z block with few raw values, past
    // the block into bytes a later block, the zero padding or the zeroed tail
    // rewrite (the block is smaller than RAW, which the row's layout leaves room for).
    bits_total = join_writers(area_out, before_a, s.bits2, P_b, before_b);
  } else
#endif
  if (len == kBlock) {
    // Two writers, streams 0..3 into s.bits and 4..7 into s.bits2, advanced in
    // turn: each accumulator's shift-OR chain (2 cycles a code) overlaps the
    // other's. Then the second area is appended at the first one's end bit.
    // Plain locals (not BitWriter objects): GCC then keeps both writers' state in
    // registers instead of on the stack (a store and a load on each accumulator's
    // chain per flush).
    uint64_t acc_a = 0, acc_b = 0;
    // Each writer's state is its accumulator and P, the bits pushed so far: a
    // flush stores at byte P0 / 8 (P0 = P before the group: the pending bits
    // start at bit P0 & ~7) the word acc << (64 - n), n = P - (P0 & ~7) in
    // [1, 62] bits, i.e. a shift by ((P0 & ~7) - P) mod 64. Two registers a
    // writer instead of three (acc, pending count, byte pointer: GCC spilled the
    // writers' state) and 6 instructions a flush instead of 8.
    uint32_t P_a = 0, P_b = 0;
#define EZ_PUSH(acc, P, sym)           \
  do {                                 \
    const uint32_t l_ = s.clen[sym];   \
    acc = (acc << l_) | s.ccode[sym];  \
    P += l_;                           \
  } while (0)
#define EZ_FLUSH(acc, P0, P, buf)                                   \
  store_be64((buf) + ((P0) >> 3), (acc) << ((((P0) & ~7u) - (P)) & 63))
    uint32_t before_a = 0, before_b = 0;
    constexpr uint32_t kHalf = kStreams / 2 * kStreamLen;  // stream st + 4 starts here
    for (uint32_t st = 0; st < kStreams / 2; ++st) {
      const uint16_t* sa = s.sym + st * kStreamLen;
      constexpr uint32_t groups = kStreamLen / kSymsPerRefill;  // 102, then 2 codes
      for (uint32_t g = 0; g < groups; ++g, sa += kSymsPerRefill) {
        const uint32_t p0a = P_a, p0b = P_b;
        EZ_PUSH(acc_a, P_a, sa[0]);
        EZ_PUSH(acc_a, P_a, sa[1]);
        EZ_PUSH(acc_a, P_a, sa[2]);
        EZ_PUSH(acc_a, P_a, sa[3]);
        EZ_PUSH(acc_a, P_a, sa[4]);
        EZ_FLUSH(acc_a, p0a, P_a, s.bits);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 0]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 1]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 2]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 3]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 4]);
        EZ_FLUSH(acc_b, p0b, P_b, s.bits2);
      }
      const uint32_t p0a = P_a, p0b = P_b;
      for (uint32_t i = 0; i < kStreamLen - groups * kSymsPerRefill; ++i) {
        EZ_PUSH(acc_a, P_a, sa[i]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + i]);
      }
      EZ_FLUSH(acc_a, p0a, P_a, s.bits);
      EZ_FLUSH(acc_b, p0b, P_b, s.bits2);
      end_stream_pair(out, st, P_a, P_b, &before_a, &before_b);
    }
#undef EZ_PUSH
#undef EZ_FLUSH
    bits_total = join_writers(s.bits, before_a, s.bits2, P_b, before_b);
  } else {
    BitWriter w;
    w.init(s.bits);
    uint32_t before = 0;
    for (uint32_t st = 0; st < kStreams; ++st) {
      const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
      const uint16_t* sp = s.sym + j0;
      const uint16_t* const se = s.sym + j1;
      for (; se - sp >= (ptrdiff_t)kSymsPerRefill; sp += kSymsPerRefill) {
#pragma GCC unroll 5
        for (uint32_t i = 0; i < kSymsPerRefill; ++i) push(w, sp[i]);
        w.flush();
      }
      for (; sp < se; ++sp) push(w, *sp);
      if (j1 > j0) w.flush();
      const uint32_t now = w.bits_since(s.bits);
      st16(out + kBlockHead + 2 * st, now - before);
      before = now;
    }
    bits_total = before;
  }
  (void)bits_total;
  if (!pair_writer) std::memcpy(area_out, s.bits, area[ck]);
  if (kind == kKindZ) {
    // Kind Z: the kind J planes of the words with e != 0 (|v| != 0 in a Z-valid
    // block), compacted in element order into s.sym (the bit writers are done with
    // it; a separate array would grow the zero-initialized scratch).
    uint32_t nz;
#if EZ_X86
    if (Fast) nz = compact_nonzero_fast(x, len, s.sym);
    else
#endif
      nz = compact_nonzero(x, len, s.sym);
    write_raw_kind<D, Fast>(kKindJ, s.sym, nz, area_out + area[ck]);
  } else {
    write_raw_kind<D, Fast>(kind, x, len, area_out + area[ck]);
  }
  return best;
}

// ---------------------------------------------------------------------------------
// Block decoder.

// The code lengths of a HUFF block as read by read_lengths (entropy_format.h),
// bucketed by length: sym[l][0, n[l]) = the symbols of length l in ascending
// order, i.e. the canonical (length, symbol) order without a sort.
struct LenBuckets {
  uint32_t n[kMaxLen + 1];
  uint16_t sym[kMaxLen + 1][kMaxAlphabet];
};

// read_lengths with its validation (same results, same -1 cases), writing
// buckets instead of a length array. Returns the bytes used or -1.
EZ_INLINE int32_t read_lengths_bucketed(const uint8_t* p, uint32_t avail, uint32_t sym_end, uint32_t A,
                                        LenBuckets& b) {
  if (sym_end == 0 || sym_end > A) return -1;
  for (uint32_t l = 0; l <= kMaxLen; ++l) b.n[l] = 0;
  uint32_t nn = 0, a = 0, last = 0;  // last = 1 + the last present symbol
  const uint32_t max_nn = 2 * avail;
  while (a < sym_end) {
    if (nn >= max_nn) return -1;
    const uint32_t v = (p[nn >> 1] >> (4 * (nn & 1))) & 15;
    ++nn;
    if (v <= kMaxLen) {
      if (v) {
        b.sym[v][b.n[v]++] = (uint16_t)a;
        last = a + 1;
      }
      ++a;
    } else if (v == 15) {
      if (nn + 2 > max_nn) return -1;
      const uint32_t lo = (p[nn >> 1] >> (4 * (nn & 1))) & 15;
      const uint32_t hi = (p[(nn + 1) >> 1] >> (4 * ((nn + 1) & 1))) & 15;
      nn += 2;
      a += (lo | (hi << 4)) + 3;
    } else {
      return -1;
    }
  }
  if (a != sym_end || last != sym_end) return -1;
  if ((nn & 1) && ((p[nn >> 1] >> 4) != 0)) return -1;  // padding nibble must be zero
  return (int32_t)((nn + 1) / 2);
}

struct DecScratch {
  LenBuckets lb;
  // Decode table, indexed by the next 11 bits of a stream; an entry holds the 1 to
  // 3 symbols whose codes fit in those bits (their concatenation), as 4 16-bit
  // words (stored as they are into sv; a symbol's value bits are its sign/exponent
  // fields, bf16 bits >= 7, fp16 >= 10, so the low nibble of each word is free):
  //   word 0  symbol 1's value bits | the bits the entry consumes (l1 [+ l2 [+ l3]])
  //   word 1  symbol 2's value bits | l1                (value 0 with 1 symbol)
  //   word 2  symbol 3's value bits | l1 + l2 (2+ symbols, else 0)
  //   word 3  output advance in bytes: 2 x the symbols (2, 4 or 6)
  // The join masks the low nibbles off (bits the raw planes own); word 3 and the
  // words past the entry's symbols land on output slots that the stream's next
  // entry (or the tail) overwrites. A 64-bit shift by the entry shifts by its
  // length (x86 counts are taken mod 64; bits 4, 5 are 0). Gaussian bf16:
  // ~2.85 symbols a lookup (1.99 with at most 2), fp16 ~2.46 (its codes are
  // ~3.5 bits against bf16's ~2.6; see the table build for the pairs and
  // triples left out).
  uint64_t tab[kTableSize];
  // Table build (decode_block_impl), per symbol in canonical order: its parts of
  // an entry as symbol 1, 2 and 3 (entries are sums of these: no field carries
  // into the next; c1's low nibble is the symbol's length).
  uint64_t c1[kMaxAlphabet], c2[kMaxAlphabet], c3[kMaxAlphabet];
  // third[2^m + i], m = 1..9, i < 2^m: c3 of the symbol whose code prefixes the
  // m-bit value i, or 0 when none fits (the entries of an (s1, s2) region are
  // c1[s1] + c2[s2] + third[2^m + i], m = 11 - l1 - l2).
  uint64_t third[1u << (kMaxLen - 1)];
  // The c1 list of the codes of <= 6 bits whose regions s.tab holds (see the
  // table build); sig_n = ~0u: none yet.
  uint64_t sig[64];
  uint32_t sig_n;
  uint8_t area[kMaxAreaBytes + kStreamLen * kMaxLen / 8 + 8];
  uint16_t sv[kBlock];       // decoded symbol values (L1), merged with the raw planes into y
  uint16_t zraw[kBlock + 8];  // kind Z: the block's raw values (elements with e != 0), in order
  // Prefetch targets for the decode rounds (see decode_row_t): a later block's
  // payload bytes and the output words of the next block.
  const uint8_t* pf_in;
  uint8_t* pf_out;
};

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

// The hot loop's constants (decode_block_impl: shift counts in registers).
struct DecodeRegs {
  const uint8_t* p;    // the bit area
  const uint64_t* tab; // DecScratch::tab
  uint8_t* out;        // DecScratch::sv as bytes
  uint32_t top, c3, c48, not7;  // 64 - 11, 3, 48, ~7
};

// 5 lookups from one refill at bit *qp (55 bits <= the 57 valid), output at
// byte oo. The refill sets bit 0 as a marker (the window's bit 63 - q % 8 >= 56,
// never read): after the shifts its position is the bits consumed, added to *qp.
// (oo by value, not a reference to the caller's local: the asm's memory clobber
// would reload anything reached through memory.)
template <bool Fast>
EZ_INLINE void lookups5(const DecodeRegs r, uint32_t* qp, uint32_t& oo_ref) {
  uint64_t buf;
  uint32_t oo = oo_ref;
#if EZ_X86
  if constexpr (Fast) {
    // The bit position stays in memory (the 8 streams' positions and output
    // offsets do not fit in registers): one load here, and the end adds the bits
    // consumed to it in place (GCC: one ADD to memory instead of an add and a
    // store). (Reading it as the memory operand of both SHRX and ANDN, and the
    // add in asm, saved 0.09 more instructions an element but ran ~2% slower
    // on fp16 in 4 of 5 A/B runs: two loads of the just-stored position.)
    // The bit offset q % 8 by one ANDN (GCC otherwise copies q and ANDs).
    uint32_t sh;
    const uint32_t q = *qp;
    asm("andn %[q], %[not7], %[sh]" : [sh] "=r"(sh) : [q] "r"(q), [not7] "r"(r.not7));
    buf = (__builtin_bswap64(load64(r.p + (q >> r.c3))) << sh) | 1;
  } else
#endif
  {
    const uint32_t q = *qp;
    buf = (__builtin_bswap64(load64(r.p + (q >> r.c3))) << (~r.not7 & q)) | 1;
  }
#if EZ_X86
  if constexpr (Fast) {
    // 5 instructions a lookup: the output advance (word 3) is added straight
    // from the entry's memory by a 16-bit add (oo < 2^14, so the register's
    // upper bits stay 0 for the addressing).
    uint64_t oo64 = oo, idx, e;
    const uint64_t top64 = r.top;
#pragma GCC unroll 5
    for (uint32_t i = 0; i < kSymsPerRefill; ++i) {
      asm("shrx %[top], %[buf], %[idx]\n\t"
          "movq (%[tab],%[idx],8), %[e]\n\t"
          "movq %[e], (%[out],%[oo],1)\n\t"
          "shlx %[e], %[buf], %[buf]\n\t"
          "addw 6(%[tab],%[idx],8), %w[oo]"
          : [buf] "+r"(buf), [oo] "+r"(oo64), [idx] "=&r"(idx), [e] "=&r"(e)
          : [top] "r"(top64), [tab] "r"(r.tab), [out] "r"(r.out)
          : "memory", "cc");
    }
    oo = (uint32_t)oo64;
    *qp += (uint32_t)__builtin_ctzll(buf);
  } else
#endif
  {
#pragma GCC unroll 5
    for (uint32_t i = 0; i < kSymsPerRefill; ++i) {
      const uint64_t e = r.tab[buf >> r.top];
      buf <<= (e & 63);
      std::memcpy(r.out + oo, &e, 8);
      oo += (uint32_t)(e >> r.c48);
    }
    *qp += (uint32_t)__builtin_ctzll(buf);
  }
  oo_ref = oo;
}

// Rounds over the 8 streams of 5 lookups each. A lookup emits <= 3 symbols and
// stores 4 words, so R rounds stay inside a stream's output (and decode no more
// than its symbols) while every stream has >= 15 R + 1 symbols left. (Two
// groups a stream a round, q and oo kept in registers between them, ran ~7%
// slower at 64 MiB despite fewer instructions: one stream's longer dependency
// chain.)
template <bool Fast>
EZ_INLINE void decode_rounds(const DecodeRegs r, uint32_t* pos, uint32_t* o, const uint32_t* oend,
                             const uint8_t*& pf_in_ref, uint8_t*& pf_out_ref) {
  constexpr uint32_t kRoundSyms = 3 * kSymsPerRefill;
  const uint8_t* pf_in = pf_in_ref;
  uint8_t* pf_out = pf_out_ref;
  for (;;) {
    uint32_t left = kStreamLen;
    for (uint32_t st = 0; st < kStreams; ++st) left = std::min(left, (oend[st] - o[st]) / 2);
    uint32_t rounds = left ? (left - 1) / kRoundSyms : 0;
    if (!rounds) break;
    for (; rounds; --rounds) {
      // 4 + 3 lines a round (~2.85 symbols a lookup on Gaussian data: ~35
      // rounds a block): ~9 KiB of the output a block (the next block's 8 KiB)
      // and ~6.7 KiB of a later block's payload (~5.4 KiB).
      __builtin_prefetch(pf_out, 1, 2);
      __builtin_prefetch(pf_out + 64, 1, 2);
      __builtin_prefetch(pf_out + 128, 1, 2);
      __builtin_prefetch(pf_out + 192, 1, 2);
      __builtin_prefetch(pf_in, 0, 2);
      __builtin_prefetch(pf_in + 64, 0, 2);
      __builtin_prefetch(pf_in + 128, 0, 2);
      pf_out += 256;
      pf_in += 192;
#pragma GCC unroll 8
      for (uint32_t st = 0; st < kStreams; ++st) {
        uint32_t oo = o[st];
        lookups5<Fast>(r, pos + st, oo);
        o[st] = oo;
      }
    }
  }
  pf_in_ref = pf_in;
  pf_out_ref = pf_out;
}

// Decodes one block of `size` bytes at blk (avail = readable bytes from blk on,
// >= size) into y[0, len). Returns a DecodeStatus (6 or 7 on a bad block).
template <DtypeCode D, bool Fast>
EZ_INLINE int32_t decode_block_impl(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len,
                                    uint16_t* y, DecScratch& s) {
  constexpr Traits t = traits<D>();
  if (size < kBlockHead || blk[1] != 0) return kDecBadTable;
  const uint32_t mode = blk[0];
  const uint32_t coding = mode & 3, kind = mode >> 2;
  if (coding == kRaw) {
    if (mode != 0 || ld16(blk + 2) != 0 || size != max_block_bytes(len)) return kDecBadTable;
    std::memcpy(y, blk + kBlockHead, 2 * (size_t)len);
    return kDecOk;
  }
  if (kind > kKindZ || coding > kHuff) return kDecBadTable;
  const bool zk = kind == kKindZ;
  const uint32_t A = t.alphabet(kind);
  // Kind Z's raw-plane size r is what the block has left after its streams
  // (checked below); E and J's is fixed by len.
  const uint32_t rawb = zk ? 0 : t.raw_bytes(kind, len);
  if (zk && coding == kConst) {  // CONST-Z: every element +0 (symbol 0) or -0 (1)
    const uint32_t sym = ld16(blk + 2);
    if (sym >= 2 || size != kBlockHead) return kDecBadTable;
    const uint16_t v = (uint16_t)(sym << 15);
    for (uint32_t j = 0; j < len; ++j) y[j] = v;
    return kDecOk;
  }
  if (coding == kConst) {
    const uint32_t sym = ld16(blk + 2);
    if (sym >= A || size != kBlockHead + rawb) return kDecBadTable;
    const uint16_t v = (uint16_t)t.sym_bits(kind, sym);
    for (uint32_t j = 0; j < len; ++j) y[j] = v;
    or_raw_kind<D, Fast>(kind, blk + kBlockHead, len, y, y, 0xFFFF);
    return kDecOk;
  }
  // HUFF.
  if (size < kHuffHead + rawb) return kDecBadTable;
  const uint32_t sym_end = ld16(blk + 2);
  LenBuckets& lb = s.lb;
  const int32_t nib = read_lengths_bucketed(blk + kHuffHead, size - kHuffHead - rawb, sym_end, A, lb);
  if (nib < 0) return kDecBadTable;
  // The Kraft sum must be exactly 2^11 (a complete code: every index decodes).
  uint32_t kraft = 0;
  for (uint32_t l = 1; l <= kMaxLen; ++l) kraft += lb.n[l] << (kMaxLen - l);
  if (kraft != kTableSize) return kDecBadTable;
  uint32_t start[kStreams + 1];
  start[0] = 0;
  for (uint32_t st = 0; st < kStreams; ++st) {
    const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
    const uint32_t cnt = j1 - j0, b = ld16(blk + kBlockHead + 2 * st);
    if (b < cnt || b > kMaxLen * cnt) return kDecBadTable;
    start[st + 1] = start[st] + b;
  }
  const uint32_t total = start[kStreams];
  const uint32_t ab = (total + 7) / 8;
  const uint32_t area_off = kHuffHead + (uint32_t)nib;
  if (zk) {
    // HUFF-Z: r = size - area_off - ab in [0, raw_bytes(J, len)]; r must equal
    // raw_bytes(J, nz), checked once the symbols are decoded (zero_join).
    if (size < area_off + ab || size - (area_off + ab) > t.raw_bytes(kKindJ, len)) return kDecBadTable;
  } else if (size != area_off + ab + rawb) {
    return kDecBadTable;
  }
  // Padding bits after the last code (the low bits of the last byte) are zero.
  if ((total & 7) && (blk[area_off + ab - 1] & ((1u << (8 - (total & 7))) - 1))) return kDecBadStream;

  // Decode table: symbol s1 (canonical order) owns the 2^m1 indexes after its
  // code (m1 = 11 - l1); inside them the remaining bits start with the code of
  // each s2 with l1 + l2 <= kPairBits, in canonical order (2^m2 indexes each, m2
  // = m1 - l2 >= 11 - kPairBits), and the indexes after those (longer codes)
  // hold s1 alone. An (s1, s2) region is c1 + c2 + the third-symbol table of its
  // m2 bits. Rarer pairs (l1 + l2 > kPairBits: bf16 < 3% of lookups on Gaussian
  // data, 2.85 instead of 2.92 symbols a lookup) would cost more to build than
  // they save: they keep 1 symbol. The s1 of one length have regions that differ
  // only by c1: the first is built, the others are it plus the difference. The
  // regions are written by length (fill_runs, add_runs): the symbols of one
  // length take regions of one size.
  //
  // Only codes of <= kShortBits bits take part in pairs and triples, so the
  // regions of those codes (the table's first `pre` entries: ~97% of it on
  // Gaussian data) depend only on their (length, value) list, kept in s.sig:
  // when a block's list equals the previous block's (1/3 to 2/3 of Gaussian
  // blocks), they are still in s.tab and only the longer codes' regions (single
  // symbols) are written again.
  {
    // Pairs of up to kPairBits bits from codes of up to kShortBits bits. fp16's
    // codes are longer (~3.5 bits an element on Gaussian data against bf16's
    // ~2.6: its symbols carry m9), so its pairs go up to 10 bits (2.46 instead
    // of 2.31 symbols a lookup; the runs below keep the small regions cheap).
    // bf16 gained nothing from longer pairs (4.64 -> 4.64 instructions an
    // element at 9 bits, 4.66 at 10).
    constexpr uint32_t kPairBits = D == kF16 ? 10 : 8, kShortBits = 6;
    uint32_t k = 0, pre = 0, P = 0;
    uint32_t kst[kMaxLen + 1];  // canonical index of the first symbol of each length
    for (uint32_t l = 1; l <= kMaxLen; ++l) {
      // (Locals: stores through s would make GCC reload lb.n[l] and k.)
      const uint32_t n = lb.n[l];
      const uint16_t* const sym = lb.sym[l];
      uint64_t* const c1 = s.c1 + k;
      const uint64_t part = l | (l << 16) | ((uint64_t)l << 32) | (2ull << 48);
      for (uint32_t i = 0; i < n; ++i) {
        asm("" : "+r"(i));  // a few symbols a length: not worth GCC's vector loop
        c1[i] = t.sym_bits(kind, sym[i]) | part;
      }
      kst[l] = k;
      k += n;
      if (l == kShortBits) {
        P = k;
        pre = 0;
        for (uint32_t l2 = 1; l2 <= kShortBits; ++l2) pre += lb.n[l2] << (kMaxLen - l2);
      }
    }
    uint32_t lmin = 1;
    while (!lb.n[lmin]) ++lmin;  // (a complete code has a shortest length <= 11)
    if (!(P == s.sig_n && std::memcmp(s.sig, s.c1, sizeof(uint64_t) * P) == 0)) {
      for (uint32_t i = 0; i < P; ++i) {
        const uint64_t l = s.c1[i] & kLenMask, v = s.c1[i] & 0xFFF0;  // value bits >= 7 (bf16), >= 9 (fp16)
        s.c2[i] = l | (v << 16) | (l << 32) | (2ull << 48);
        s.c3[i] = l | (v << 32) | (2ull << 48);
      }
      // The third-symbol tables that regions use: m2 = 11 - l1 - l2 in
      // [11 - kPairBits, 11 - 2 lmin].
      for (uint32_t m = kMaxLen - kPairBits; m + 2 * lmin <= kMaxLen; ++m) {
        uint64_t* d = s.third + (1u << m);
        uint64_t* const end = d + (1u << m);
        for (uint32_t l3 = lmin; l3 <= std::min(m, kShortBits); ++l3)
          d = fill_runs(d, m - l3, s.c3 + kst[l3], lb.n[l3]);
        for (; d < end; ++d) *d = 0;
      }
      uint64_t* dst = s.tab;
      for (uint32_t l1 = lmin; l1 <= kShortBits; ++l1) {
        const uint32_t n1 = lb.n[l1], m1 = kMaxLen - l1;
        if (!n1) continue;
        const uint64_t* const c1 = s.c1 + kst[l1];
        if (l1 + lmin > kPairBits) {
          dst = fill_runs(dst, m1, c1, n1);
          continue;
        }
        // The first s1 of this length: its pair regions by s2 length, then s1
        // alone; the others are it plus the difference of c1.
        uint64_t* const built = dst;
        uint64_t* const end = dst + (1u << m1);
        for (uint32_t l2 = lmin; l2 <= std::min(kShortBits, kPairBits - l1); ++l2)
          dst = add_runs(dst, m1 - l2, s.third + (1u << (m1 - l2)), s.c2 + kst[l2], lb.n[l2], c1[0]);
        uint32_t left = (uint32_t)(end - dst);
        for (; left & 7; left &= left - 1) {  // pairs of > 8 bits leave regions of 1, 2 or 4
          const uint32_t cnt = left & (0u - left);
          fill64(dst, cnt, c1[0]);
          dst += cnt;
        }
        if (left) fill64(dst, left, c1[0]);
        dst = end;
        for (uint32_t i = 1; i < n1; ++i, dst += 1u << m1) add_fill64(dst, built, 1u << m1, c1[i] - c1[0]);
      }
      std::memcpy(s.sig, s.c1, sizeof(uint64_t) * P);
      s.sig_n = P;
    }
    uint64_t* dst = s.tab + pre;
    for (uint32_t l = kShortBits + 1; l <= kMaxLen; ++l) dst = fill_runs(dst, kMaxLen - l, s.c1 + kst[l], lb.n[l]);
  }
  // Reads take 8 bytes at p + bitpos / 8. A stream decodes at most kStreamLen codes
  // of <= kMaxLen bits from its start (<= T), so even a corrupt one reads inside
  // p[0, ab + kOverrun); when the buffer ends sooner (the row's last blocks) the
  // area is decoded from a zero-padded copy.
  constexpr uint32_t kOverrun = kStreamLen * kMaxLen / 8 + 8;
  const uint8_t* p = blk + area_off;
  if ((uint64_t)area_off + ab + kOverrun > avail) {
    std::memcpy(s.area, p, ab);
    std::memset(s.area + ab, 0, kOverrun);
    p = s.area;
  }
  const uint64_t* tab = s.tab;
  // The shift counts (and the mask) live in registers so that BMI2 code shifts
  // with one non-destructive shrx instead of mov + shr (the entry is still needed
  // after the shift, q after `q >> 3`): one instruction fewer a lookup and a
  // refill (measured with 2-symbol entries: bf16 decode 7.15 -> 6.99
  // instructions an element).
  uint32_t top = 64 - kMaxLen, c3 = 3, c48 = 48, not7 = ~7u;
  if (Fast) {
    opaque(top);
    opaque(c3);
    opaque(c48);
    opaque(not7);
  }
  auto refill = [p, c3, not7](uint32_t q) -> uint64_t {
    return __builtin_bswap64(load64(p + (q >> c3))) << (~not7 & q);
  };
  uint8_t* const out = reinterpret_cast<uint8_t*>(s.sv);
  uint32_t pos[kStreams], o[kStreams], oend[kStreams];
  for (uint32_t st = 0; st < kStreams; ++st) {
    pos[st] = start[st];
    const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
    o[st] = 2 * j0;
    oend[st] = 2 * j1;
  }
  const uint8_t* pf_in = s.pf_in;
  uint8_t* pf_out = s.pf_out;
  if (len == kBlock) {
    DecodeRegs r{p, tab, out, top, c3, c48, not7};
    decode_rounds<Fast>(r, pos, o, oend, pf_in, pf_out);
  }
  // The rest of each stream (all of it in a short block): 5 lookups a refill
  // while the stream has >= 16 symbols left (the rounds stop at the slowest
  // stream), then one whole entry a refill while 4 output words remain, then one
  // symbol a lookup (symbol 1's length is word 1's nibble). Each phase takes the
  // streams in turn, so that their lookup chains overlap (one stream after
  // another, the tail was ~7% of the decode time on Gaussian bf16).
  const DecodeRegs regs{p, tab, out, top, c3, c48, not7};
  for (bool more = true; more;) {
    more = false;
    for (uint32_t st = 0; st < kStreams; ++st)
      if (oend[st] - o[st] >= 2 * (3 * kSymsPerRefill + 1)) {
        uint32_t oo = o[st];
        lookups5<Fast>(regs, pos + st, oo);
        o[st] = oo;
        more = true;
      }
  }
  for (bool more = true; more;) {
    more = false;
    for (uint32_t st = 0; st < kStreams; ++st)
      if (oend[st] - o[st] >= 8) {
        const uint64_t e = tab[refill(pos[st]) >> (64 - kMaxLen)];
        std::memcpy(out + o[st], &e, 8);
        pos[st] += (uint32_t)e & kLenMask;
        o[st] += (uint32_t)(e >> 48);
        more = true;
      }
  }
  for (bool more = true; more;) {
    more = false;
    for (uint32_t st = 0; st < kStreams; ++st)
      if (o[st] < oend[st]) {
        const uint64_t e = tab[refill(pos[st]) >> (64 - kMaxLen)];
        std::memcpy(out + o[st], &e, 2);
        pos[st] += (uint32_t)(e >> 16) & kLenMask;
        o[st] += 2;
        more = true;
      }
  }
  for (uint32_t st = 0; st < kStreams; ++st)
    if (pos[st] != start[st + 1]) return kDecBadStream;
  if (zk) return zero_join<D, Fast>(blk + area_off + ab, size - (area_off + ab), len, s.sv, s.zraw, y);
  or_raw_kind<D, Fast>(kind, blk + area_off + ab, len, s.sv, y, (uint16_t)~kLenMask);
  return kDecOk;
}

// ---------------------------------------------------------------------------------
// ISA dispatch.

template <DtypeCode D>
uint32_t encode_block_base(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s, bool* raw) {
  return encode_block_impl<D, false>(x, len, out, s, raw);
}
template <DtypeCode D>
int32_t decode_block_base(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len, uint16_t* y,
                          DecScratch& s) {
  return decode_block_impl<D, false>(blk, size, avail, len, y, s);
}
#if EZ_X86
template <DtypeCode D>
EZ_TARGET_FAST uint32_t encode_block_fast(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s,
                                          bool* raw) {
  return encode_block_impl<D, true>(x, len, out, s, raw);
}
template <DtypeCode D>
EZ_TARGET_FAST int32_t decode_block_fast(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len,
                                         uint16_t* y, DecScratch& s) {
  return decode_block_impl<D, true>(blk, size, avail, len, y, s);
}
#endif

template <DtypeCode D>
uint32_t encode_block(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s, bool* raw) {
#if EZ_X86
  if (have_fast_isa()) return encode_block_fast<D>(x, len, out, s, raw);
#endif
  return encode_block_base<D>(x, len, out, s, raw);
}
template <DtypeCode D>
int32_t decode_block(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len, uint16_t* y,
                     DecScratch& s) {
#if EZ_X86
  if (have_fast_isa()) return decode_block_fast<D>(blk, size, avail, len, y, s);
#endif
  return decode_block_base<D>(blk, size, avail, len, y, s);
}

// ---------------------------------------------------------------------------------
// Rows.

using ::zipccl::cpu_handler::zero_tail;  // the unused tail of a row (cpu_handler.h)

#if EZ_X86
// Zeroes [p, p + n) by 32-byte stores, 128 bytes a step.
EZ_TARGET_FAST void zero_small_fast(uint8_t* p, uint64_t n) {
  const __m256i z = _mm256_setzero_si256();
  uint8_t* const e = p + n;
  for (; e - p >= 128; p += 128) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), z);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 32), z);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 64), z);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 96), z);
  }
  std::memset(p, 0, (size_t)(e - p));
}
#endif

// The row's unused tail [used, max_nbytes): zero_tail for tails of at least
// kStreamZeroMin bytes (streaming stores, absent pages left to the kernel); a
// shorter one on the AVX2 path by plain 32-byte stores, what glibc's memset does
// there by `rep stosb` (the same work and time; the stores keep callgrind's
// instruction counts meaningful: it counts `rep stosb` per byte, ~0.7
// instructions per element of a 2^20-element row).
inline void zero_row_tail(uint8_t* p, uint64_t n) {
#if EZ_X86
  if (n < ::zipccl::cpu_handler::kStreamZeroMin && have_fast_isa()) {
    zero_small_fast(p, n);
    return;
  }
#endif
  zero_tail(p, n);
}

template <DtypeCode D>
RowStats encode_row_t(const uint16_t* x, uint64_t n, uint8_t* out) {
  const uint64_t nb = num_blocks(n);
  const uint64_t doff = data_offset(n);
  const uint64_t maxb = max_nbytes(D, n);
  std::memset(out, 0, doff);
  const int nt = n >= kParallelMinElems ? par::threads_for(nb, kMinBlocksPerThread) : 1;
  std::vector<uint64_t> tb(nt + 1), tbytes(nt, 0), traw(nt, 0);
  for (int t = 0; t <= nt; ++t) tb[t] = nb * (uint64_t)t / (uint64_t)nt;
  // Thread 0 writes in place and checksums its blocks while they are in cache;
  // the others write at their worst-case offsets and are moved down afterwards.
  uint64_t cs = 0, cs_end_word = doff / 4;
  par::parallel_for(nt, [&](int t) {
    std::unique_ptr<EncScratch> s(new EncScratch());  // zeroed: the histogram lanes
    uint8_t* base = out + doff + tb[t] * (uint64_t)max_block_bytes(kBlock);
    uint64_t off = 0, raws = 0;
    // Software prefetch (EncScratch::pf_in / pf_out): with 4 KiB pages the
    // hardware streamer restarts at every page and the symbol pass waited on DRAM
    // for the block's first lines. Block b prefetches block b + 2's input and the
    // 8 KiB from 8 KiB past its own start (about where blocks b + 1, b + 2 go);
    // near the ends its own input / output (always inside the buffers).
    const uint8_t* const xin = reinterpret_cast<const uint8_t*>(x);
    const uint64_t out_room = maxb - (uint64_t)(base - out);
    for (uint64_t b = tb[t]; b < tb[t + 1]; ++b) {
      const uint32_t len = block_len(n, b);
      const uint64_t pb = b + 2 < tb[t + 1] && block_len(n, b + 2) == kBlock ? b + 2 : b;
      s->pf_in = xin + 2 * pb * kBlock;
      s->pf_out = base + off + (off + 2 * kPfBytes <= out_room ? kPfBytes : 0);
      bool raw = false;
      const uint32_t sz = encode_block<D>(x + b * kBlock, len, base + off, *s, &raw);
      st16(out + kDirOff + 2 * b, sz);
      off += sz;
      raws += raw;
      if (t == 0) {
        const uint64_t w1 = (doff + off) / 4;
        cs += cs_words(out, cs_end_word, w1);
        cs_end_word = w1;
      }
    }
    tbytes[t] = off;
    traw[t] = raws;
  });
  uint64_t pos = doff + tbytes[0], raws = traw[0];
  for (int t = 1; t < nt; ++t) {
    std::memmove(out + pos, out + doff + tb[t] * (uint64_t)max_block_bytes(kBlock), tbytes[t]);
    pos += tbytes[t];
    raws += traw[t];
  }
  const uint64_t used = align128(pos);
  std::memset(out + pos, 0, used - pos);  // checksummed below: stays in cache
  zero_row_tail(out + used, maxb - used);
  // The rest of the checksum: the moved blocks and the padding (parallel), then the
  // header and directory.
  const uint64_t wrest = used / 4 - cs_end_word;
  const int nc = nt > 1 ? nt : 1;
  std::vector<uint64_t> part(nc, 0);
  par::parallel_for(nc, [&](int t) {
    const uint64_t a = cs_end_word + wrest * t / nc, b = cs_end_word + wrest * (t + 1) / nc;
    part[t] = cs_words(out, a, b);
  });
  for (int t = 0; t < nc; ++t) cs += part[t];
  st32(out + kOffMagic, kMagic);
  out[kOffVersion] = kVersion;
  out[kOffDtype] = (uint8_t)D;
  out[kOffCodec] = kCodecId;
  out[kOffStatus] = 0;
  st64(out + kOffN, n);
  st64(out + kOffUsed, used);
  out[kOffBlockLog2] = (uint8_t)kBlockLog2;
  out[kOffStreams] = (uint8_t)kStreams;
  out[kOffMaxLen] = (uint8_t)kMaxLen;
  st32(out + kOffRawBlocks, (uint32_t)raws);
  st64(out + kOffNumBlocks, nb);
  st64(out + kOffDataBytes, pos - doff);
  cs += cs_words(out, 0, doff / 4);  // checksum field is still zero here
  st64(out + kOffChecksum, cs);
  return RowStats{0, raws, used};
}

template <DtypeCode D>
int32_t decode_row_t(const uint8_t* in, uint64_t L, uint64_t n, uint16_t* y) {
  if (L < kHeaderBytes) return kDecBadSize;
  if (ld32(in + kOffMagic) != kMagic || in[kOffVersion] != kVersion || in[kOffCodec] != kCodecId)
    return kDecBadMagic;
  if (in[kOffDtype] != (uint8_t)D) return kDecBadDtype;
  const uint64_t used = ld64(in + kOffUsed);
  if (ld64(in + kOffN) != n || used % kAlign || used > L || used < min_nbytes(D, n) ||
      used > max_nbytes(D, n))
    return kDecBadSize;
  if (in[kOffStatus] == 1) return kDecNotDecodable;
  const uint64_t nb = num_blocks(n), doff = data_offset(n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes);
  const uint64_t raw_blocks = ld32(in + kOffRawBlocks);
  bool ok = in[kOffStatus] == 0 && in[kOffBlockLog2] == kBlockLog2 && in[kOffStreams] == kStreams &&
            in[kOffMaxLen] == kMaxLen && in[35] == 0 && ld64(in + kOffNumBlocks) == nb &&
            raw_blocks <= nb && data_bytes <= used - doff && align128(doff + data_bytes) == used;
  for (uint64_t i = kDirOff + 2 * nb; i < doff && ok; ++i) ok = in[i] == 0;  // dir padding
  if (!ok) return kDecBadHeader;
  // Directory: block offsets, sizes within [4, max], their sum, the RAW count.
  std::vector<uint64_t> off(nb + 1);
  off[0] = doff;
  for (uint64_t b = 0; b < nb; ++b) {
    const uint32_t sz = ld16(in + kDirOff + 2 * b);
    if (sz < kBlockHead || sz > max_block_bytes(block_len(n, b))) return kDecBadTable;
    off[b + 1] = off[b] + sz;
    if (off[b + 1] > doff + data_bytes) return kDecBadTable;
  }
  if (off[nb] != doff + data_bytes) return kDecBadTable;

  const int nt = n >= kParallelMinElems ? par::threads_for(nb, kMinBlocksPerThread) : 1;
  std::vector<int32_t> tstat(nt, kDecOk);
  std::vector<uint64_t> tcs(nt, 0), traws(nt, 0);
  par::parallel_for(nt, [&](int t) {
    std::unique_ptr<DecScratch> s(new DecScratch);
    s->sig_n = ~0u;
    const uint64_t b0 = nb * (uint64_t)t / nt, b1 = nb * (uint64_t)(t + 1) / nt;
    uint64_t acc = 0, raws = 0;
    int32_t worst = kDecOk;
    for (uint64_t b = b0; b < b1; ++b) {
      raws += in[off[b]] == 0;
      // Software prefetch targets (DecScratch::pf_in / pf_out): the payload of
      // block b + 2 and the output of block b + 1 (4 KiB pages: the hardware
      // streamer restarts at every page). The rounds step them by 128 / 192 bytes
      // a round (<= 103 rounds a block), so near the row's end
      // they may point past the buffers: a prefetch never faults and changes no
      // memory.
      s->pf_in = in + off[std::min(b + 2, nb - 1)];
      s->pf_out = reinterpret_cast<uint8_t*>(y + std::min(b + 1, nb - 1) * kBlock);
      const int32_t st = decode_block<D>(in + off[b], (uint32_t)(off[b + 1] - off[b]), L - off[b],
                                         block_len(n, b), y + b * kBlock, *s);
      if (st != kDecOk && (worst == kDecOk || st < worst)) worst = st;
      if (worst == kDecBadTable) break;  // nothing reports lower
      // Checksum words [off_b / 4, off_b+1 / 4); the last block runs to used.
      const uint64_t w1 = (b + 1 == nb) ? used / 4 : off[b + 1] / 4;
      acc += cs_words(in, off[b] / 4, w1);
    }
    tstat[t] = worst;
    tcs[t] = acc;
    traws[t] = raws;
  });
  // The RAW count is a directory-level check (status 6), made here so that the
  // block starts are read while decoding rather than in a separate pass.
  uint64_t raws = 0;
  int32_t worst = kDecOk;
  for (int t = 0; t < nt; ++t) {
    raws += traws[t];
    if (tstat[t] != kDecOk && (worst == kDecOk || tstat[t] < worst)) worst = tstat[t];
  }
  if (raws != raw_blocks) return kDecBadTable;
  if (worst != kDecOk) return worst;
  uint64_t cs = 0;
  for (int t = 0; t < nt; ++t) cs += tcs[t];
  cs += cs_words(in, 0, kOffChecksum / 4) + cs_words(in, kOffChecksum / 4 + 2, doff / 4);
  if (nb == 0) cs += cs_words(in, doff / 4, used / 4);
  if (cs != ld64(in + kOffChecksum)) return kDecBadChecksum;
  return kDecOk;
}

}  // namespace

RowStats encode_row(DtypeCode d, const uint16_t* x, uint64_t n, uint8_t* out) {
  return d == kBF16 ? encode_row_t<kBF16>(x, n, out) : encode_row_t<kF16>(x, n, out);
}

int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, uint16_t* y) {
  const int32_t st = d == kBF16 ? decode_row_t<kBF16>(in, nbytes, n, y) : decode_row_t<kF16>(in, nbytes, n, y);
  if (st != kDecOk) std::memset(y, 0xFF, 2 * n);
  return st;
}

}  // namespace cpu
}  // namespace ent
}  // namespace zipccl

// ---------------------------------------------------------------------------------
// XLA FFI handlers. x [..., n] -> payload u8 [..., max_nbytes], stats s32 [..., 4] =
// (status, raw blocks, used_nbytes / 128, 0), workspace u8 [..., W] (unused on the
// CPU). Decode: payload u8 [..., L] -> y [..., n], status s32 [...], workspace.

namespace ffi = xla::ffi;

namespace {

namespace zent = zipccl::ent;

bool ent_dtype(ffi::DataType t, zent::DtypeCode* d) {
  switch (t) {
    case ffi::DataType::BF16: *d = zent::kBF16; return true;
    case ffi::DataType::F16: *d = zent::kF16; return true;
    default: return false;
  }
}

using zipccl::cpu_handler::advise_hugepages;
using zipccl::handler::split_dims;
using zipccl::handler::str;

ffi::Error EntropyEncodeImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                             ffi::Result<ffi::Buffer<ffi::S32>> stats,
                             ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  zent::DtypeCode d;
  if (!ent_dtype(x.element_type(), &d))
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: x must be bfloat16 or float16");
  uint64_t rows, n, prow, nbytes, srow, four;
  split_dims(x.dimensions(), &rows, &n);
  split_dims(payload->dimensions(), &prow, &nbytes);
  split_dims(stats->dimensions(), &srow, &four);
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: rows of >= 2^32 elements are not supported");
  const uint64_t want = zent::max_nbytes(d, n);
  if (prow != rows || nbytes != want)
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: payload must be [" + str(rows) + ", " +
                                       str(want) + "] bytes, got [" + str(prow) + ", " + str(nbytes) + "]");
  if (srow != rows || four != 4)
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: stats must be [" + str(rows) + ", 4]");
  if (ffi::Error e = zipccl::handler::check_skip("zipccl_entropy_encode", skip.element_count(), rows); e.failure())
    return e;
  const uint8_t* sk = skip.typed_data();
  const uint16_t* xw = static_cast<const uint16_t*>(x.untyped_data());
  uint8_t* out = payload->typed_data();
  advise_hugepages(out, rows * nbytes);
  int32_t* st = stats->typed_data();
  for (uint64_t r = 0; r < rows; ++r) {
    if (sk[r]) {  // not needed by the caller (handler_common.h): unwritten, stats zero
      for (int k = 0; k < 4; ++k) st[4 * r + k] = 0;
      continue;
    }
    const zent::cpu::RowStats s = zent::cpu::encode_row(d, xw + r * n, n, out + r * nbytes);
    st[4 * r] = s.status;
    st[4 * r + 1] = (int32_t)std::min<uint64_t>(s.raw_blocks, 0x7FFFFFFF);
    st[4 * r + 2] = (int32_t)std::min<uint64_t>(s.used / zent::kAlign, 0x7FFFFFFF);
    st[4 * r + 3] = 0;
  }
  return ffi::Error::Success();
}

ffi::Error EntropyDecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip, ffi::AnyBuffer fill,
                             ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::Buffer<ffi::S32>> status,
                             ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  zent::DtypeCode d;
  if (!ent_dtype(y->element_type(), &d))
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: output must be bfloat16 or float16");
  uint64_t rows, nbytes, yrows, n;
  split_dims(payload.dimensions(), &rows, &nbytes);
  split_dims(y->dimensions(), &yrows, &n);
  if (yrows != rows)
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: payload has " + str(rows) +
                                       " rows but the output has " + str(yrows));
  if (status->element_count() != (size_t)rows)
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: status must have one entry per row");
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: rows of >= 2^32 elements are not supported");
  const uint8_t* in = payload.typed_data();
  uint16_t* yw = static_cast<uint16_t*>(y->untyped_data());
  advise_hugepages(yw, rows * n * 2);
  int32_t* st = status->typed_data();
  uint64_t group = 0;
  if (ffi::Error e = zipccl::handler::check_skip("zipccl_entropy_decode", skip.element_count(), rows); e.failure())
    return e;
  if (ffi::Error e = zipccl::handler::check_fill("zipccl_entropy_decode", fill.element_type(), y->element_type(),
                                                 fill.dimensions(), rows, n, &group);
      e.failure())
    return e;
  const uint8_t* sk = skip.typed_data();
  const uint16_t* fw = static_cast<const uint16_t*>(fill.untyped_data());
  for (uint64_t r = 0; r < rows; ++r) {
    if (sk[r]) {  // the caller's own row: copied from fill, never decoded
      if (n && group) std::memcpy(yw + r * n, fw + (r / group) * n, n * 2);
      st[r] = 0;
      continue;
    }
    st[r] = zent::cpu::decode_row(d, in + r * nbytes, nbytes, n, yw + r * n);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyEncodeCpu, EntropyEncodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // x [..., n]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // skip [...]
                                  .Ret<ffi::Buffer<ffi::U8>>()   // payload [..., max_nbytes]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // stats [..., 4]
                                  .Ret<ffi::Buffer<ffi::U8>>()); // workspace [..., W]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyDecodeCpu, EntropyDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()   // payload [..., L]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // skip [...]
                                  .Arg<ffi::AnyBuffer>()         // fill [F, n]
                                  .Ret<ffi::AnyBuffer>()         // y [..., n]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // status [...]
                                  .Ret<ffi::Buffer<ffi::U8>>()); // workspace [..., W]
