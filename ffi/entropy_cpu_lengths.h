// Part of the CPU entropy codec (entropy_cpu_encode.h, the only file that includes
// it): the code lengths by package-merge (code_lengths_pick), as the normative
// code_lengths of entropy_format.h with less work per item.
#pragma once

#include "entropy_cpu_planes.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

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

}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
