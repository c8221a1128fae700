// Part of the CPU entropy codec (entropy_cpu_encode.h, the only file that includes
// it): the AVX2 pair path's histogram and code tables.
#pragma once

#include "entropy_cpu_planes.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

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
}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
